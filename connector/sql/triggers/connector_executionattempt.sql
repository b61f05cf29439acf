-- The triggers connector keeps on connector_executionattempt (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_executionattempt_append_only ON connector_executionattempt;
CREATE TRIGGER connector_executionattempt_append_only BEFORE DELETE OR UPDATE ON connector_executionattempt
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_executionattempt_no_truncate ON connector_executionattempt;
CREATE TRIGGER connector_executionattempt_no_truncate BEFORE TRUNCATE ON connector_executionattempt
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
