-- Transport admission of a new receipt in one statement (connector/services/admission.py): resolve
-- the account; look the transport key up ('existing': the caller resolves the duplicate); the serving guard's
-- locks through connector_lock_serving; every check the guard makes and the caller's hint (account pk, epoch pk
-- and digest) ('refused' writes nothing); then the Receipt, its ReceiptAdmissionKey, its MaterializationDue and,
-- when a trace context is given, its ReceiptTrace ('created'). A concurrent admission of the same key loses on
-- `connector_admissionkey_unique_key` and the whole statement is undone. SECURITY INVOKER.
CREATE OR REPLACE FUNCTION connector_receipt_admit(p_account_key text, p_account_hint bigint,
    p_epoch_hint bigint, p_digest_hint bytea, p_channel text, p_key text, p_payload bytea,
    p_payload_digest bytea, p_component_count integer, p_attempts integer, p_traceparent text, p_tracestate text,
    OUT outcome text, OUT account_pk bigint, OUT receipt_pk bigint, OUT key_pk bigint,
    OUT created_at timestamp with time zone, OUT lock_outcome text, OUT gate_pk bigint, OUT gate_mode text,
    OUT gate_fence bigint, OUT gate_epoch_pk bigint, OUT gate_epoch_digest bytea, OUT epoch_ref text,
    OUT epoch_state text, OUT epoch_digest bytea)
 RETURNS record
 LANGUAGE plpgsql
AS $$
BEGIN
  SELECT a.id INTO account_pk FROM connector_connectoraccount a WHERE a.account_key = p_account_key;
  IF account_pk IS NULL THEN
    outcome := 'no_account';
    RETURN;
  END IF;
  SELECT k.id INTO key_pk FROM connector_receiptadmissionkey k
   WHERE k.account_id = account_pk AND k.channel = p_channel AND k.transport_key = p_key;
  IF key_pk IS NOT NULL THEN
    outcome := 'existing';
    RETURN;
  END IF;
  SELECT l.outcome, l.gate_pk, l.gate_mode, l.gate_fence, l.gate_epoch_pk, l.gate_epoch_digest, l.epoch_ref,
         l.epoch_state, l.epoch_digest
    INTO lock_outcome, gate_pk, gate_mode, gate_fence, gate_epoch_pk, gate_epoch_digest, epoch_ref, epoch_state,
         epoch_digest
    FROM connector_lock_serving(account_pk, p_attempts) l;
  IF lock_outcome IS DISTINCT FROM 'locked'
     OR gate_mode IS DISTINCT FROM 'v2_serving'
     OR epoch_state IS DISTINCT FROM 'active'
     OR gate_epoch_digest IS DISTINCT FROM epoch_digest
     OR account_pk IS DISTINCT FROM p_account_hint
     OR gate_epoch_pk IS DISTINCT FROM p_epoch_hint
     OR epoch_digest IS DISTINCT FROM p_digest_hint THEN
    outcome := 'refused';  -- nothing written; the share locks end with the caller's transaction
    RETURN;
  END IF;
  INSERT INTO connector_receipt (account_id, epoch_id, epoch_digest, gate_fence, kind, channel, payload,
                                 payload_digest, component_count, replay_request_id, created_at)
  VALUES (account_pk, gate_epoch_pk, epoch_digest, gate_fence, 'transport', p_channel, p_payload,
          p_payload_digest, p_component_count, NULL, statement_timestamp())
  RETURNING id, connector_receipt.created_at INTO receipt_pk, created_at;
  INSERT INTO connector_receiptadmissionkey (account_id, channel, transport_key, receipt_id, tombstone_id)
  VALUES (account_pk, p_channel, p_key, receipt_pk, NULL)
  RETURNING id INTO key_pk;
  INSERT INTO connector_materializationdue (receipt_id, due_at, held_reason, held_at)
  VALUES (receipt_pk, created_at, '', NULL);
  IF p_traceparent IS NOT NULL THEN
    INSERT INTO connector_receipttrace (receipt_id, traceparent, tracestate)
    VALUES (receipt_pk, p_traceparent, coalesce(p_tracestate, ''));
  END IF;
  outcome := 'created';
END
$$;
