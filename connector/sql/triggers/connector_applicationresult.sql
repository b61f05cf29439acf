-- The triggers connector keeps on connector_applicationresult (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_applicationresult_append_only ON connector_applicationresult;
CREATE TRIGGER connector_applicationresult_append_only BEFORE DELETE OR UPDATE ON connector_applicationresult
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_applicationresult_no_truncate ON connector_applicationresult;
CREATE TRIGGER connector_applicationresult_no_truncate BEFORE TRUNCATE ON connector_applicationresult
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
