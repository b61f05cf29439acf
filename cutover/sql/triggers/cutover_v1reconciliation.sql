-- The triggers cutover keeps on cutover_v1reconciliation (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_v1reconciliation_append_only ON cutover_v1reconciliation;
CREATE TRIGGER cutover_v1reconciliation_append_only BEFORE DELETE OR UPDATE ON cutover_v1reconciliation
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS cutover_v1reconciliation_no_truncate ON cutover_v1reconciliation;
CREATE TRIGGER cutover_v1reconciliation_no_truncate BEFORE TRUNCATE ON cutover_v1reconciliation
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
