"""The batch materializer (issue 18: workers woken per batch, never per item; D-269, D-270).

A burst of admissions sends ONE wake-up per account (a Redis `SET NX` debounce in the broker), one run of
`connector.tasks.materialize_due` materializes every due receipt, each in its own transaction and isolated as
before, advances the lanes inline and wakes the claimers once per CLAIM_BATCH executions. Two racing runs
materialize each receipt exactly once. A lost wake-up is recovered by the sweep (a fresh wake-up when Redis
answers, the sweep materializing itself when it does not: losing Redis loses no work)."""
from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.utils import timezone

from connector import tasks
from connector.api.views import _materialization_enqueue
from connector.models import (
    Event,
    Execution,
    MaterializationDue,
    Receipt,
    ReceiptComponent,
    StepFailure,
)
from connector.services import materialize
from tests.concurrency import raised, run_concurrently
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import admit, build_inbound_world, webhook_body, webhook_event

WEBHOOK = "records.webhook"
K = 30


class Sent:
    """Records what would have been published (the task's `delay`), instead of publishing."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args, **kwargs) -> None:
        self.calls.append(args)


@pytest.fixture
def sent(monkeypatch):
    wakes, claims, lanes, singles = Sent(), Sent(), Sent(), Sent()
    monkeypatch.setattr(tasks.materialize_due, "delay", wakes)
    monkeypatch.setattr(tasks.execution_claim_and_run, "delay", claims)
    monkeypatch.setattr(tasks.lane_advance, "delay", lanes)
    monkeypatch.setattr(tasks.receipt_materialize, "delay", singles)
    return {"wakes": wakes, "claims": claims, "lanes": lanes, "singles": singles}


@pytest.fixture
def world(db):
    return build_inbound_world("mw-", [PACK_A])


@pytest.fixture(autouse=True)
def clean_keys():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)  # the test Redis, whatever a test points at

    def clear() -> None:
        for key in client.scan_iter(tasks._wake_key("*", "*")):  # this run's keys only (its Redis key prefix)
            client.delete(key)
    clear()
    yield
    clear()


def _burst(world, n: int = K, prefix: str = "") -> list[Receipt]:
    return [admit(world, WEBHOOK, webhook_body(webhook_event(f"{prefix}ev-{i}", f"{prefix}rec-{i}", 1)))
            for i in range(n)]


def _admitted(world, n: int = K) -> list[Receipt]:
    receipts = _burst(world, n)
    for receipt in receipts:  # what the admission view runs on each commit
        _materialization_enqueue(receipt.pk, receipt.account_id)
    return receipts


def test_a_burst_is_materialized_by_one_wake_up(world, sent, settings):
    """K admissions of one account send one wake-up; its one run materializes all K receipts (each exactly once),
    advances their lanes inline (no lane message) and wakes the claimers once per CLAIM_BATCH executions.
    Proves: CV2-05-017, CV2-14-003"""
    settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_BATCH": 7, "CLAIM_BATCH": 10, "MATERIALIZE_SLOTS": 1}
    receipts = _admitted(world)
    assert sent["wakes"].calls == [(world.account.pk, 0)] and not sent["singles"].calls
    assert tasks.materialize_due(world.account.pk) == K
    assert MaterializationDue.objects.count() == 0
    assert ReceiptComponent.objects.count() == K and Event.objects.count() == K
    assert Execution.objects.count() == K  # one per lane, minted inline
    assert not sent["lanes"].calls
    assert len(sent["claims"].calls) == -(-K // 10)
    # the run dropped its debounce key: the next admission wakes again
    [late] = _burst(world, 1, prefix="late-")
    _materialization_enqueue(late.pk, late.account_id)
    assert len(sent["wakes"].calls) == 2
    assert {r.pk for r in receipts} <= set(Receipt.objects.values_list("pk", flat=True))


def test_a_burst_wakes_one_run_per_slot_and_the_runs_share_the_receipts(world, sent, settings):
    """With MATERIALIZE_SLOTS runs per account, a burst sends one wake-up per slot and the runs take disjoint
    receipts (pk modulo the slots): together all of them, each once. Proves: CV2-05-017, CV2-14-003"""
    settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_SLOTS": 3}
    receipts = _admitted(world)
    assert sorted(sent["wakes"].calls) == [(world.account.pk, slot) for slot in range(3)]
    taken = [tasks.materialize_due(*wake) for wake in sent["wakes"].calls]
    assert sorted(taken) == sorted(len([r for r in receipts if r.pk % 3 == slot]) for slot in range(3))
    assert sum(taken) == K and MaterializationDue.objects.count() == 0 and Event.objects.count() == K


def test_a_receipt_admitted_during_a_run_is_taken_by_that_run_or_woken(world, sent, settings):
    """The debounce never strands a receipt: one committed while the run holds the key (its wake-up suppressed)
    is seen by the run's last look after it drops the key. Proves: CV2-05-017"""
    settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_SLOTS": 1}
    _admitted(world, 3)
    extra: list[Receipt] = []

    def during(real):
        def call(**kwargs):
            out = real(**kwargs)
            if not extra:
                [receipt] = _burst(world, 1, prefix="during-")
                extra.append(receipt)
                _materialization_enqueue(receipt.pk, receipt.account_id)  # suppressed: the key is held
            return out
        return call

    real = materialize.receipts_materialize
    materialize.receipts_materialize = during(real)
    try:
        assert tasks.materialize_due(world.account.pk) == 4
    finally:
        materialize.receipts_materialize = real
    assert len(sent["wakes"].calls) == 1
    assert MaterializationDue.objects.count() == 0 and Event.objects.count() == 4


