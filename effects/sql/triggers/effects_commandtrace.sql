-- The triggers effects keeps on effects_commandtrace (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_commandtrace_append_only ON effects_commandtrace;
CREATE TRIGGER effects_commandtrace_append_only BEFORE DELETE OR UPDATE ON effects_commandtrace
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS effects_commandtrace_no_truncate ON effects_commandtrace;
CREATE TRIGGER effects_commandtrace_no_truncate BEFORE TRUNCATE ON effects_commandtrace
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
