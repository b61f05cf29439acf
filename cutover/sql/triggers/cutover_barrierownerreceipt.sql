-- The triggers cutover keeps on cutover_barrierownerreceipt (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_barrierownerreceipt_append_only ON cutover_barrierownerreceipt;
CREATE TRIGGER cutover_barrierownerreceipt_append_only BEFORE DELETE OR UPDATE ON cutover_barrierownerreceipt
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS cutover_barrierownerreceipt_no_truncate ON cutover_barrierownerreceipt;
CREATE TRIGGER cutover_barrierownerreceipt_no_truncate BEFORE TRUNCATE ON cutover_barrierownerreceipt
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
