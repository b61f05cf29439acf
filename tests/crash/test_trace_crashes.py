"""The trace survives the outbox and a worker killed between stages (issue 21, D-225): the context travels only
through the rows PostgreSQL keeps, so a SIGKILLed worker's successor continues the same trace."""
from __future__ import annotations

import time

import pytest
from celery.app.task import Task
from django.test import Client

from connector import tasks
from connector.models import ExecutionTrace, Projection, Receipt
from connector.services.execution import execution_claim_and_run
from connector.services.signatures import sign
from effects.models import CommandTrace, RemoteEffect
from effects.services.worker import effect_dispatch_once
from tests.connector.test_api_admission import admit, body, event, signing_secret
from tests.crash.support import DB, assert_killed
from tests.crash.test_outbound_crashes import child_env, receiver  # noqa: F401 - receiver URL in the child
from tests.observability.conftest import spans  # noqa: F401 - the in-memory tracing fixture

pytestmark = pytest.mark.django_db(**DB)

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER = f"00-{CALLER_TRACE}-b7ad6b7169203331-01"

# The child is a worker process with tracing configured from the environment, as config/celery.py does it; it
# claims and runs the execution and is SIGKILLed once Runtime (and the OutboundCommand with its trace context)
# committed, before the connector records the result. Its own spans die with it (never exported).
CHILD_SCRIPT = """
from connector import tracing
from observability.tracing import configure
assert configure() and tracing.enabled()
from connector.services.execution import execution_claim_and_run
execution_claim_and_run(holder="trace-crash-child", lease_seconds=ARGS["lease_seconds"])
emit(survived=True)
"""


def _ids(traceparent: str) -> tuple[str, str]:
    _, trace_id, span_id, _ = traceparent.split("-")
    return trace_id, span_id


def _hex(span_context) -> tuple[str, str]:
    return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")


def test_trace_continues_after_a_worker_is_killed_between_runtime_and_egress(spans, receiver, run_child,
                                                                             child_env, monkeypatch):
    """Admission (continuing the caller's trace), materialization and lane advance run here; a worker process
    claims the execution and is SIGKILLed after Runtime committed (fault point `runtime.after_commit`). The
    OutboundCommand's stored context names the dead worker's span in the caller's trace; this process, as the
    restarted worker, dispatches the effect: its egress span is that span's child and the receiver got its
    `traceparent`; the re-claimed execution (lease expired) continues the execution's stored context too.
    Proves: issue 21 (the trace survives the outbox and a worker restart), CV2-07 (re-claim after a lost lease)."""
    from connector.demo import build_world

    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: None)
    world = build_world("tc-", push=True)
    account = world.accounts[0].account_key
    payload = body(event(id="e-crash-1", record_id="r-crash-1"))
    response = admit(Client(HTTP_TRACEPARENT=CALLER), payload, "k-crash-1", account=account,
                     signature=sign(signing_secret(account), int(time.time()), payload))
    assert response.status_code == 201, response.content
    receipt = Receipt.objects.get(pk=response.json()["receipt"])
    tasks.receipt_materialize(receipt.pk)
    tasks.lane_advance(Projection.objects.get(event__receipt=receipt).lane_id)
    minted = {s.name: s for s in spans.get_finished_spans()}["lane_advance"]

    child_env["OTEL_TRACES_EXPORTER"] = "console"
    run = run_child(CHILD_SCRIPT, fault_point="runtime.after_commit", lease_seconds=1)
    assert_killed(run)

    effect = RemoteEffect.objects.select_related("command").get(command__account__account_key=account)
    command_trace, command_span = _ids(CommandTrace.objects.get(command=effect.command).traceparent)
    assert command_trace == CALLER_TRACE
    assert command_span not in {_hex(s.context)[1] for s in spans.get_finished_spans()}  # the dead worker's span
    assert _ids(ExecutionTrace.objects.get(execution__projection__event__receipt=receipt).traceparent) == \
        _hex(minted.context)

    # The restarted worker: dispatch the outbox row, then re-claim the execution whose lease expired.
    spans.clear()
    assert effect_dispatch_once(holder_name="trace-recovery").state == "finalized"
    time.sleep(1.1)
    done = execution_claim_and_run(holder="trace-recovery", lease_seconds=60)
    assert done is not None and done.state == "completed"
    by_name = {s.name: s for s in spans.get_finished_spans()}
    egress_span = by_name["egress_send"]
    assert _hex(egress_span.context)[0] == CALLER_TRACE
    assert format(egress_span.parent.span_id, "016x") == command_span
    assert [r["traceparent"] for r in receiver.requests] == ["00-{}-{}-01".format(*_hex(egress_span.context))]
    rerun = by_name["execution_run"]
    assert _hex(rerun.context)[0] == CALLER_TRACE and rerun.parent.span_id == minted.context.span_id
