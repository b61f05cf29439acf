"""Traces and log ids across the pipeline (issue 21, D-225/D-226): one trace from the HTTP admission to the egress
request, continued from the trace contexts stored beside the durable rows, and the ids on every log line of a
stage. Spans go to the SDK's in-memory exporter."""
from __future__ import annotations

import json
import logging
import time

import pytest
from celery.app.task import Task
from django.db import IntegrityError, ProgrammingError, connection, transaction
from django.test import Client
from opentelemetry.trace import SpanKind

from connector import logcontext, tasks, tracing
from connector.models import ExecutionTrace, Projection, ProjectionTrace, Receipt, ReceiptTrace
from connector.services import execution, runtime
from connector.services.signatures import sign
from effects.models import CommandTrace, RemoteEffect
from effects.services import worker
from observability.logs import ContextFilter
from tests import dbroles
from tests.connector.test_api_admission import admit, body, event, signing_secret
from tests.observability.conftest import in_memory_tracing
from tests.effects.conftest import receiver  # noqa: F401 - the real HTTP receiver fixture

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
STAGES = ["receipt_admit", "receipt_materialize", "lane_advance", "execution_run", "runtime_command_apply",
          "outbound_command_author", "egress_send"]


@pytest.fixture
def pipeline(transactional_db, monkeypatch, receiver):
    """The demo world with a push route and a real receiver; wake-ups never reach the broker (each stage is run
    here, as a worker would run it)."""
    from connector.demo import build_world

    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: None)
    return build_world("t-", push=True)


def _admit(world, n: int, **headers):
    account = world.accounts[0].account_key
    payload = body(event(id=f"e-tr-{n}", record_id=f"r-tr-{n}"))
    signature = sign(signing_secret(account), int(time.time()), payload)
    client = Client(**headers)
    response = admit(client, payload, f"k-tr-{n}", account=account, signature=signature)
    assert response.status_code == 201, response.content
    return Receipt.objects.get(pk=response.json()["receipt"])


def _run_pipeline(world, n: int, **headers) -> Receipt:
    """Every stage through its entry point: the HTTP view, the materialize and lane tasks, one claim, one dispatch."""
    receipt = _admit(world, n, **headers)
    tasks.receipt_materialize(receipt.pk)
    tasks.lane_advance(Projection.objects.get(event__receipt=receipt).lane_id)
    done = execution.execution_claim_and_run(holder="trace-test", lease_seconds=60)
    assert done is not None and done.state == "completed", done and done.state
    effect = worker.effect_dispatch_once(holder_name="trace-test")
    assert effect is not None and effect.state == "finalized", effect and effect.state
    return receipt


def _hex(span_context) -> tuple[str, str]:
    return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")


def test_one_delivery_is_one_trace_from_admission_to_the_receiver(pipeline, receiver, spans):
    """An admission carrying the caller's `traceparent` yields one trace whose spans cover every stage in order,
    each the child of the previous one (admission, materialization, lane advance, execution, Runtime, outbound
    authoring, egress); the egress request carried the egress span's `traceparent` to the receiver. Each stage
    continued from the context stored with the durable row the previous stage wrote. Proves: issue 21 (traces),
    CV2-10-001 (the one egress request)."""
    receipt = _run_pipeline(pipeline, 1, HTTP_TRACEPARENT=CALLER)
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert set(STAGES) <= set(by_name), sorted(by_name)
    chain = [by_name[name] for name in STAGES]
    assert {_hex(s.context)[0] for s in chain} == {CALLER_TRACE}
    assert _hex(chain[0].parent) == (CALLER_TRACE, CALLER_SPAN) and chain[0].kind == SpanKind.SERVER
    for parent, child in zip(chain, chain[1:]):
        assert child.parent is not None and child.parent.span_id == parent.context.span_id, (parent.name, child.name)
        assert child.start_time >= parent.start_time, (parent.name, child.name)
    assert by_name["egress_send"].kind == SpanKind.CLIENT
    # The durable rows carry the context their successor continued.
    effect = RemoteEffect.objects.select_related("command").get(account=pipeline.accounts[0])
    stored = {
        "receipt_admit": ReceiptTrace.objects.get(receipt=receipt).traceparent,
        "receipt_materialize": ProjectionTrace.objects.get(projection__event__receipt=receipt).traceparent,
        "lane_advance": ExecutionTrace.objects.get(execution__projection__event__receipt=receipt).traceparent,
        "outbound_command_author": CommandTrace.objects.get(command=effect.command).traceparent,
    }
    for name, traceparent in stored.items():
        assert traceparent == "00-{}-{}-01".format(*_hex(by_name[name].context)), name
    sent = [r for r in receiver.requests if r["method"] in ("POST", "PATCH", "PUT")]
    assert [r["traceparent"] for r in sent] == ["00-{}-{}-01".format(*_hex(by_name["egress_send"].context))]


