"""Shared pieces of the crash tests: webhook bodies and the in-process steps that bring an Execution to the
point a child process then crashes in."""
from __future__ import annotations

import json
import signal

from connector.actors import Actor
from connector.models import Execution, Projection
from connector.services.admission import receipt_admit
from connector.services.execution import lane_advance
from connector.services.materialize import receipt_materialize

CHANNEL = "records.webhook"
ACTOR = Actor.system("crash-test")

# `databases` includes the journal so its test database exists for the child's JOURNAL_DATABASE_URL.
DB = {"transaction": True, "databases": ["default", "journal"]}


def webhook_body(*events: tuple[str, int]) -> bytes:
    """One webhook body with an event per (record_id, sequence)."""
    return json.dumps({"events": [
        {"id": f"ev-{record_id}-{sequence}", "type": "record.updated", "record_id": record_id,
         "sequence": sequence, "occurred_at": "2025-01-01T00:00:00Z",
         "data": {"name": f"Name {record_id} {sequence}", "email": f"{record_id}@example.com"}}
        for record_id, sequence in events]}, sort_keys=True).encode()


def ready_execution(account_key: str, record_id: str = "rec-1") -> Execution:
    """Admit and materialize one event, then mint its Execution through the lane (all committed)."""
    admission = receipt_admit(account_key=account_key, channel=CHANNEL, transport_key=f"key-{record_id}",
                              body=webhook_body((record_id, 1)), actor=ACTOR)
    receipt_materialize(receipt_pk=admission.receipt.pk)
    projection = Projection.objects.get(event__receipt=admission.receipt)
    execution = lane_advance(lane_pk=projection.lane_id)
    assert execution is not None and execution.state == "ready"
    return execution


def assert_killed(run) -> None:
    """The child died by SIGKILL at its crash point (not by an exception, a timeout or a clean exit)."""
    assert run.returncode == -signal.SIGKILL, (f"child was not SIGKILLed (returncode {run.returncode}):\n"
                                               f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}")
    assert "CHILD-RESULT" not in run.stdout, "the child got past its crash point"


CLAIM_SCRIPT = """
from connector.services.execution import execution_claim
token = execution_claim(holder="crash-child", lease_seconds=ARGS["lease_seconds"], account_id=ARGS["account_id"])
emit(execution=token.execution_pk if token else None)
"""

CLAIM_AND_RUN_SCRIPT = """
from connector.services.execution import execution_claim, execution_run
token = execution_claim(holder="crash-child", lease_seconds=ARGS["lease_seconds"], account_id=ARGS["account_id"])
execution = execution_run(token=token)
emit(execution=execution.pk, state=execution.state)
"""

CLAIM_BATCH_SCRIPT = """
from connector.services.execution import execution_claim_batch
tokens = execution_claim_batch(holder="crash-child", n=ARGS["n"], lease_seconds=ARGS["lease_seconds"])
emit(executions=[t.execution_pk for t in tokens])
"""

CLAIM_BATCH_AND_RUN_SCRIPT = """
from connector.services.execution import execution_claim_batch_and_run
done = execution_claim_batch_and_run(holder="crash-child", n=ARGS["n"], lease_seconds=ARGS["lease_seconds"])
emit(executions=[e.pk for e in done])
"""

CLAIM_BATCH_AND_RUN_PER_ITEM_SCRIPT = """
from connector.services.execution import _run_one, execution_claim_batch
# the per-item step of the batch path (what the batch leaves, a traced step), each claimed Execution alone
done = [_run_one(t) for t in execution_claim_batch(holder="crash-child", n=ARGS["n"],
                                                   lease_seconds=ARGS["lease_seconds"])]
emit(executions=[e.pk for e in done])
"""
