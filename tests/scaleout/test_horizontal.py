"""Horizontal processes against one database: 2 web + 2 Celery worker processes, exactly once (issue 23).

The deployable processes themselves (the crash harness's: `manage.py runserver --noreload` for web, `celery -A
config worker --pool solo` consuming every stage queue for workers, a private Redis, the loopback receiver) run
against this test's databases. Events are admitted over HTTP through both web processes for both accounts, some
of them twice (the duplicate through the other web process), while one web process dies by SIGKILL right after a
receipt commit (the client retries the same key on the other one) and one worker dies by SIGKILL right after a
Runtime commit (a replacement takes over once the lease expired, woken by the sweeps beat would send). At the end
every admitted event has exactly one Execution, one ApplicationResult, one command, one finalized effect and one
request at the receiver: 0 lost, 0 duplicated; the operator's `check_invariants` passes. Figures are printed (and
written to $HORIZONTAL_REPORT if set) for docs/benchmarks.md."""
from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db.models import Count

from connector.demo import build_world
from connector.models import ApplicationResult, CrmRecord, Execution, Receipt, ReceiptAdmissionKey
from effects.models import OutboundCommand, RemoteEffect
from tests.crash.support import DB, webhook_body
from tests.crash.test_process_harness import (  # noqa: F401  (fixtures)
    _send,
    _signed_post,
    children,
    env,
    receiver,
    redis_server,
)
from tests.faults.servers import Child, check_invariants, free_port, wait_port
from tests.support import scaled

pytestmark = pytest.mark.django_db(**DB)
KILLED = -signal.SIGKILL
EVENTS = int(os.environ.get("HORIZONTAL_EVENTS", "40"))
QUEUES = "materialize,claims,lanes,egress,sweeper"


def _web(env: dict, port: int, tmp_path, name: str, fault: str | None = None) -> Child:
    child_env = dict(env, **({"CONNECTOR_FAULT_POINT": fault} if fault else {}))
    return Child(name, [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload",
                        "--skip-checks"], child_env, tmp_path)


def _worker(env: dict, tmp_path, name: str, fault: str | None = None) -> Child:
    child_env = dict(env, **({"CONNECTOR_FAULT_POINT": fault} if fault else {}))
    return Child(name, [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", QUEUES, "--pool", "solo",
                        "-n", f"{name}-{time.monotonic_ns()}@%h", "-l", "INFO", "--without-gossip",
                        "--without-mingle", "--without-heartbeat"], child_env, tmp_path)


def _done() -> bool:
    return (Execution.objects.filter(state="completed").count() == EVENTS
            and RemoteEffect.objects.filter(state="finalized").count() == EVENTS)


