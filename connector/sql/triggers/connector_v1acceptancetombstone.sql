-- The triggers connector keeps on connector_v1acceptancetombstone (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_v1acceptancetombstone_append_only ON connector_v1acceptancetombstone;
CREATE TRIGGER connector_v1acceptancetombstone_append_only BEFORE DELETE OR UPDATE ON connector_v1acceptancetombstone
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_v1acceptancetombstone_no_truncate ON connector_v1acceptancetombstone;
CREATE TRIGGER connector_v1acceptancetombstone_no_truncate BEFORE TRUNCATE ON connector_v1acceptancetombstone
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
