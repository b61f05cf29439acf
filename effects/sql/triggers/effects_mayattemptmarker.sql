-- The triggers effects keeps on effects_mayattemptmarker (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_mayattemptmarker_immutable ON effects_mayattemptmarker;
CREATE TRIGGER effects_mayattemptmarker_immutable BEFORE UPDATE ON effects_mayattemptmarker
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS effects_mayattemptmarker_no_truncate ON effects_mayattemptmarker;
CREATE TRIGGER effects_mayattemptmarker_no_truncate BEFORE TRUNCATE ON effects_mayattemptmarker
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