@pytest.mark.django_db(transaction=True)
def test_two_racing_runs_materialize_each_receipt_exactly_once(sent, settings):
    """Two workers run the same account's batch at once (a sweep's wake-up and an admission's): every receipt
    has exactly its children and one execution, nothing raised. Proves: CV2-05-016, CV2-05-017"""
    settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_SLOTS": 1}  # both runs on the same receipts
    world = build_inbound_world("mr-", [PACK_A])
    _burst(world)
    results = run_concurrently([lambda: tasks.materialize_due(world.account.pk)] * 2,
                               before=lambda: connection.ensure_connection())
    assert not raised(results), results
    assert MaterializationDue.objects.count() == 0
    assert ReceiptComponent.objects.count() == K and Event.objects.count() == K
    assert Execution.objects.count() == K
    assert len(set(Execution.objects.values_list("projection_id", flat=True))) == K
    assert not StepFailure.objects.exists()


def test_a_lost_wake_up_is_woken_again_by_the_sweep(world, sent, settings):
    """No message reached a worker (no debounce key either, e.g. Redis restarted): the sweep wakes the account's
    batch materializer once, and does not materialize itself what a live worker will take. Proves: CV2-05-017"""
    settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_SLOTS": 1}
    _burst(world, 5)  # admitted, never woken
    MaterializationDue.objects.update(due_at=timezone.now() - timedelta(seconds=10))
    report = tasks.inbound_sweep()
    assert report["materialized"] == 0
    assert sent["wakes"].calls == [(world.account.pk, 0)]
    tasks.inbound_sweep()  # the wake-up is pending: not repeated
    assert len(sent["wakes"].calls) == 1
    tasks.materialize_due(world.account.pk)
    assert MaterializationDue.objects.count() == 0 and Event.objects.count() == 5


def test_the_sweep_materializes_itself_when_redis_is_down(world, sent, settings):
    """The broker unreachable: the admission's wake-up fails (logged), and the sweep materializes every due
    receipt itself. Losing Redis loses no work. Proves: CV2-05-017, CV2-13-001"""
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    receipts = _burst(world, 5)
    for receipt in receipts:
        _materialization_enqueue(receipt.pk, receipt.account_id)  # logged, never raised
    assert not sent["wakes"].calls
    MaterializationDue.objects.update(due_at=timezone.now() - timedelta(seconds=10))
    report = tasks.inbound_sweep()
    assert report["materialized"] == 5
    assert MaterializationDue.objects.count() == 0 and Event.objects.count() == 5


