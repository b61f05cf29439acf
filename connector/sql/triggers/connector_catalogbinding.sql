-- The triggers connector keeps on connector_catalogbinding (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_catalogbinding_immutable ON connector_catalogbinding;
CREATE TRIGGER connector_catalogbinding_immutable BEFORE UPDATE ON connector_catalogbinding
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS connector_catalogbinding_no_truncate ON connector_catalogbinding;
CREATE TRIGGER connector_catalogbinding_no_truncate BEFORE TRUNCATE ON connector_catalogbinding
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
