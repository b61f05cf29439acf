-- The triggers effects keeps on effects_deliveryreconciliation (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_deliveryreconciliation_append_only ON effects_deliveryreconciliation;
CREATE TRIGGER effects_deliveryreconciliation_append_only BEFORE DELETE OR UPDATE ON effects_deliveryreconciliation
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS effects_deliveryreconciliation_no_truncate ON effects_deliveryreconciliation;
CREATE TRIGGER effects_deliveryreconciliation_no_truncate BEFORE TRUNCATE ON effects_deliveryreconciliation
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
