"""Fault: the broker (Redis) stops during admission load, then comes back empty.

A private Redis on a spare port (scripts/services.py PrivateRedis) is the Celery broker of this process
(CELERY_BROKER_URL override). Signed deliveries are admitted over HTTP while it runs, while it is stopped and after
it restarted (without persistence: the messages queued before the stop are gone). Admission answers 201 throughout:
the enqueue failure is logged, never raised. The inbound sweep, which reads due work from PostgreSQL
(MaterializationDue), then materializes every receipt: the never-enqueued ones and the ones whose message died
with the broker alike. Nothing is lost; check_invariants passes."""
from __future__ import annotations

import json
import logging
import time

import pytest
import redis
from django.conf import settings
from django.test import Client

from connector import tasks
from connector.demo import build_world
from connector.models import CredentialGeneration, Event, MaterializationDue, Receipt, ReceiptComponent
from connector.secrets import secret_backend
from connector.selectors.invariants import invariant_check
from connector.services.signatures import sign
from connector.services.sweeper import inbound_sweep
from tests.faults.servers import RedisServer, point_celery_at

CHANNEL = "records.webhook"


@pytest.fixture
def broker(settings):
    """This process publishes to a private Redis (restored afterwards)."""
    server = RedisServer()
    try:
        server.start()
    except BaseException:
        server.cleanup()
        raise
    celery_app = tasks.receipt_materialize.app  # the app the view's enqueue publishes through
    saved = celery_app.conf.broker_url

    def point_at(url: str) -> None:
        point_celery_at(celery_app, url)

    settings.CELERY_BROKER_URL = server.url
    point_at(server.url)
    try:
        yield server
    finally:
        point_at(saved)
        server.cleanup()


def _delivery(n: int) -> bytes:
    return json.dumps({"events": [{"id": f"rb-ev-{n}", "type": "record.updated", "record_id": f"rb-r-{n}",
                                   "sequence": 1, "occurred_at": "2026-01-01T00:00:00Z",
                                   "data": {"name": f"Broker {n}", "email": f"b{n}@example.com"}}]}).encode()


@pytest.mark.django_db(transaction=True)
def test_admission_survives_broker_outage_and_the_sweeper_loses_nothing(broker, caplog):
    world = build_world("rb-")
    account = world.accounts[0].account_key
    generation = CredentialGeneration.objects.get(generation_id=f"{account}.webhook-signing.g1")
    secret = secret_backend().read(generation.secret_version_ref)
    client = Client()
    url = f"/api/v2/accounts/{account}/channels/{CHANNEL}/receipts"
    queue = redis.Redis.from_url(broker.url)
    materialize = settings.CONNECTOR_REDIS_KEY_PREFIX + "materialize"  # the queue behind this run's key prefix

    def admit(n: int) -> float:
        body = _delivery(n)
        began = time.monotonic()
        response = client.post(url, data=body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=f"rb-{n}",
                               HTTP_CONNECTOR_SIGNATURE=sign(secret, int(time.time()), body))
        elapsed = time.monotonic() - began
        assert response.status_code == 201, response.content
        return elapsed

    up = [admit(n) for n in range(5)]
    assert queue.llen(materialize) == 2  # the burst woke each of the account's two batch runs once (D-269)

    broker.stop()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="connector.api.views"):
        down = [admit(n) for n in range(5, 15)]
    failures = [r for r in caplog.records if "materialization enqueue failed" in r.getMessage()]
    assert len(failures) == 10, [r.getMessage() for r in caplog.records]

    broker.start()  # same port, no persistence: the five messages queued before the stop are gone
    queue = redis.Redis.from_url(broker.url)
    after = [admit(n) for n in range(15, 20)]
    assert queue.llen(materialize) == 2  # the debounce keys were lost with the messages: fresh wake-ups

    assert Receipt.objects.count() == 20 and MaterializationDue.objects.count() == 20
    report = invariant_check()  # due receipts are a legitimate in-flight state
    assert report.ok, report.violations

    began = time.monotonic()
    assert inbound_sweep(grace_seconds=0).materialized == 20
    sweep_seconds = time.monotonic() - began
    assert MaterializationDue.objects.count() == 0
    assert ReceiptComponent.objects.count() == 20 and Event.objects.count() == 20
    assert invariant_check().ok
    print(f"\nadmission latency: broker up p50 {sorted(up)[2] * 1000:.0f} ms; broker down max "
          f"{max(down) * 1000:.0f} ms; after restart p50 {sorted(after)[2] * 1000:.0f} ms; "
          f"sweep of 20 receipts {sweep_seconds * 1000:.0f} ms")
