-- The triggers connector keeps on connector_credentialgenerationdispatchgate (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_credentialgenerationdispatchgate_fence_advance ON connector_credentialgenerationdispatchgate;
CREATE TRIGGER connector_credentialgenerationdispatchgate_fence_advance BEFORE UPDATE ON connector_credentialgenerationdispatchgate
  FOR EACH ROW EXECUTE FUNCTION connector_fenced_row('mode', 'changed_at');

DROP TRIGGER IF EXISTS connector_credentialgenerationdispatchgate_transition ON connector_credentialgenerationdispatchgate;
CREATE TRIGGER connector_credentialgenerationdispatchgate_transition BEFORE UPDATE ON connector_credentialgenerationdispatchgate
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('mode', 'enabled>revoked', 'revoked>enabled');
