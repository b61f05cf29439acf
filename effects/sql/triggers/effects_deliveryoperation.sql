-- The triggers effects keeps on effects_deliveryoperation (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_deliveryoperation_immutable_columns ON effects_deliveryoperation;
CREATE TRIGGER effects_deliveryoperation_immutable_columns BEFORE UPDATE ON effects_deliveryoperation
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'execution', 'remote_effect',
    'acknowledgement', 'verification', 'checkpoint', 'revision', 'attempt_ordinal', 'observation_ordinal',
    'next_attempt_after', 'remote_receipt_id', 'applied_count', 'last_code', 'last_detail', 'reconciliation_id',
    'reconciled', 'changed_at', 'held_reason', 'held_at');

DROP TRIGGER IF EXISTS effects_deliveryoperation_monotonic_attempt_ordinal ON effects_deliveryoperation;
CREATE TRIGGER effects_deliveryoperation_monotonic_attempt_ordinal BEFORE UPDATE ON effects_deliveryoperation
  FOR EACH ROW EXECUTE FUNCTION connector_never_decreases('attempt_ordinal');

DROP TRIGGER IF EXISTS effects_deliveryoperation_monotonic_observation_ordinal ON effects_deliveryoperation;
CREATE TRIGGER effects_deliveryoperation_monotonic_observation_ordinal BEFORE UPDATE ON effects_deliveryoperation
  FOR EACH ROW EXECUTE FUNCTION connector_never_decreases('observation_ordinal');

DROP TRIGGER IF EXISTS effects_deliveryoperation_monotonic_revision ON effects_deliveryoperation;
CREATE TRIGGER effects_deliveryoperation_monotonic_revision BEFORE UPDATE ON effects_deliveryoperation
  FOR EACH ROW EXECUTE FUNCTION connector_never_decreases('revision');

