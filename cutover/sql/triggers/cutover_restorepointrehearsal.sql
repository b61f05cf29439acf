-- The triggers cutover keeps on cutover_restorepointrehearsal (the functions they call are in */sql/functions/).
-- databases: journal

DROP TRIGGER IF EXISTS cutover_restorepointrehearsal_append_only ON cutover_restorepointrehearsal;
CREATE TRIGGER cutover_restorepointrehearsal_append_only BEFORE DELETE OR UPDATE ON cutover_restorepointrehearsal
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS cutover_restorepointrehearsal_no_truncate ON cutover_restorepointrehearsal;
CREATE TRIGGER cutover_restorepointrehearsal_no_truncate BEFORE TRUNCATE ON cutover_restorepointrehearsal
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
