-- The triggers connector keeps on connector_executiontrace (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_executiontrace_append_only ON connector_executiontrace;
CREATE TRIGGER connector_executiontrace_append_only BEFORE DELETE OR UPDATE ON connector_executiontrace
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_executiontrace_no_truncate ON connector_executiontrace;
CREATE TRIGGER connector_executiontrace_no_truncate BEFORE TRUNCATE ON connector_executiontrace
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
