-- The triggers effects keeps on effects_receiversecretversion (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_receiversecretversion_append_only ON effects_receiversecretversion;
CREATE TRIGGER effects_receiversecretversion_append_only BEFORE DELETE OR UPDATE ON effects_receiversecretversion
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS effects_receiversecretversion_no_truncate ON effects_receiversecretversion;
CREATE TRIGGER effects_receiversecretversion_no_truncate BEFORE TRUNCATE ON effects_receiversecretversion
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
