-- The triggers connector keeps on connector_integrationbindingview (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_integrationbindingview_immutable ON connector_integrationbindingview;
CREATE TRIGGER connector_integrationbindingview_immutable BEFORE UPDATE ON connector_integrationbindingview
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS connector_integrationbindingview_no_truncate ON connector_integrationbindingview;
CREATE TRIGGER connector_integrationbindingview_no_truncate BEFORE TRUNCATE ON connector_integrationbindingview
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
