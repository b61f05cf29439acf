-- The triggers effects keeps on effects_deliveryparent (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_deliveryparent_immutable_columns ON effects_deliveryparent;
CREATE TRIGGER effects_deliveryparent_immutable_columns BEFORE UPDATE ON effects_deliveryparent
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'snapshot_closed_at',
    'planner_algorithm_version', 'compiled_plan_digest', 'coverage_proof', 'parent_plan_digest', 'admitted_at',
    'contiguous_checkpoint_frontier');

DROP TRIGGER IF EXISTS effects_deliveryparent_monotonic_contiguous_checkpoint_frontier ON effects_deliveryparent;
CREATE TRIGGER effects_deliveryparent_monotonic_contiguous_checkpoint_frontier BEFORE UPDATE ON effects_deliveryparent
  FOR EACH ROW EXECUTE FUNCTION connector_never_decreases('contiguous_checkpoint_frontier');

DROP TRIGGER IF EXISTS effects_deliveryparent_transition ON effects_deliveryparent;
CREATE TRIGGER effects_deliveryparent_transition BEFORE UPDATE ON effects_deliveryparent
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'PLANNING>ADMITTED');
