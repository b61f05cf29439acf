-- The triggers connector keeps on connector_projection (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_projection_immutable_columns ON connector_projection;
CREATE TRIGGER connector_projection_immutable_columns BEFORE UPDATE ON connector_projection
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('execution_generation', 'lane_status');
