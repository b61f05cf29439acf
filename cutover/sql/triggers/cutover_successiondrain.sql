-- The triggers cutover keeps on cutover_successiondrain (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_successiondrain_fence_advance ON cutover_successiondrain;
CREATE TRIGGER cutover_successiondrain_fence_advance BEFORE UPDATE ON cutover_successiondrain
  FOR EACH ROW EXECUTE FUNCTION connector_fenced_row('state', 'changed_at');

DROP TRIGGER IF EXISTS cutover_successiondrain_immutable_columns ON cutover_successiondrain;
CREATE TRIGGER cutover_successiondrain_immutable_columns BEFORE UPDATE ON cutover_successiondrain
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'fence', 'drained_inventory', 'changed_at');

DROP TRIGGER IF EXISTS cutover_successiondrain_transition ON cutover_successiondrain;
CREATE TRIGGER cutover_successiondrain_transition BEFORE UPDATE ON cutover_successiondrain
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'draining>drained', 'draining>released',
    'drained>released');
