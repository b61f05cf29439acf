-- The triggers connector keeps on connector_executiondependency (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_executiondependency_immutable_columns ON connector_executiondependency;
CREATE TRIGGER connector_executiondependency_immutable_columns BEFORE UPDATE ON connector_executiondependency
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'resolved_at', 'evidence');

DROP TRIGGER IF EXISTS connector_executiondependency_transition ON connector_executiondependency;
CREATE TRIGGER connector_executiondependency_transition BEFORE UPDATE ON connector_executiondependency
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'waiting>satisfied', 'waiting>expired',
    'waiting>rejected');
