-- The triggers connector keeps on connector_receiptadmissionkey (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_receiptadmissionkey_append_only ON connector_receiptadmissionkey;
CREATE TRIGGER connector_receiptadmissionkey_append_only BEFORE DELETE OR UPDATE ON connector_receiptadmissionkey
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_receiptadmissionkey_no_truncate ON connector_receiptadmissionkey;
CREATE TRIGGER connector_receiptadmissionkey_no_truncate BEFORE TRUNCATE ON connector_receiptadmissionkey
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
