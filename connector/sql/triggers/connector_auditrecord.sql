-- The triggers connector keeps on connector_auditrecord (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_auditrecord_append_only ON connector_auditrecord;
CREATE TRIGGER connector_auditrecord_append_only BEFORE DELETE OR UPDATE ON connector_auditrecord
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_auditrecord_no_truncate ON connector_auditrecord;
CREATE TRIGGER connector_auditrecord_no_truncate BEFORE TRUNCATE ON connector_auditrecord
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
