-- The triggers connector keeps on connector_receipttrace (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_receipttrace_append_only ON connector_receipttrace;
CREATE TRIGGER connector_receipttrace_append_only BEFORE DELETE OR UPDATE ON connector_receipttrace
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_receipttrace_no_truncate ON connector_receipttrace;
CREATE TRIGGER connector_receipttrace_no_truncate BEFORE TRUNCATE ON connector_receipttrace
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
