-- The triggers connector keeps on connector_servingepochbindingproof (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_servingepochbindingproof_immutable ON connector_servingepochbindingproof;
CREATE TRIGGER connector_servingepochbindingproof_immutable BEFORE UPDATE ON connector_servingepochbindingproof
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS connector_servingepochbindingproof_no_truncate ON connector_servingepochbindingproof;
CREATE TRIGGER connector_servingepochbindingproof_no_truncate BEFORE TRUNCATE ON connector_servingepochbindingproof
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
