"""Traces that leave the process (issue 42 item 2): the real web process (gunicorn) and a real Celery worker, each
with `OTEL_TRACES_EXPORTER=otlp` pointed at a real OTLP/HTTP endpoint started here (tests/observability/
otlp_collector.py decodes each `ExportTraceServiceRequest` with opentelemetry-proto), carry one signed delivery
from admission to the egress request; the spans are read back from what the endpoint received, not from an
in-memory exporter. A worker stopped while its spans still wait in the batch processor flushes them first."""
from __future__ import annotations

import os
import signal
import sys
import time

import httpx
import pytest

from connector.models import CredentialGeneration, ExecutionTrace, ProjectionTrace, ReceiptTrace
from connector.secrets import secret_backend
from connector.services.signatures import sign
from effects.models import CommandTrace, RemoteEffect
from scripts.run import QUEUES
from tests.connector.test_api_admission import body, event
from tests.effects.receiver import Receiver
from tests.faults.servers import (Child, child_environment, free_port, run_database_env, wait_http, wait_web_workers,
                                  web_child)
from tests.observability.otlp_collector import OtlpCollector

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "journal"])

CALLER_SPAN = "10f067aa0ba902b8"
# Every span of one delivery, admission to egress, in parent -> child order (tests/observability/test_traces.py).
STAGES = ["receipt_admit", "receipt_materialize", "lane_advance", "execution_run", "runtime_command_apply",
          "outbound_command_author", "egress_send"]
SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind


@pytest.fixture(scope="module")
def collector():
    running = OtlpCollector().start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def crm():
    """The remote system the egress calls: it records the `traceparent` each request carried."""
    running = Receiver().start()
    try:
        yield running
    finally:
        running.stop()


def otlp_env(collector, role: str, **extra) -> dict[str, str]:
    """The OTEL_* variables an operator sets (docs/operations.md, "Traces"); `role` becomes a resource attribute so
    the test can tell which process sent a span."""
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
            "OTEL_RESOURCE_ATTRIBUTES": f"deployment.role={role}", "OTEL_BSP_SCHEDULE_DELAY": "200", **extra}


@pytest.fixture
def processes(settings, product_redis, crm, collector, tmp_path):
    """Start the web process and Celery workers against this test's databases, broker and CRM; stopped after."""
    started: list[Child] = []
    base = {"REDIS_URL": product_redis.url, "CONNECTOR_EGRESS_BASE_URL": crm.url,
            "CONNECTOR_EGRESS_TIMEOUT_SECONDS": "5", "DJANGO_STATIC_ROOT": str(tmp_path / "static"),
            "WEB_CONCURRENCY": "1", **run_database_env()}
    secret_dir = settings.CONNECTOR["SECRET_BACKEND_DIR"]

    def web():
        env = child_environment(secret_dir=secret_dir, **base, **otlp_env(collector, "web"))
        port = free_port()
        child = web_child(env, port, tmp_path).start()
        started.append(child)
        wait_http(port, 90, child.proc)
        wait_web_workers(child)
        return f"http://127.0.0.1:{port}"

    def worker(**otel):
        """One Celery worker consuming every stage's queue, prefork with one pool child (scripts/run.py's worker
        groups, folded into one to spare the test machine)."""
        env = child_environment(secret_dir=secret_dir, **base, **otlp_env(collector, "worker", **otel))
        argv = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", QUEUES, "-l", "INFO",
                "--pool", "prefork", "--concurrency", "1", "-n", f"otlp{len(started)}@%h",
                "--without-gossip", "--without-mingle"]
        child = Child(f"worker{len(started)}", argv, env, tmp_path).start()
        started.append(child)
        deadline = time.monotonic() + 90
        while " ready." not in child.output():
            assert child.proc.poll() is None, child.output()
            assert time.monotonic() < deadline, child.output()
            time.sleep(0.2)
        return child

    try:
        yield web, worker
    finally:
        for child in started:
            child.stop()


def deliver(url: str, account: str, n: int) -> str:
    """One signed delivery over HTTP, continuing a new caller trace (returned: its trace id)."""
    trace_id = os.urandom(16).hex()
    payload = body(event(id=f"e-otlp-{n}", record_id=f"r-otlp-{n}"))
    secret = secret_backend().read(CredentialGeneration.objects.get(
        generation_id=f"{account}.webhook-signing.g1").secret_version_ref)
    response = httpx.post(f"{url}/api/v2/accounts/{account}/channels/records.webhook/receipts", content=payload,
                          headers={"Idempotency-Key": f"k-otlp-{n}", "Content-Type": "application/json",
                                   "Connector-Signature": sign(secret, int(time.time()), payload),
                                   "traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"}, timeout=30)
    assert response.status_code == 201, response.text
    return trace_id


