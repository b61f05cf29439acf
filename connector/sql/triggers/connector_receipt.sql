-- The triggers connector keeps on connector_receipt (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_receipt_append_only ON connector_receipt;
CREATE TRIGGER connector_receipt_append_only BEFORE DELETE OR UPDATE ON connector_receipt
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_receipt_no_truncate ON connector_receipt;
CREATE TRIGGER connector_receipt_no_truncate BEFORE TRUNCATE ON connector_receipt
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
