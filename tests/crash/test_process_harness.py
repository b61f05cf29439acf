"""Process harness: REAL server processes killed at named crash points, restarted, and checked.

Unlike the other crash tests (a child Python process calling one service), these run the deployable processes
themselves: the web process (`manage.py runserver --noreload` on a spare port, a signed admission posted with
httpx) and a Celery worker (`celery -A config worker -Q claims,sweeper,egress --pool solo`) against a private
Redis started by scripts/services.py on a spare port. Each is started with CONNECTOR_FAULT_POINT set, driven to
the point until it dies by SIGKILL (-9), restarted without the fault point, and left to finish the work. Then the
operator's `manage.py check_invariants` must pass and the receiver must have applied each logical effect at most
once. The child processes use this run's test databases (URLs built from django.db.connections)."""
from __future__ import annotations

import signal
import sys
import time
from collections import Counter

import httpx
import pytest
from celery import Celery
from django.conf import settings as django_settings
from django.utils import timezone

from connector.demo import build_world
from connector.models import (
    ApplicationResult,
    CredentialGeneration,
    CrmRecord,
    Execution,
    MaterializationDue,
    Receipt,
    ReceiptAdmissionKey,
    ReceiptComponent,
)
from connector.secrets import secret_backend
from connector.services.signatures import sign
from connector.services.sweeper import inbound_sweep
from effects.models import OutboundCommand, RemoteEffect
from tests.crash.support import CHANNEL, DB, ready_execution, webhook_body
from tests.effects.receiver import Receiver
from tests.faults.servers import (
    Child,
    RedisServer,
    check_invariants,
    child_environment,
    free_port,
    run_database_env,
    wait_port,
)
from tests.support import scaled, wait_for, whole_seconds

pytestmark = pytest.mark.django_db(**DB)
KILLED = -signal.SIGKILL


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer()
    try:
        yield server.start()
    finally:
        server.cleanup()


@pytest.fixture
def receiver(settings):
    r = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": r.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(2)}
    yield r
    r.stop()


@pytest.fixture
def env(settings, redis_server, receiver):
    """A child process bound to this test's databases, secret directory, the private Redis and the receiver."""
    return child_environment(secret_dir=settings.CONNECTOR["SECRET_BACKEND_DIR"], REDIS_URL=redis_server.url,
                             CONNECTOR_EGRESS_BASE_URL=receiver.url,
                             CONNECTOR_EGRESS_TIMEOUT_SECONDS=str(whole_seconds(2)),
                             CONNECTOR_LEASE_SECONDS="1", **run_database_env())


@pytest.fixture
def children(tmp_path):
    """Every child started through this list is stopped at the end of the test (before the database flush)."""
    started: list[Child] = []
    yield started
    for child in started:
        child.stop()


# -- web process ---------------------------------------------------------------------------------------------------

def _web(env: dict, port: int, tmp_path, fault: str | None) -> Child:
    child_env = dict(env, **({"CONNECTOR_FAULT_POINT": fault} if fault else {}))
    return Child("web", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload",
                         "--skip-checks"], child_env, tmp_path)


def _signed_post(port: int, account: str, key: str, body: bytes) -> httpx.Response:
    generation = CredentialGeneration.objects.get(generation_id=f"{account}.webhook-signing.g1")
    secret = secret_backend().read(generation.secret_version_ref)
    headers = {"Idempotency-Key": key, "Connector-Signature": sign(secret, int(time.time()), body),
               "Content-Type": "application/json"}
    return httpx.post(f"http://127.0.0.1:{port}/api/v2/accounts/{account}/channels/{CHANNEL}/receipts",
                      content=body, headers=headers, timeout=scaled(20))


def test_web_killed_after_receipt_commit_retry_gets_same_receipt(env, children, tmp_path):
    """The web process dies by SIGKILL at "admission.after_receipt_commit": the Receipt and its key are durable,
    the client got no answer and no materialization was enqueued. After a restart (no fault point) the client's
    retry of the same key and bytes gets the same Receipt and epoch (200 `duplicate`); the sweeper materializes
    the children from MaterializationDue; check_invariants passes."""
    world = build_world("hw-")
    account = world.accounts[0].account_key
    body = webhook_body(("rec-a", 1), ("rec-b", 1))
    port = free_port()
    web = _web(env, port, tmp_path, "admission.after_receipt_commit")
    children.append(web.start())
    wait_port(port, 30, web.proc)

    with pytest.raises(httpx.TransportError):  # the connection drops: no HTTP answer at all
        _signed_post(port, account, "delivery-1", body)
    assert web.wait(15) == KILLED, web.output()
    receipt = Receipt.objects.get(account__account_key=account)
    assert ReceiptAdmissionKey.objects.get(receipt=receipt).transport_key == "delivery-1"
    assert MaterializationDue.objects.filter(receipt=receipt).exists()
    assert not ReceiptComponent.objects.filter(receipt=receipt).exists()

    restarted = _web(env, port, tmp_path, None)
    children.append(restarted.start())
    wait_port(port, 30, restarted.proc)
    retry = _signed_post(port, account, "delivery-1", body)
    assert retry.status_code == 200, retry.text
    data = retry.json()
    assert (data["admission"], data["receipt"], data["component_count"]) == ("duplicate", receipt.pk, 2)
    assert data["epoch"] == {"id": world.active_epoch.epoch_id, "digest": bytes(world.active_epoch.digest).hex()}
    assert Receipt.objects.filter(account__account_key=account).count() == 1

    assert inbound_sweep(grace_seconds=0).materialized == 1  # nothing was enqueued: the sweeper finds it
    assert ReceiptComponent.objects.filter(receipt=receipt).count() == 2
    report = check_invariants(env)
    assert report["ok"], report
    assert restarted.proc.poll() is None, restarted.output()  # the restarted server stayed up


