-- The triggers connector keeps on connector_servingepoch (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_servingepoch_large_columns ON connector_servingepoch;
CREATE TRIGGER connector_servingepoch_large_columns BEFORE UPDATE OF preimage,
    configuration_receipt ON connector_servingepoch
  FOR EACH ROW EXECUTE FUNCTION connector_servingepoch_large_columns();

DROP TRIGGER IF EXISTS connector_servingepoch_provider_io ON connector_servingepoch;
CREATE TRIGGER connector_servingepoch_provider_io BEFORE UPDATE OF provider_io_held ON connector_servingepoch
  FOR EACH ROW EXECUTE FUNCTION connector_servingepoch_provider_io();

DROP TRIGGER IF EXISTS connector_servingepoch_rules ON connector_servingepoch;
CREATE TRIGGER connector_servingepoch_rules BEFORE UPDATE ON connector_servingepoch
  FOR EACH ROW EXECUTE FUNCTION connector_servingepoch_rules();
