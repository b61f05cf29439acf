-- The triggers connector keeps on connector_projectiontrace (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_projectiontrace_append_only ON connector_projectiontrace;
CREATE TRIGGER connector_projectiontrace_append_only BEFORE DELETE OR UPDATE ON connector_projectiontrace
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_projectiontrace_no_truncate ON connector_projectiontrace;
CREATE TRIGGER connector_projectiontrace_no_truncate BEFORE TRUNCATE ON connector_projectiontrace
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
