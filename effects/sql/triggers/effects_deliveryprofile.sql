-- The triggers effects keeps on effects_deliveryprofile (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_deliveryprofile_immutable ON effects_deliveryprofile;
CREATE TRIGGER effects_deliveryprofile_immutable BEFORE UPDATE ON effects_deliveryprofile
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS effects_deliveryprofile_no_truncate ON effects_deliveryprofile;
CREATE TRIGGER effects_deliveryprofile_no_truncate BEFORE TRUNCATE ON effects_deliveryprofile
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
