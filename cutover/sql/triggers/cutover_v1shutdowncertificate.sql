-- The triggers cutover keeps on cutover_v1shutdowncertificate (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_v1shutdowncertificate_append_only ON cutover_v1shutdowncertificate;
CREATE TRIGGER cutover_v1shutdowncertificate_append_only BEFORE DELETE OR UPDATE ON cutover_v1shutdowncertificate
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS cutover_v1shutdowncertificate_no_truncate ON cutover_v1shutdowncertificate;
CREATE TRIGGER cutover_v1shutdowncertificate_no_truncate BEFORE TRUNCATE ON cutover_v1shutdowncertificate
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
