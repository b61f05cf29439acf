-- The triggers cutover keeps on cutover_orderinghandoff (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_orderinghandoff_append_only ON cutover_orderinghandoff;
CREATE TRIGGER cutover_orderinghandoff_append_only BEFORE DELETE OR UPDATE ON cutover_orderinghandoff
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS cutover_orderinghandoff_no_truncate ON cutover_orderinghandoff;
CREATE TRIGGER cutover_orderinghandoff_no_truncate BEFORE TRUNCATE ON cutover_orderinghandoff
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