def test_admission_without_traceparent_starts_a_trace_and_a_bad_one_is_ignored(pipeline, spans):
    """No incoming `traceparent`: the admission starts a new trace (a root SERVER span). A malformed one is
    ignored the same way (a new trace, never an error): the answer is the usual 201. Proves: issue 21."""
    _admit(pipeline, 2)
    _admit(pipeline, 3, HTTP_TRACEPARENT="00-not-a-trace-01")
    roots = [s for s in spans.get_finished_spans() if s.name == "receipt_admit"]
    assert len(roots) == 2 and all(s.parent is None for s in roots)
    assert len({s.context.trace_id for s in roots}) == 2


def test_tracing_off_writes_no_trace_context_and_sends_no_header(pipeline, receiver):
    """Off (the default), the pipeline runs without a single trace row, span or header. Proves: issue 21 (off
    by default; the pinned statement counts of tests/connector/test_hot_path_statements.py are unchanged)."""
    assert not tracing.enabled()
    _run_pipeline(pipeline, 4, HTTP_TRACEPARENT=CALLER)
    for model in (ReceiptTrace, ProjectionTrace, ExecutionTrace, CommandTrace):
        assert model.objects.count() == 0, model.__name__
    assert [r["traceparent"] for r in receiver.requests] == [None]


def test_an_unsampled_trace_leaves_no_row_and_later_stages_start_no_stray_trace(pipeline, receiver):
    """Tracing on with a sampler that drops this trace (the caller's `traceparent` says not sampled; the SDK's
    parent-based sampler follows it): the admission writes no trace row, so materialization, the lane advance,
    the execution and egress read nothing and start no span of their own (no stray root trace), and the receiver
    gets no header; the delivery completes as usual. A sampled caller on the same provider is traced whole.
    Proves: issue 21 (D-236: sampling is what keeps tracing's cost bounded in production)."""
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    with in_memory_tracing(ParentBased(TraceIdRatioBased(1.0))) as exporter:
        _run_pipeline(pipeline, 7, HTTP_TRACEPARENT=f"00-{CALLER_TRACE}-{CALLER_SPAN}-00")
        for model in (ReceiptTrace, ProjectionTrace, ExecutionTrace, CommandTrace):
            assert model.objects.count() == 0, model.__name__
        assert exporter.get_finished_spans() == ()
        assert [r["traceparent"] for r in receiver.requests] == [None]
        _run_pipeline(pipeline, 8, HTTP_TRACEPARENT=CALLER)
        assert set(STAGES) <= {s.name for s in exporter.get_finished_spans()}
        assert {format(s.context.trace_id, "032x") for s in exporter.get_finished_spans()} == {CALLER_TRACE}


