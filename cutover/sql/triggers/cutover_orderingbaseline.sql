-- The triggers cutover keeps on cutover_orderingbaseline (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_orderingbaseline_append_only ON cutover_orderingbaseline;
CREATE TRIGGER cutover_orderingbaseline_append_only BEFORE DELETE OR UPDATE ON cutover_orderingbaseline
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS cutover_orderingbaseline_no_truncate ON cutover_orderingbaseline;
CREATE TRIGGER cutover_orderingbaseline_no_truncate BEFORE TRUNCATE ON cutover_orderingbaseline
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
