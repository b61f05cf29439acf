-- The triggers cutover keeps on cutover_maintenancebarrierreceipt (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_maintenancebarrierreceipt_append_only ON cutover_maintenancebarrierreceipt;
CREATE TRIGGER cutover_maintenancebarrierreceipt_append_only BEFORE DELETE OR UPDATE ON cutover_maintenancebarrierreceipt
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS cutover_maintenancebarrierreceipt_no_truncate ON cutover_maintenancebarrierreceipt;
CREATE TRIGGER cutover_maintenancebarrierreceipt_no_truncate BEFORE TRUNCATE ON cutover_maintenancebarrierreceipt
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
