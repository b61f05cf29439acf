-- The triggers effects keeps on effects_mutationgate (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_mutationgate_monotonic_journal_epoch ON effects_mutationgate;
CREATE TRIGGER effects_mutationgate_monotonic_journal_epoch BEFORE UPDATE ON effects_mutationgate
  FOR EACH ROW EXECUTE FUNCTION connector_never_decreases('journal_epoch');

DROP TRIGGER IF EXISTS effects_mutationgate_transition ON effects_mutationgate;
CREATE TRIGGER effects_mutationgate_transition BEFORE UPDATE ON effects_mutationgate
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'ENABLED>BLOCKED', 'BLOCKED>ENABLED');
