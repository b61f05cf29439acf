-- The triggers connector keeps on connector_orderinglane (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_orderinglane_monotonic ON connector_orderinglane;
CREATE TRIGGER connector_orderinglane_monotonic BEFORE UPDATE ON connector_orderinglane
  FOR EACH ROW EXECUTE FUNCTION connector_never_decreases('high_water');
