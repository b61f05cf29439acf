-- The triggers connector keeps on connector_windowmember (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_windowmember_append_only ON connector_windowmember;
CREATE TRIGGER connector_windowmember_append_only BEFORE DELETE OR UPDATE ON connector_windowmember
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_windowmember_no_truncate ON connector_windowmember;
CREATE TRIGGER connector_windowmember_no_truncate BEFORE TRUNCATE ON connector_windowmember
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
