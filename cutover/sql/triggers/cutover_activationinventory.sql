-- The triggers cutover keeps on cutover_activationinventory (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_activationinventory_append_only ON cutover_activationinventory;
CREATE TRIGGER cutover_activationinventory_append_only BEFORE DELETE OR UPDATE ON cutover_activationinventory
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS cutover_activationinventory_no_truncate ON cutover_activationinventory;
CREATE TRIGGER cutover_activationinventory_no_truncate BEFORE TRUNCATE ON cutover_activationinventory
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
