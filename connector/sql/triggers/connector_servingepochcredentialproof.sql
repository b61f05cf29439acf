-- The triggers connector keeps on connector_servingepochcredentialproof (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_servingepochcredentialproof_immutable ON connector_servingepochcredentialproof;
CREATE TRIGGER connector_servingepochcredentialproof_immutable BEFORE UPDATE ON connector_servingepochcredentialproof
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS connector_servingepochcredentialproof_no_truncate ON connector_servingepochcredentialproof;
CREATE TRIGGER connector_servingepochcredentialproof_no_truncate BEFORE TRUNCATE ON connector_servingepochcredentialproof
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