DROP TRIGGER IF EXISTS effects_deliveryoperation_transition ON effects_deliveryoperation;
CREATE TRIGGER effects_deliveryoperation_transition BEFORE UPDATE ON effects_deliveryoperation
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'accepted>final_unknown_accepted_ack',
    'accepted>verifying_cancelled', 'accepted>verifying_expired', 'accepted>verifying_failure',
    'accepted>verifying_success', 'accepted>waiting',
    'final_full_accepted_ack_eligible>final_full_accepted_ack_promoted',
    'final_full_cancelled_ack_eligible>final_full_cancelled_ack_promoted',
    'final_full_eligible>final_full_promoted', 'final_full_expired_ack_eligible>final_full_expired_ack_promoted',
    'final_full_failed_ack_eligible>final_full_failed_ack_promoted',
    'final_full_not_accepted_eligible>final_full_not_accepted_promoted',
    'final_full_protocol_ack_eligible>final_full_protocol_ack_promoted',
    'final_full_unverified>reconciling_full_success_ack',
    'final_partial_accepted_ack>reconciling_partial_accepted_ack',
    'final_partial_cancelled_ack>reconciling_partial_cancelled_ack',
    'final_partial_expired_ack>reconciling_partial_expired_ack',
    'final_partial_failed_ack>reconciling_partial_failed_ack',
    'final_partial_not_accepted>reconciling_partial_not_accepted',
    'final_partial_protocol_ack>reconciling_partial_protocol_ack',
    'final_partial_success_ack>reconciling_partial_success_ack',
    'final_unknown_accepted_ack>reconciling_unknown_accepted_ack',
    'final_unknown_cancelled_ack>reconciling_unknown_cancelled_ack',
    'final_unknown_expired_ack>reconciling_unknown_expired_ack',
    'final_unknown_failed_ack>reconciling_unknown_failed_ack',
    'final_unknown_not_accepted>reconciling_unknown_not_accepted',
    'final_unknown_protocol_ack>reconciling_unknown_protocol_ack',
    'final_unknown_success_ack>reconciling_unknown_success_ack', 'planned>sealed',
    'reconciling_full_success_ack>final_full_eligible', 'reconciling_full_success_ack>final_unknown_success_ack',
    'reconciling_partial_accepted_ack>final_full_accepted_ack_eligible',
    'reconciling_partial_accepted_ack>final_no_effect_accepted_ack',
    'reconciling_partial_accepted_ack>final_partial_accepted_ack',
    'reconciling_partial_cancelled_ack>final_full_cancelled_ack_eligible',
    'reconciling_partial_cancelled_ack>final_no_effect_cancelled_ack',
    'reconciling_partial_cancelled_ack>final_partial_cancelled_ack',
    'reconciling_partial_expired_ack>final_full_expired_ack_eligible',
    'reconciling_partial_expired_ack>final_no_effect_expired_ack',
    'reconciling_partial_expired_ack>final_partial_expired_ack',
    'reconciling_partial_failed_ack>final_full_failed_ack_eligible',
    'reconciling_partial_failed_ack>final_no_effect_failed_ack',
    'reconciling_partial_failed_ack>final_partial_failed_ack',
    'reconciling_partial_not_accepted>final_full_not_accepted_eligible',
    'reconciling_partial_not_accepted>final_not_started',
    'reconciling_partial_not_accepted>final_partial_not_accepted',
    'reconciling_partial_protocol_ack>final_full_protocol_ack_eligible',
    'reconciling_partial_protocol_ack>final_no_effect_protocol_ack',
    'reconciling_partial_protocol_ack>final_partial_protocol_ack',
    'reconciling_partial_success_ack>final_full_eligible',
    'reconciling_partial_success_ack>final_no_effect_success_ack',
    'reconciling_partial_success_ack>final_partial_success_ack',
    'reconciling_unknown_accepted_ack>final_full_accepted_ack_eligible',
    'reconciling_unknown_accepted_ack>final_no_effect_accepted_ack',
    'reconciling_unknown_accepted_ack>final_partial_accepted_ack',
    'reconciling_unknown_accepted_ack>final_unknown_accepted_ack',
    'reconciling_unknown_cancelled_ack>final_full_cancelled_ack_eligible',
    'reconciling_unknown_cancelled_ack>final_no_effect_cancelled_ack',
    'reconciling_unknown_cancelled_ack>final_partial_cancelled_ack',
    'reconciling_unknown_cancelled_ack>final_unknown_cancelled_ack',
    'reconciling_unknown_expired_ack>final_full_expired_ack_eligible',
    'reconciling_unknown_expired_ack>final_no_effect_expired_ack',
    'reconciling_unknown_expired_ack>final_partial_expired_ack',
    'reconciling_unknown_expired_ack>final_unknown_expired_ack',
    'reconciling_unknown_failed_ack>final_full_failed_ack_eligible',
    'reconciling_unknown_failed_ack>final_no_effect_failed_ack',
    'reconciling_unknown_failed_ack>final_partial_failed_ack',
    'reconciling_unknown_failed_ack>final_unknown_failed_ack',
    'reconciling_unknown_not_accepted>final_full_not_accepted_eligible',
    'reconciling_unknown_not_accepted>final_not_started',
    'reconciling_unknown_not_accepted>final_partial_not_accepted',
    'reconciling_unknown_not_accepted>final_unknown_not_accepted',
    'reconciling_unknown_protocol_ack>final_full_protocol_ack_eligible',
    'reconciling_unknown_protocol_ack>final_no_effect_protocol_ack',
    'reconciling_unknown_protocol_ack>final_partial_protocol_ack',
    'reconciling_unknown_protocol_ack>final_unknown_protocol_ack',
    'reconciling_unknown_success_ack>final_full_eligible',
    'reconciling_unknown_success_ack>final_no_effect_success_ack',
    'reconciling_unknown_success_ack>final_partial_success_ack',
    'reconciling_unknown_success_ack>final_unknown_success_ack', 'retry_wait>submitting', 'sealed>submitting',
    'submitting>accepted', 'submitting>final_not_started', 'submitting>final_unknown_not_accepted',
    'submitting>retry_wait', 'submitting>verifying_failure', 'submitting>verifying_success',
    'verifying_cancelled>final_no_effect_cancelled_ack', 'verifying_cancelled>final_partial_cancelled_ack',
    'verifying_cancelled>final_unknown_cancelled_ack', 'verifying_expired>final_no_effect_expired_ack',
    'verifying_expired>final_partial_expired_ack', 'verifying_expired>final_unknown_expired_ack',
    'verifying_failure>final_no_effect_failed_ack', 'verifying_failure>final_partial_failed_ack',
    'verifying_failure>final_unknown_failed_ack', 'verifying_success>final_full_eligible',
    'verifying_success>final_full_unverified', 'verifying_success>final_partial_success_ack',
    'verifying_success>final_unknown_success_ack', 'waiting>final_unknown_protocol_ack',
    'waiting>verifying_cancelled', 'waiting>verifying_expired', 'waiting>verifying_failure',
    'waiting>verifying_success');
