"""What tracing costs the hot path (issue 21, D-225, D-235, docs/benchmarks.md "Tracing overhead"): statements per
stage with tracing off and on, pinned. The throughput it costs is measured by `manage.py bench overhead` over the
hot-account mix in alternating pairs of runs (docs/benchmarks.md "Metrics and tracing overhead")."""
from __future__ import annotations

import time

import pytest
from celery.app.task import Task
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from bench.overhead import DropExporter
from connector import tasks, tracing
from connector.models import Projection, Receipt
from connector.services import execution
from connector.services.signatures import sign
from effects.services import worker
from tests.connector.test_api_admission import admit, body, event, signing_secret
from tests.effects.conftest import receiver  # noqa: F401 - the real HTTP receiver fixture

STAGES = ("admission", "materialize", "lane_advance", "claim_run", "dispatch")
# Statements each stage adds with tracing on (the trace context read from, and written beside, its durable rows):
# admission writes the Receipt's; materialization reads it and writes the lane Projection's; the lane advance reads
# that and writes the Execution's; the claim reads it and Runtime writes the OutboundCommand's; egress reads it.
# Admission: the one statement writes the Receipt's context itself (D-235), so it costs no statement more.
EXTRA_ON = {"admission": 0, "materialize": 2, "lane_advance": 2, "claim_run": 2, "dispatch": 1}


@pytest.fixture
def pipeline(transactional_db, monkeypatch, receiver):  # noqa: F811
    from connector.demo import build_world

    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: None)
    return build_world("o-", push=True)


def _delivery(world, client: Client, n: int, counts: dict | None = None) -> None:
    account = world.accounts[0].account_key
    payload = body(event(id=f"e-ov-{n}", record_id=f"r-ov-{n}"))
    signature = sign(signing_secret(account), int(time.time()), payload)

    def stage(name, fn):
        with CaptureQueriesContext(connection) as queries:
            out = fn()
        if counts is not None:
            counts[name] = len(queries)
        return out

    response = stage("admission", lambda: admit(client, payload, f"k-ov-{n}", account=account, signature=signature))
    assert response.status_code == 201, response.content
    receipt = Receipt.objects.get(pk=response.json()["receipt"])
    lane = Projection.objects.filter(event__receipt=receipt).values_list("lane_id", flat=True)
    stage("materialize", lambda: tasks.receipt_materialize(receipt.pk))
    lane_pk = lane.get()
    stage("lane_advance", lambda: tasks.lane_advance(lane_pk))
    done = stage("claim_run", lambda: execution.execution_claim_and_run(holder="overhead", lease_seconds=60))
    assert done is not None and done.state == "completed"
    effect = stage("dispatch", lambda: worker.effect_dispatch_once(holder_name="overhead"))
    assert effect is not None and effect.state == "finalized"


@pytest.mark.slow
def test_tracing_overhead_off_and_on(pipeline, capsys):
    """Off, no stage runs an extra statement; on, each stage runs exactly EXTRA_ON more (one read of its parent's
    context, one insert beside the row it writes), and every delivery still completes end to end. The time it
    costs is measured by `manage.py bench overhead` (docs/benchmarks.md), not here. Proves: issue 21 (off pays
    nothing; the cost when on is known)."""
    client = Client()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DropExporter()))
    n = 0
    for _ in range(2):  # warm the caches of immutable facts, as a running worker has them
        n += 1
        _delivery(pipeline, client, n)
    off, on = {}, {}
    n += 1
    _delivery(pipeline, client, n, off)
    tracing.enable(provider)
    try:
        n += 1
        _delivery(pipeline, client, n, on)
    finally:
        tracing.disable()
    assert {k: on[k] - off[k] for k in STAGES} == EXTRA_ON, (off, on)

    provider.shutdown()
    with capsys.disabled():
        print(f"\nTRACING-OVERHEAD statements off={off} on={on}")
