-- The triggers effects keeps on effects_processgeneration (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_processgeneration_immutable_columns ON effects_processgeneration;
CREATE TRIGGER effects_processgeneration_immutable_columns BEFORE UPDATE ON effects_processgeneration
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'heartbeat_at', 'terminated_at',
    'terminated_by', 'termination_evidence');

DROP TRIGGER IF EXISTS effects_processgeneration_transition ON effects_processgeneration;
CREATE TRIGGER effects_processgeneration_transition BEFORE UPDATE ON effects_processgeneration
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'running>terminated');
