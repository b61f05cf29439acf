-- The triggers connector keeps on connector_dualapprovalsetmember (the functions they call are in */sql/functions/).
-- optional: the table is created by connector migration 0028; migration 0026 applies these files before it exists

DROP TRIGGER IF EXISTS connector_dualapprovalsetmember_append_only ON connector_dualapprovalsetmember;
CREATE TRIGGER connector_dualapprovalsetmember_append_only BEFORE DELETE OR UPDATE ON connector_dualapprovalsetmember
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_dualapprovalsetmember_no_truncate ON connector_dualapprovalsetmember;
CREATE TRIGGER connector_dualapprovalsetmember_no_truncate BEFORE TRUNCATE ON connector_dualapprovalsetmember
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
