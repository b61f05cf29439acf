-- The triggers cutover keeps on cutover_restoreattempt (the functions they call are in */sql/functions/).
-- databases: journal

DROP TRIGGER IF EXISTS cutover_restoreattempt_fence_advance ON cutover_restoreattempt;
CREATE TRIGGER cutover_restoreattempt_fence_advance BEFORE UPDATE ON cutover_restoreattempt
  FOR EACH ROW EXECUTE FUNCTION connector_fenced_row('state', 'changed_at');

DROP TRIGGER IF EXISTS cutover_restoreattempt_immutable_columns ON cutover_restoreattempt;
CREATE TRIGGER cutover_restoreattempt_immutable_columns BEFORE UPDATE ON cutover_restoreattempt
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'fence', 'restored_content_digest',
    'recovery_payload', 'recovery_digest', 'v1_generation_id', 'changed_at');

DROP TRIGGER IF EXISTS cutover_restoreattempt_transition ON cutover_restoreattempt;
CREATE TRIGGER cutover_restoreattempt_transition BEFORE UPDATE ON cutover_restoreattempt
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'started>database_restored',
    'database_restored>receipt_recorded', 'receipt_recorded>v1_serving');
