-- The triggers connector keeps on connector_v1predecessorref (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_v1predecessorref_immutable ON connector_v1predecessorref;
CREATE TRIGGER connector_v1predecessorref_immutable BEFORE UPDATE ON connector_v1predecessorref
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS connector_v1predecessorref_no_truncate ON connector_v1predecessorref;
CREATE TRIGGER connector_v1predecessorref_no_truncate BEFORE TRUNCATE ON connector_v1predecessorref
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
