-- The triggers effects keeps on effects_deliveryapprovalreceipt (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_deliveryapprovalreceipt_immutable ON effects_deliveryapprovalreceipt;
CREATE TRIGGER effects_deliveryapprovalreceipt_immutable BEFORE UPDATE ON effects_deliveryapprovalreceipt
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS effects_deliveryapprovalreceipt_no_truncate ON effects_deliveryapprovalreceipt;
CREATE TRIGGER effects_deliveryapprovalreceipt_no_truncate BEFORE TRUNCATE ON effects_deliveryapprovalreceipt
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
