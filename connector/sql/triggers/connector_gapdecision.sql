-- The triggers connector keeps on connector_gapdecision (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_gapdecision_append_only ON connector_gapdecision;
CREATE TRIGGER connector_gapdecision_append_only BEFORE DELETE OR UPDATE ON connector_gapdecision
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_gapdecision_no_truncate ON connector_gapdecision;
CREATE TRIGGER connector_gapdecision_no_truncate BEFORE TRUNCATE ON connector_gapdecision
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
