-- The triggers connector keeps on connector_dualapproval (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_dualapproval_append_only ON connector_dualapproval;
CREATE TRIGGER connector_dualapproval_append_only BEFORE DELETE OR UPDATE ON connector_dualapproval
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_dualapproval_no_truncate ON connector_dualapproval;
CREATE TRIGGER connector_dualapproval_no_truncate BEFORE TRUNCATE ON connector_dualapproval
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
