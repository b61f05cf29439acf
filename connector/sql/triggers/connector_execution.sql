-- The triggers connector keeps on connector_execution (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_execution_immutable_columns ON connector_execution;
CREATE TRIGGER connector_execution_immutable_columns BEFORE UPDATE ON connector_execution
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'lease_holder', 'lease_expires_at',
    'lease_fence', 'attempt_count', 'result_outcome', 'result_digest', 'runtime_receipt', 'quarantine_reason',
    'changed_at');

DROP TRIGGER IF EXISTS connector_execution_transition ON connector_execution;
CREATE TRIGGER connector_execution_transition BEFORE UPDATE ON connector_execution
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'ready>waiting_dependency',
    'ready>completed', 'ready>quarantined', 'waiting_dependency>ready', 'waiting_dependency>quarantined');
