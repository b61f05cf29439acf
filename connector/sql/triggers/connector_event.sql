-- The triggers connector keeps on connector_event (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_event_append_only ON connector_event;
CREATE TRIGGER connector_event_append_only BEFORE DELETE OR UPDATE ON connector_event
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_event_no_truncate ON connector_event;
CREATE TRIGGER connector_event_no_truncate BEFORE TRUNCATE ON connector_event
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
