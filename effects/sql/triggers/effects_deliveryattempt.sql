-- The triggers effects keeps on effects_deliveryattempt (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_deliveryattempt_immutable_columns ON effects_deliveryattempt;
CREATE TRIGGER effects_deliveryattempt_immutable_columns BEFORE UPDATE ON effects_deliveryattempt
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('capacity_state', 'capacity_released_reason',
    'io_may_have_started', 'io_started_at', 'outcome', 'response_status', 'response_digest', 'evidence',
    'settled_at');

DROP TRIGGER IF EXISTS effects_deliveryattempt_transition ON effects_deliveryattempt;
CREATE TRIGGER effects_deliveryattempt_transition BEFORE UPDATE ON effects_deliveryattempt
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('capacity_state', 'reserved>released',
    'reserved>transferred');

DROP TRIGGER IF EXISTS effects_deliveryattempt_transition_outcome ON effects_deliveryattempt;
CREATE TRIGGER effects_deliveryattempt_transition_outcome BEFORE UPDATE ON effects_deliveryattempt
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('outcome', '>not_started', '>answered', '>ambiguous');
