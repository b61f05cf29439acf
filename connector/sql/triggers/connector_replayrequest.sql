-- The triggers connector keeps on connector_replayrequest (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_replayrequest_append_only ON connector_replayrequest;
CREATE TRIGGER connector_replayrequest_append_only BEFORE DELETE OR UPDATE ON connector_replayrequest
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_replayrequest_no_truncate ON connector_replayrequest;
CREATE TRIGGER connector_replayrequest_no_truncate BEFORE TRUNCATE ON connector_replayrequest
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
