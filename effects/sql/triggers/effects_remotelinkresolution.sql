-- The triggers effects keeps on effects_remotelinkresolution (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_remotelinkresolution_append_only ON effects_remotelinkresolution;
CREATE TRIGGER effects_remotelinkresolution_append_only BEFORE DELETE OR UPDATE ON effects_remotelinkresolution
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS effects_remotelinkresolution_no_truncate ON effects_remotelinkresolution;
CREATE TRIGGER effects_remotelinkresolution_no_truncate BEFORE TRUNCATE ON effects_remotelinkresolution
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
