"""Traced admission in one statement (issue 21 overhead, D-235): `connector_receipt_admit` takes the caller's W3C
trace context as two more arguments and, when one is given, inserts the Receipt's ReceiptTrace row in the same
statement, so the context still commits with the receipt (D-225) and tracing no longer sends admission down the
ordered path (8 statements more). Everything else is migration 0016's function, unchanged; the old ten-argument
signature is dropped so exactly one function answers."""
import importlib

from django.db import migrations

_0016 = importlib.import_module("connector.migrations.0016_adm_receipt_admit_function")

SIGNATURE_IN = ("p_account_key text, p_account_hint bigint, p_epoch_hint bigint, p_digest_hint bytea, p_channel text,\n"
                "    p_key text, p_payload bytea, p_payload_digest bytea, p_component_count integer, p_attempts integer,")
TRACED_IN = SIGNATURE_IN + "\n    p_traceparent text, p_tracestate text,"
TRACE_INSERT = """  INSERT INTO connector_materializationdue (receipt_id, due_at, held_reason, held_at)
  VALUES (receipt_pk, created_at, '', NULL);
  IF p_traceparent IS NOT NULL THEN
    INSERT INTO connector_receipttrace (receipt_id, traceparent, tracestate)
    VALUES (receipt_pk, p_traceparent, coalesce(p_tracestate, ''));
  END IF;"""
PLAIN_INSERT = """  INSERT INTO connector_materializationdue (receipt_id, due_at, held_reason, held_at)
  VALUES (receipt_pk, created_at, '', NULL);"""

assert _0016.CREATE_SQL.count(SIGNATURE_IN) == 1 and _0016.CREATE_SQL.count(PLAIN_INSERT) == 1
CREATE_SQL = _0016.CREATE_SQL.replace(SIGNATURE_IN, TRACED_IN).replace(PLAIN_INSERT, TRACE_INSERT)
DROP_SQL = ("DROP FUNCTION IF EXISTS connector_receipt_admit(text, bigint, bigint, bytea, text, text, bytea, bytea, "
            "integer, integer, text, text)")


class Migration(migrations.Migration):
    dependencies = [("connector", "0017_claim_execution_ready_queue")]

    operations = [
        migrations.RunSQL(_0016.DROP_SQL, _0016.CREATE_SQL, hints={"target_db": "default"}),
        migrations.RunSQL(CREATE_SQL, DROP_SQL, hints={"target_db": "default"}),
    ]
