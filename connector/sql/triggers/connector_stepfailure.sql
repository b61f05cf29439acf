-- The triggers connector keeps on connector_stepfailure (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_stepfailure_append_only ON connector_stepfailure;
CREATE TRIGGER connector_stepfailure_append_only BEFORE DELETE OR UPDATE ON connector_stepfailure
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_stepfailure_no_truncate ON connector_stepfailure;
CREATE TRIGGER connector_stepfailure_no_truncate BEFORE TRUNCATE ON connector_stepfailure
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