def test_a_receipt_stuck_past_the_bound_is_materialized_by_the_sweep(world, sent, settings):
    """A wake-up pending (its key set) but no worker taking it: past MATERIALIZE_STUCK_SECONDS the sweep
    materializes the receipt itself. Proves: CV2-05-017"""
    settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_STUCK_SECONDS": 5}
    _admitted(world, 2)
    MaterializationDue.objects.update(due_at=timezone.now() - timedelta(seconds=3))
    assert tasks.inbound_sweep()["materialized"] == 0
    MaterializationDue.objects.update(due_at=timezone.now() - timedelta(seconds=10))
    assert tasks.inbound_sweep()["materialized"] == 2


def test_a_poison_receipt_is_held_and_the_rest_of_the_batch_materializes(world, sent, monkeypatch, settings):
    """One receipt of the batch fails deterministically: the shared transaction of the batch (D-294) rolls back,
    the batch is split until the failing receipt stands alone (D-521), it is held with MATERIALIZATION_FAILED
    evidence, the run returns normally and every other receipt of the batch is materialized. Proves: CV2-13-001"""
    settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_SLOTS": 1}
    receipts = _admitted(world, 6)
    bad = receipts[2].pk
    real = materialize.receipts_materialize
    batches = []

    def batch(**kwargs):  # the receipt fails every transaction it is part of
        batches.append(sorted(kwargs["receipt_pks"]))
        if bad in kwargs["receipt_pks"]:
            raise ValueError(f"poison receipt {bad}")
        return real(**kwargs)

    monkeypatch.setattr(materialize, "receipts_materialize", batch)
    assert tasks.materialize_due(world.account.pk) == 6
    assert MaterializationDue.objects.get(receipt_id=bad).held_reason == "MATERIALIZATION_FAILED"
    assert StepFailure.objects.get(entity_id=str(bad)).step == "receipt_materialize"
    assert MaterializationDue.objects.count() == 1 and Event.objects.count() == 5
    assert len(batches) <= 7 and [bad] in batches  # split in halves: the poison stands alone after a few tries


def test_the_batch_pick_is_routable_by_account(world):
    """The batch materializer's read of the due rows names its account (pinned through the receipt's
    distribution column, docs/scale-out.md), with or without receipts already attempted. Proves: CV2-14-001"""
    from django.test.utils import CaptureQueriesContext

    from connector.selectors import materialization
    from tests.scaleout.routing import check

    with CaptureQueriesContext(connection) as queries:
        materialization.due_receipts(account_id=world.account.pk, limit=50)
        materialization.due_receipts(account_id=world.account.pk, limit=50, skip={1, 2}, slot=(1, 2))
    assert len(queries.captured_queries) == 2 and "% 2" in queries.captured_queries[1]["sql"]
    for query in queries.captured_queries:
        assert not check(query["sql"]).findings, query["sql"]
    with CaptureQueriesContext(connection) as unpinned:  # the checker does refuse the cross-account read
        materialization.due_receipts(account_id=None, limit=50)
    assert check(unpinned.captured_queries[0]["sql"]).findings


def test_the_sweep_never_duplicates_a_running_batch(world, sent, settings):
    """While an account's run is alive (its key refreshed to `run`), the sweep neither wakes a second run nor
    materializes the account's receipts itself, however long they have been due; once the run's key is gone
    (the run died), the sweep wakes a new one and, past MATERIALIZE_STUCK_SECONDS, materializes them itself. Proves: CV2-05-017"""
    settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_STUCK_SECONDS": 5, "MATERIALIZE_SLOTS": 1}
    _burst(world, 3)
    MaterializationDue.objects.update(due_at=timezone.now() - timedelta(seconds=100))
    tasks._Holding(world.account.pk).refresh()  # what a live run does
    assert tasks.inbound_sweep()["materialized"] == 0 and not sent["wakes"].calls
    tasks._redis().delete(tasks._wake_key(world.account.pk))  # the run died: its key expired
    assert tasks.inbound_sweep()["materialized"] == 3  # due past the bound with no run alive: the backstop
    assert sent["wakes"].calls == [(world.account.pk, 0)]  # and a fresh run woken (it finds nothing left)
