-- The triggers cutover keeps on cutover_servicecutoverattempt (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_servicecutoverattempt_immutable_columns ON cutover_servicecutoverattempt;
CREATE TRIGGER cutover_servicecutoverattempt_immutable_columns BEFORE UPDATE ON cutover_servicecutoverattempt
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('outcome', 'closed_at');

DROP TRIGGER IF EXISTS cutover_servicecutoverattempt_settled_once ON cutover_servicecutoverattempt;
CREATE TRIGGER cutover_servicecutoverattempt_settled_once BEFORE UPDATE ON cutover_servicecutoverattempt
  FOR EACH ROW EXECUTE FUNCTION connector_settled_once('closed_at');
