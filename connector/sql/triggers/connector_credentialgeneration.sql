-- The triggers connector keeps on connector_credentialgeneration (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_credentialgeneration_immutable ON connector_credentialgeneration;
CREATE TRIGGER connector_credentialgeneration_immutable BEFORE UPDATE ON connector_credentialgeneration
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS connector_credentialgeneration_no_truncate ON connector_credentialgeneration;
CREATE TRIGGER connector_credentialgeneration_no_truncate BEFORE TRUNCATE ON connector_credentialgeneration
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
