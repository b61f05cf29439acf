-- The triggers effects keeps on effects_outboundcommand (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_outboundcommand_append_only ON effects_outboundcommand;
CREATE TRIGGER effects_outboundcommand_append_only BEFORE DELETE OR UPDATE ON effects_outboundcommand
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS effects_outboundcommand_no_truncate ON effects_outboundcommand;
CREATE TRIGGER effects_outboundcommand_no_truncate BEFORE TRUNCATE ON effects_outboundcommand
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
