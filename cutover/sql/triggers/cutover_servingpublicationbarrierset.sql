-- The triggers cutover keeps on cutover_servingpublicationbarrierset (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_servingpublicationbarrierset_fence_advance ON cutover_servingpublicationbarrierset;
CREATE TRIGGER cutover_servingpublicationbarrierset_fence_advance BEFORE UPDATE ON cutover_servingpublicationbarrierset
  FOR EACH ROW EXECUTE FUNCTION cutover_barrierset_fenced();

DROP TRIGGER IF EXISTS cutover_servingpublicationbarrierset_immutable_columns ON cutover_servingpublicationbarrierset;
CREATE TRIGGER cutover_servingpublicationbarrierset_immutable_columns BEFORE UPDATE ON cutover_servingpublicationbarrierset
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'fence', 'holder',
    'owner_receipts_digest', 'release_reason', 'changed_at');

DROP TRIGGER IF EXISTS cutover_servingpublicationbarrierset_transition ON cutover_servingpublicationbarrierset;
CREATE TRIGGER cutover_servingpublicationbarrierset_transition BEFORE UPDATE ON cutover_servingpublicationbarrierset
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'acquiring>held', 'acquiring>released',
    'held>activation_committed', 'held>released', 'activation_committed>released');
