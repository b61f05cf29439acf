-- The triggers effects keeps on effects_receiverbinding (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_receiverbinding_immutable ON effects_receiverbinding;
CREATE TRIGGER effects_receiverbinding_immutable BEFORE UPDATE ON effects_receiverbinding
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS effects_receiverbinding_no_truncate ON effects_receiverbinding;
CREATE TRIGGER effects_receiverbinding_no_truncate BEFORE TRUNCATE ON effects_receiverbinding
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
