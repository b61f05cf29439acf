-- The triggers effects keeps on effects_remotelink (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_remotelink_transition ON effects_remotelink;
CREATE TRIGGER effects_remotelink_transition BEFORE UPDATE ON effects_remotelink
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'active>retired');