def finalized(timeout: float = 90) -> RemoteEffect:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        effect = RemoteEffect.objects.select_related("command").filter(state="finalized").first()
        if effect is not None:
            return effect
        time.sleep(0.2)
    raise AssertionError(f"no finalized effect after {timeout}s: "
                         f"{list(RemoteEffect.objects.values_list('state', flat=True))}")


def traceparent(span) -> str:
    return f"00-{span.trace_id}-{span.span_id}-01"


def test_one_delivery_through_the_real_processes_arrives_as_one_trace_at_the_otlp_endpoint(processes, crm,
                                                                                          collector):
    """A signed delivery with the caller's `traceparent`, admitted by the real web process and carried by a real
    worker to the CRM, arrives at the OTLP/HTTP endpoint as protobuf: one trace (the caller's) holding every span
    from admission to the egress request, each the child of the previous stage's span, continued across processes
    only through the trace context stored beside each outbox row; the admission came from the web process and the
    rest from the worker (their resource attributes, service.name `connector-v2`); the CRM saw the egress span's
    `traceparent`. Proves: issue 42 item 2"""
    from connector.demo import build_world

    web, worker = processes
    world = build_world("ox-", push=True)
    url = web()
    worker()
    crm.requests.clear()
    trace_id = deliver(url, world.accounts[0].account_key, 1)
    effect = finalized()
    by_name = collector.wait_for(trace_id, set(STAGES), 30)

    chain = [by_name[name] for name in STAGES]
    assert (chain[0].parent_span_id, chain[0].kind) == (CALLER_SPAN, SERVER)
    for parent, child in zip(chain, chain[1:]):
        assert child.parent_span_id == parent.span_id, (parent.name, child.name)
    assert by_name["egress_send"].kind == CLIENT
    assert {s.resource["service.name"] for s in chain} == {"connector-v2"}
    assert chain[0].resource["deployment.role"] == "web"
    assert {s.resource["deployment.role"] for s in chain[1:]} == {"worker"}
    # Each hop between stages is the context stored with the durable row the earlier stage wrote.
    stored = {"receipt_admit": ReceiptTrace.objects.get().traceparent,
              "receipt_materialize": ProjectionTrace.objects.get().traceparent,
              "lane_advance": ExecutionTrace.objects.get().traceparent,
              "outbound_command_author": CommandTrace.objects.get(command=effect.command).traceparent}
    for name, value in stored.items():
        assert value == traceparent(by_name[name]), name
    sent = [r for r in crm.requests if r["method"] in ("POST", "PATCH", "PUT")]
    assert [r["traceparent"] for r in sent] == [traceparent(by_name["egress_send"])]
    assert all(r["path"] == "/v1/traces" and r["content_type"] == "application/x-protobuf"
               for r in collector.requests)


@pytest.mark.parametrize("stop", ["process group", "main process"])
def test_a_stopping_worker_flushes_the_spans_still_in_its_batch_processor(processes, collector, stop):
    """A worker whose batch processor would hold its spans for ten minutes (OTEL_BSP_SCHEDULE_DELAY) has sent
    none of them when the delivery finalized; stopped by SIGTERM (to its process group as `make run` stops it, or
    to the main process as an orchestrator does), it exports them before it exits: every worker span of the trace
    arrives. Proves: issue 42 item 2"""
    from connector.demo import build_world

    web, worker = processes
    world = build_world("oy-", push=True)
    url = web()
    child = worker(OTEL_BSP_SCHEDULE_DELAY="600000")
    trace_id = deliver(url, world.accounts[0].account_key, 2)
    finalized()
    collector.wait_for(trace_id, {"receipt_admit"}, 30)
    time.sleep(1)
    held = {s.name for s in collector.trace(trace_id) if s.resource.get("deployment.role") == "worker"}
    assert held == set(), f"the worker exported before it stopped: {held}"

    if stop == "process group":
        code = child.stop(grace=20)
    else:
        os.kill(child.proc.pid, signal.SIGTERM)
        code = child.wait(20)
    assert code is not None
    by_name = collector.wait_for(trace_id, set(STAGES), 10)
    assert {by_name[name].resource["deployment.role"] for name in STAGES[1:]} == {"worker"}
