-- The triggers connector keeps on connector_laneresumption (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_laneresumption_append_only ON connector_laneresumption;
CREATE TRIGGER connector_laneresumption_append_only BEFORE DELETE OR UPDATE ON connector_laneresumption
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS connector_laneresumption_no_truncate ON connector_laneresumption;
CREATE TRIGGER connector_laneresumption_no_truncate BEFORE TRUNCATE ON connector_laneresumption
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
