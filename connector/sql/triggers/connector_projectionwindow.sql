-- The triggers connector keeps on connector_projectionwindow (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_projectionwindow_immutable_columns ON connector_projectionwindow;
CREATE TRIGGER connector_projectionwindow_immutable_columns BEFORE UPDATE ON connector_projectionwindow
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'member_count', 'sealed_at',
    'quarantine_reason');

DROP TRIGGER IF EXISTS connector_projectionwindow_transition ON connector_projectionwindow;
CREATE TRIGGER connector_projectionwindow_transition BEFORE UPDATE ON connector_projectionwindow
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'open>sealed', 'open>quarantined');
