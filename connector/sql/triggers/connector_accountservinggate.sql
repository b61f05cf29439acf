-- The triggers connector keeps on connector_accountservinggate (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_accountservinggate_fence_advance ON connector_accountservinggate;
CREATE TRIGGER connector_accountservinggate_fence_advance BEFORE UPDATE ON connector_accountservinggate
  FOR EACH ROW EXECUTE FUNCTION connector_fenced_row('mode', 'changed_at');

DROP TRIGGER IF EXISTS connector_accountservinggate_transition ON connector_accountservinggate;
CREATE TRIGGER connector_accountservinggate_transition BEFORE UPDATE ON connector_accountservinggate
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('mode', 'v1_serving>halting_v1',
    'halting_v1>v1_serving', 'halting_v1>v1_stopped', 'v1_stopped>v1_drained', 'v1_drained>v1_serving',
    'v1_drained>v2_validating', 'v2_validating>v1_drained', 'v2_validating>v2_serving', 'v2_serving>halting_v2',
    'halting_v2>v2_halted', 'v2_halted>v2_serving');
