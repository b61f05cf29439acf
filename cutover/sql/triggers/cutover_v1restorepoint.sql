-- The triggers cutover keeps on cutover_v1restorepoint (the functions they call are in */sql/functions/).
-- databases: journal

DROP TRIGGER IF EXISTS cutover_v1restorepoint_append_only ON cutover_v1restorepoint;
CREATE TRIGGER cutover_v1restorepoint_append_only BEFORE DELETE OR UPDATE ON cutover_v1restorepoint
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS cutover_v1restorepoint_no_truncate ON cutover_v1restorepoint;
CREATE TRIGGER cutover_v1restorepoint_no_truncate BEFORE TRUNCATE ON cutover_v1restorepoint
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate()
;
