-- The triggers connector keeps on connector_serviceconfigurationgeneration (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_serviceconfigurationgeneration_immutable ON connector_serviceconfigurationgeneration;
CREATE TRIGGER connector_serviceconfigurationgeneration_immutable BEFORE UPDATE ON connector_serviceconfigurationgeneration
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS connector_serviceconfigurationgeneration_no_truncate ON connector_serviceconfigurationgeneration;
CREATE TRIGGER connector_serviceconfigurationgeneration_no_truncate BEFORE TRUNCATE ON connector_serviceconfigurationgeneration
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