# -- Celery worker -------------------------------------------------------------------------------------------------

def _worker(env: dict, tmp_path, fault: str | None) -> Child:
    child_env = dict(env, **({"CONNECTOR_FAULT_POINT": fault} if fault else {}))
    return Child("worker", [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "claims,sweeper,egress",
                            "--pool", "solo", "-n", f"harness-{time.monotonic_ns()}@%h", "-l", "INFO",
                            "--without-gossip", "--without-mingle", "--without-heartbeat"], child_env, tmp_path)


def _send(broker_url: str, task: str, queue: str) -> None:
    """Enqueue one task by name on the private broker, as beat or another process would (behind this run's Redis
    key prefix, where the workers of this run listen)."""
    app = Celery("harness-client", broker=broker_url, set_as_current=False)  # leave the project's app current
    app.conf.broker_transport_options = dict(django_settings.CELERY_BROKER_TRANSPORT_OPTIONS)
    try:
        app.send_task(task, queue=queue)
    finally:
        app.close()


def test_worker_killed_after_runtime_commit_restart_completes_once(env, children, tmp_path, redis_server,
                                                                  receiver):
    """A Celery worker dies by SIGKILL at "runtime.batch_after_commit" while running `execution_claim_and_run`
    (the batched Runtime, which takes pushing routes since D-293): Runtime committed the CRM change, the
    ApplicationResult and the OutboundCommand, the Execution is still `ready`
    under the dead worker's lease. A restarted worker, woken by the inbound sweep once the lease expired,
    completes the same Execution from the stored result (one ApplicationResult, CRM version 1), then dispatches
    the one RemoteEffect: the receiver applies it exactly once. check_invariants passes."""
    world = build_world("hc-", push=True)
    account = world.accounts[0]
    execution = ready_execution(account.account_key)

    worker = _worker(env, tmp_path, "runtime.batch_after_commit")
    children.append(worker.start())
    _send(redis_server.url, "connector.tasks.execution_claim_and_run", "claims")
    assert worker.wait(60) == KILLED, worker.output()

    crashed = Execution.objects.get(pk=execution.pk)
    assert crashed.state == "ready" and crashed.attempt_count == 1
    result = ApplicationResult.objects.get(command_id=execution.command_id)
    assert CrmRecord.objects.get(account=account, record_key="rec-1").version == 1
    command = OutboundCommand.objects.get(account=account)
    assert RemoteEffect.objects.get(command=command).state == "prepared"
    assert receiver.requests == []

    restarted = _worker(env, tmp_path, None)
    children.append(restarted.start())
    wait_for(lambda: Execution.objects.get(pk=execution.pk).lease_expires_at < timezone.now(), 10, "lease expiry")
    _send(redis_server.url, "connector.tasks.inbound_sweep", "sweeper")  # beat's job: finds the claimable work
    wait_for(lambda: Execution.objects.get(pk=execution.pk).state == "completed", 30,
              "the restarted worker to complete the Execution")
    done = Execution.objects.get(pk=execution.pk)
    assert done.attempt_count == 2 and bytes(done.result_digest) == bytes(result.result_digest)
    assert ApplicationResult.objects.filter(command_id=execution.command_id).count() == 1
    assert CrmRecord.objects.get(account=account, record_key="rec-1").version == 1

    _send(redis_server.url, "effects.tasks.effects_sweep", "sweeper")
    wait_for(lambda: RemoteEffect.objects.get(command=command).state == "finalized", 30, "the effect to finalize")
    per_key = Counter(r["key"] for r in receiver.requests)
    assert per_key == {command.provider_idempotency_key: 1}, per_key  # one request, one logical application
    assert receiver.applied_total() == 1
    report = check_invariants(env)
    assert report["ok"], report
    assert restarted.proc.poll() is None, restarted.output()
