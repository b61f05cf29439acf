-- The triggers effects keeps on effects_remotecallintent (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_remotecallintent_append_only ON effects_remotecallintent;
CREATE TRIGGER effects_remotecallintent_append_only BEFORE DELETE OR UPDATE ON effects_remotecallintent
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS effects_remotecallintent_no_truncate ON effects_remotecallintent;
CREATE TRIGGER effects_remotecallintent_no_truncate BEFORE TRUNCATE ON effects_remotecallintent
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
