-- The triggers effects keeps on effects_replayeffectcorrelation (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_replayeffectcorrelation_append_only ON effects_replayeffectcorrelation;
CREATE TRIGGER effects_replayeffectcorrelation_append_only BEFORE DELETE OR UPDATE ON effects_replayeffectcorrelation
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS effects_replayeffectcorrelation_no_truncate ON effects_replayeffectcorrelation;
CREATE TRIGGER effects_replayeffectcorrelation_no_truncate BEFORE TRUNCATE ON effects_replayeffectcorrelation
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
