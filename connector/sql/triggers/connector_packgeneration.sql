-- The triggers connector keeps on connector_packgeneration (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_packgeneration_immutable ON connector_packgeneration;
CREATE TRIGGER connector_packgeneration_immutable BEFORE UPDATE ON connector_packgeneration
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS connector_packgeneration_no_truncate ON connector_packgeneration;
CREATE TRIGGER connector_packgeneration_no_truncate BEFORE TRUNCATE ON connector_packgeneration
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