@pytest.mark.slow
def test_two_web_and_two_worker_processes_deliver_every_event_exactly_once(env, children, tmp_path, redis_server,
                                                                           receiver):
    """2 web + 2 worker processes on one database, with one of each killed mid-flight and replaced: every event
    admitted once, executed once, applied once at the receiver. Proves: CV2-14-001 (processes added
    horizontally), CV2-05-016, CV2-07-010, CV2-10-001 (exactly once across process crashes)"""
    world = build_world("hz-", push=True)
    accounts = [a.account_key for a in world.accounts]
    ports = [free_port(), free_port()]
    webs = [_web(env, ports[0], tmp_path, "web-a"),
            _web(env, ports[1], tmp_path, "web-b", "admission.after_receipt_commit")]
    workers = [_worker(env, tmp_path, "worker-1", "runtime.batch_after_commit"), _worker(env, tmp_path, "worker-2")]
    for child in webs + workers:
        children.append(child.start())
    for port, web in zip(ports, webs):
        wait_port(port, 60, web.proc)

    latencies, outcomes, receipts = [], Counter(), {}

    def admit(i: int) -> None:
        account, key, body = accounts[i % 2], f"hz-{i}", webhook_body((f"rec-hz-{i}", 1))
        order = [i % 2, 1 - i % 2]
        for attempt, which in enumerate(order):
            started = time.monotonic()
            try:
                response = _signed_post(ports[which], account, key, body)
            except httpx.TransportError:  # that web process died: retry the same key and bytes on the other one
                outcomes["transport_error_retried"] += 1
                continue
            latencies.append((time.monotonic() - started) * 1000)
            assert response.status_code in (200, 201), response.text
            data = response.json()
            outcomes[data["admission"]] += 1
            receipts.setdefault(key, data["receipt"])
            assert receipts[key] == data["receipt"], (key, receipts[key], data)
            if attempt == 0 and i % 7 == 3:  # a client duplicate through the other web process (if it is up)
                try:
                    again = _signed_post(ports[1 - which], account, key, body)
                except httpx.TransportError:
                    again = _signed_post(ports[which], account, key, body)
                assert again.status_code == 200 and again.json()["admission"] == "duplicate", again.text
                assert again.json()["receipt"] == data["receipt"]
                outcomes["duplicate_checked"] += 1
            return
        raise AssertionError(f"{key}: no web process admitted it")

    began = time.monotonic()
    with ThreadPoolExecutor(4) as pool:  # first half: web-b dies at its first receipt commit
        list(pool.map(admit, range(EVENTS // 2)))
    assert webs[1].wait(30) == KILLED, webs[1].output()
    restarted_web = _web(env, ports[1], tmp_path, "web-b2")  # the dead web process comes back without the fault
    children.append(restarted_web.start())
    wait_port(ports[1], 60, restarted_web.proc)
    with ThreadPoolExecutor(4) as pool:  # second half: two web processes again
        list(pool.map(admit, range(EVENTS // 2, EVENTS)))
    admitted = time.monotonic() - began
    assert workers[0].wait(90) == KILLED, workers[0].output()
    children.append(_worker(env, tmp_path, "worker-1b").start())

    deadline = time.monotonic() + scaled(240)
    while not _done():  # beat's job: the sweeps find what a lost message or a dead worker left
        assert time.monotonic() < deadline, (Execution.objects.values("state").annotate(n=Count("pk")),
                                             RemoteEffect.objects.values("state").annotate(n=Count("pk")))
        _send(redis_server.url, "connector.tasks.inbound_sweep", "sweeper")
        _send(redis_server.url, "effects.tasks.effects_sweep", "sweeper")
        time.sleep(1.0)
    finished = time.monotonic() - began

    keys = {f"hz-{i}" for i in range(EVENTS)}
    assert set(ReceiptAdmissionKey.objects.values_list("transport_key", flat=True)) == keys
    assert Receipt.objects.count() == EVENTS
    assert Execution.objects.count() == EVENTS == Execution.objects.filter(state="completed").count()
    assert ApplicationResult.objects.count() == EVENTS
    assert set(CrmRecord.objects.values_list("version", flat=True)) == {1}
    assert OutboundCommand.objects.count() == EVENTS
    assert RemoteEffect.objects.filter(state="finalized").count() == EVENTS
    per_key = Counter(r["key"] for r in receiver.requests)
    assert receiver.applied_total() == EVENTS and len(per_key) == EVENTS, per_key
    assert max(per_key.values()) == 1, [k for k, n in per_key.items() if n > 1]  # not one request sent twice
    report = check_invariants(env)
    assert report["ok"], report
    assert webs[0].proc.poll() is None and restarted_web.proc.poll() is None and workers[1].proc.poll() is None

    figures = {"events": EVENTS, "web_processes": 2, "worker_processes": 2, "admission_seconds": round(admitted, 2),
               "admissions_per_s": round(EVENTS / admitted, 1), "end_to_end_seconds": round(finished, 2),
               "events_per_s_end_to_end": round(EVENTS / finished, 2),
               "admission_ms_p50": round(statistics.median(latencies), 1),
               "admission_ms_p95": round(sorted(latencies)[int(0.95 * (len(latencies) - 1))], 1),
               "outcomes": dict(outcomes), "lost": 0, "duplicated": 0,
               "killed": ["web-b at admission.after_receipt_commit", "worker-1 at runtime.batch_after_commit"]}
    print("\nHORIZONTAL", json.dumps(figures))
    if os.environ.get("HORIZONTAL_REPORT"):
        with open(os.environ["HORIZONTAL_REPORT"], "w") as out:
            json.dump(figures, out, indent=1)
