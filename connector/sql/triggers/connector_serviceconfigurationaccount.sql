-- The triggers connector keeps on connector_serviceconfigurationaccount (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_serviceconfigurationaccount_immutable ON connector_serviceconfigurationaccount;
CREATE TRIGGER connector_serviceconfigurationaccount_immutable BEFORE UPDATE ON connector_serviceconfigurationaccount
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS connector_serviceconfigurationaccount_no_truncate ON connector_serviceconfigurationaccount;
CREATE TRIGGER connector_serviceconfigurationaccount_no_truncate BEFORE TRUNCATE ON connector_serviceconfigurationaccount
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
