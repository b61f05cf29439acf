-- The triggers connector keeps on connector_receiptcomponent (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_receiptcomponent_append_only ON connector_receiptcomponent;
CREATE TRIGGER connector_receiptcomponent_append_only BEFORE DELETE OR UPDATE ON connector_receiptcomponent
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_receiptcomponent_no_truncate ON connector_receiptcomponent;
CREATE TRIGGER connector_receiptcomponent_no_truncate BEFORE TRUNCATE ON connector_receiptcomponent
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
