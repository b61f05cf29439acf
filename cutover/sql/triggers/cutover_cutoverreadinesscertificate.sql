-- The triggers cutover keeps on cutover_cutoverreadinesscertificate (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_cutoverreadinesscertificate_append_only ON cutover_cutoverreadinesscertificate;
CREATE TRIGGER cutover_cutoverreadinesscertificate_append_only BEFORE DELETE OR UPDATE ON cutover_cutoverreadinesscertificate
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS cutover_cutoverreadinesscertificate_no_truncate ON cutover_cutoverreadinesscertificate;
CREATE TRIGGER cutover_cutoverreadinesscertificate_no_truncate BEFORE TRUNCATE ON cutover_cutoverreadinesscertificate
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
