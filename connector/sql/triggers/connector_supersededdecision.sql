-- The triggers connector keeps on connector_supersededdecision (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_supersededdecision_append_only ON connector_supersededdecision;
CREATE TRIGGER connector_supersededdecision_append_only BEFORE DELETE OR UPDATE ON connector_supersededdecision
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_supersededdecision_no_truncate ON connector_supersededdecision;
CREATE TRIGGER connector_supersededdecision_no_truncate BEFORE TRUNCATE ON connector_supersededdecision
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