def test_trace_rows_are_immutable_and_well_formed(pipeline, spans):
    """A stored trace context is an append-only fact with a well-formed W3C value (constraint
    connector_receipttrace_traceparent_w3c); going around the services cannot change or forge it. Proves:
    issue 21, STYLE R21."""
    receipt = _admit(pipeline, 5, HTTP_TRACEPARENT=CALLER)
    row = ReceiptTrace.objects.get(receipt=receipt)
    assert row.traceparent.startswith(f"00-{CALLER_TRACE}-")
    for sql in ("UPDATE connector_receipttrace SET traceparent = traceparent WHERE receipt_id = %s",
                "DELETE FROM connector_receipttrace WHERE receipt_id = %s"):
        with pytest.raises(ProgrammingError, match="permission denied"), transaction.atomic(), \
                connection.cursor() as cursor:
            cursor.execute(sql, [receipt.pk])
        with pytest.raises(IntegrityError) as info, dbroles.as_admin(), transaction.atomic(), \
                connection.cursor() as cursor:
            cursor.execute(sql, [receipt.pk])
        assert info.value.__cause__.diag.constraint_name == "connector_receipttrace_append_only"
    with pytest.raises(IntegrityError, match="traceparent_w3c"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("INSERT INTO connector_receipttrace (receipt_id, traceparent, tracestate) VALUES (%s, %s, '')",
                       [_admit(pipeline, 6).pk, "00-ZZ-01"])


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(ContextFilter())

    def emit(self, record):
        self.records.append(record)


def test_a_line_logged_inside_a_stage_carries_its_ids(pipeline, monkeypatch, spans):
    """A line logged inside the execution stage carries the account, execution, trace and span ids; a line of the
    admission carries account and receipt; the configured JSON handler writes them as fields; nothing leaks past
    the stage. Proves: issue 21 (logs)."""
    stage_log = logging.getLogger("tests.stage")
    original = runtime.runtime_command_apply

    def logged_apply(**kwargs):
        stage_log.warning("inside the stage")
        return original(**kwargs)

    monkeypatch.setattr(runtime, "runtime_command_apply", logged_apply)
    handler = _Records()
    logging.getLogger().addHandler(handler)
    try:
        receipt = _admit(pipeline, 7, HTTP_TRACEPARENT=CALLER)
        tasks.receipt_materialize(receipt.pk)
        tasks.lane_advance(Projection.objects.get(event__receipt=receipt).lane_id)
        done = execution.execution_claim_and_run(holder="log-test", lease_seconds=60)
        stage_log.warning("after the stage")
    finally:
        logging.getLogger().removeHandler(handler)
    admitted = next(r for r in handler.records if r.getMessage() == "receipt admitted")
    assert (admitted.account_id, admitted.receipt_id) == (pipeline.accounts[0].pk, receipt.pk)
    assert admitted.trace_id == CALLER_TRACE
    inside = next(r for r in handler.records if r.getMessage() == "inside the stage")
    assert inside.execution_id == done.pk and inside.account_id == pipeline.accounts[0].pk
    assert inside.trace_id == CALLER_TRACE and len(inside.span_id) == 16
    after = next(r for r in handler.records if r.getMessage() == "after the stage")
    assert not any(hasattr(after, f) for f in logcontext.FIELDS)
    stderr = next(h for h in logging.getLogger().handlers if any(isinstance(f, ContextFilter) for f in h.filters))
    for f in stderr.filters:
        f.filter(inside)
    written = json.loads(stderr.formatter.format(inside))
    assert written["execution_id"] == done.pk and written["trace_id"] == CALLER_TRACE


def test_log_ids_are_bound_with_tracing_off(pipeline, monkeypatch):
    """Tracing off, a stage's log lines still carry the ids it knows (no trace id). Proves: issue 21 (logs)."""
    stage_log = logging.getLogger("tests.stage")
    original = runtime.runtime_command_apply

    def logged_apply(**kwargs):
        stage_log.warning("inside the stage")
        return original(**kwargs)

    monkeypatch.setattr(runtime, "runtime_command_apply", logged_apply)
    handler = _Records()
    logging.getLogger().addHandler(handler)
    try:
        receipt = _admit(pipeline, 8)
        tasks.receipt_materialize(receipt.pk)
        tasks.lane_advance(Projection.objects.get(event__receipt=receipt).lane_id)
        done = execution.execution_claim_and_run(holder="log-test", lease_seconds=60)
    finally:
        logging.getLogger().removeHandler(handler)
    inside = next(r for r in handler.records if r.getMessage() == "inside the stage")
    assert inside.execution_id == done.pk and inside.account_id == pipeline.accounts[0].pk
    assert not hasattr(inside, "trace_id")
