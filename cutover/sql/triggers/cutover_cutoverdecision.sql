-- The triggers cutover keeps on cutover_cutoverdecision (the functions they call are in */sql/functions/).
-- databases: journal

DROP TRIGGER IF EXISTS cutover_cutoverdecision_fence_advance ON cutover_cutoverdecision;
CREATE TRIGGER cutover_cutoverdecision_fence_advance BEFORE UPDATE ON cutover_cutoverdecision
  FOR EACH ROW EXECUTE FUNCTION connector_fenced_row('state', 'changed_at');

DROP TRIGGER IF EXISTS cutover_cutoverdecision_transition ON cutover_cutoverdecision;
CREATE TRIGGER cutover_cutoverdecision_transition BEFORE UPDATE ON cutover_cutoverdecision
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'rollback_open>activating_v2',
    'activating_v2>v2_committed', 'rollback_open>restoring_v1', 'restoring_v1>v1_restored');
