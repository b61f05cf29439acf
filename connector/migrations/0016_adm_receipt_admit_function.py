"""Transport admission of a new receipt in one statement (issue 18 goal 1, D-201):
`connector_receipt_admit(...)`.

One call does, in this order and in the caller's transaction (autocommit: the statement is the transaction):
1. resolve the account by its exact key ('no_account' when there is none);
2. look the transport key up in the (account, channel) namespace ('existing' with the key's pk: the caller resolves
   the duplicate, the V1 tombstone or RECEIPT_DIGEST_MISMATCH exactly as before, before any lock);
3. the serving guard's locks through `connector_lock_serving` (migration 0012: epoch FOR SHARE, the gate's fair
   advisory lock shared, gate FOR SHARE, re-checked; the canonical order of docs/locking.md is unchanged);
4. every check the guard makes (gate `v2_serving`, epoch `active`, the gate's epoch digest equal to the epoch's)
   and the caller's hint: the exact account pk, epoch pk and epoch digest the caller parsed the body against.
   Any difference returns 'refused' with the locked columns and writes nothing: the caller maps a failed check to
   its documented error (GATE_NOT_SERVING) or, when only the hint was stale, parses again against the locked epoch
   and calls once more;
5. the Receipt, its ReceiptAdmissionKey and its MaterializationDue, together ('created').
A concurrent admission of the same key loses on `connector_admissionkey_unique_key`: the unique violation aborts
the whole statement (nothing of it stays) and the caller resolves it as a duplicate, as before.

Runs with the caller's privileges (SECURITY INVOKER), like migration 0012."""
from django.db import migrations

from connector.choices import EpochState, GateMode, ReceiptKind

CREATE_SQL = r"""
CREATE OR REPLACE FUNCTION connector_receipt_admit(
    p_account_key text, p_account_hint bigint, p_epoch_hint bigint, p_digest_hint bytea, p_channel text,
    p_key text, p_payload bytea, p_payload_digest bytea, p_component_count integer, p_attempts integer,
    OUT outcome text, OUT account_pk bigint, OUT receipt_pk bigint, OUT key_pk bigint, OUT created_at timestamptz,
    OUT lock_outcome text, OUT gate_pk bigint, OUT gate_mode text, OUT gate_fence bigint, OUT gate_epoch_pk bigint,
    OUT gate_epoch_digest bytea, OUT epoch_ref text, OUT epoch_state text, OUT epoch_digest bytea)
LANGUAGE plpgsql VOLATILE AS $fn$
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
     OR gate_mode IS DISTINCT FROM '%(serving)s'
     OR epoch_state IS DISTINCT FROM '%(active)s'
     OR gate_epoch_digest IS DISTINCT FROM epoch_digest
     OR account_pk IS DISTINCT FROM p_account_hint
     OR gate_epoch_pk IS DISTINCT FROM p_epoch_hint
     OR epoch_digest IS DISTINCT FROM p_digest_hint THEN
    outcome := 'refused';  -- nothing written; the share locks end with the caller's transaction
    RETURN;
  END IF;
  INSERT INTO connector_receipt (account_id, epoch_id, epoch_digest, gate_fence, kind, channel, payload,
                                 payload_digest, component_count, replay_request_id, created_at)
  VALUES (account_pk, gate_epoch_pk, epoch_digest, gate_fence, '%(transport)s', p_channel, p_payload,
          p_payload_digest, p_component_count, NULL, statement_timestamp())
  RETURNING id, connector_receipt.created_at INTO receipt_pk, created_at;
  INSERT INTO connector_receiptadmissionkey (account_id, channel, transport_key, receipt_id, tombstone_id)
  VALUES (account_pk, p_channel, p_key, receipt_pk, NULL)
  RETURNING id INTO key_pk;
  INSERT INTO connector_materializationdue (receipt_id, due_at, held_reason, held_at)
  VALUES (receipt_pk, created_at, '', NULL);
  outcome := 'created';
END
$fn$
""" % {"serving": GateMode.V2_SERVING.value, "active": EpochState.ACTIVE.value,
       "transport": ReceiptKind.TRANSPORT.value}

DROP_SQL = ("DROP FUNCTION IF EXISTS connector_receipt_admit(text, bigint, bigint, bytea, text, text, bytea, bytea, "
            "integer, integer)")


class Migration(migrations.Migration):
    dependencies = [("connector", "0015_trace_contexts")]

    operations = [migrations.RunSQL(CREATE_SQL, DROP_SQL, hints={"target_db": "default"})]
