"""Transport admission of a new receipt in one statement (issue 18 goal 1; D-201, D-202): the hint the body is
parsed against is re-checked under the statement's locks, a stale hint is retried against the epoch the gate
names, a halted gate refuses with nothing written, and a same-key race still resolves on the unique constraint."""
from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from connector.actors import Actor
from connector.choices import GateMode
from connector.demo import DEMO_CHANNEL, build_world, demo_event_body
from connector.errors import GateNotServing
from connector.models import AccountServingGate, MaterializationDue, Receipt, ReceiptAdmissionKey
from connector.selectors import routes
from connector.services import admission as admission_services
from connector.services import gates as gate_services
from connector.services.admission import AdmissionHint, admission_hint_get, receipt_admit
from cutover.services import succession
from tests.concurrency import backend_pid_waiting, start, wait_until
from tests.cutover.succession_helpers import (
    WEBHOOK,
    build_succession_world,
    drain,
    halt_all,
    handoff_all,
    held_barrier,
    send,
)
from tests.connector.inbound_helpers import webhook_body, webhook_event
from tests.support import scaled

ACTOR = Actor.system("one-statement-test")


def rows() -> tuple[int, int, int]:
    return Receipt.objects.count(), ReceiptAdmissionKey.objects.count(), MaterializationDue.objects.count()


@pytest.fixture(autouse=True)
def fresh_hints():
    admission_services._HINTS.clear()
    yield
    admission_services._HINTS.clear()


@pytest.mark.django_db(transaction=True)
def test_a_warm_admission_is_one_statement_and_writes_the_three_rows(django_assert_num_queries):
    """With the account's hint known, a new receipt is one round trip (the statement commits on its own in
    autocommit) and it writes the Receipt, its key and its MaterializationDue bound to the exact locked epoch.
    Proves: CV2-05-003, CV2-03-015, CV2-03-016, STYLE R27"""
    world = build_world("o-")
    account = world.accounts[0]
    receipt_admit(account_key=account.account_key, channel=DEMO_CHANNEL, transport_key="warm-1",
                  body=demo_event_body("warm-1"), actor=ACTOR)
    with django_assert_num_queries(1):
        out = receipt_admit(account_key=account.account_key, channel=DEMO_CHANNEL, transport_key="warm-2",
                            body=demo_event_body("warm-2"), actor=ACTOR)
    assert out.outcome == "created"
    stored = Receipt.objects.get(pk=out.receipt.pk)
    gate = AccountServingGate.objects.get(account=account)
    assert (stored.epoch_id, bytes(stored.epoch_digest), stored.gate_fence) == (
        world.active_epoch.pk, bytes(world.active_epoch.digest), gate.fence)
    assert (stored.kind, stored.channel, bytes(stored.payload), stored.component_count) == (
        "transport", DEMO_CHANNEL, demo_event_body("warm-2"), 1)
    assert ReceiptAdmissionKey.objects.get(transport_key="warm-2").receipt_id == stored.pk
    assert MaterializationDue.objects.filter(receipt=stored).exists()
    assert out.receipt.epoch.epoch_id == world.active_epoch.epoch_id and out.receipt.created_at == stored.created_at


@pytest.mark.django_db(transaction=True)
def test_a_stale_hint_is_retried_and_binds_the_new_epoch(monkeypatch):
    """The process's hint names the predecessor epoch; a real successor activation re-points the gate. The
    statement refuses the stale hint (nothing written), the body is parsed again against the successor's route
    and the second statement binds the successor exactly. Proves: CV2-03-016, CV2-03-017, CV2-02-026,
    CV2-14-004"""
    world = build_succession_world("sh-")
    account = world.accounts[0]
    send(world, "evt-1", 1, account=account)  # admitted (the hint is now the predecessor) and materialized
    drain()
    assert admission_services._HINTS[account.account_key].epoch_pk == world.epoch.pk
    halt_all(world)
    barrier = held_barrier(world)
    handoff_all(world, barrier)
    succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert AccountServingGate.objects.get(account=account).epoch_id == world.successor.pk

    parsed, statements = [], []
    real_route, real_statement = routes.route_for, admission_services._admit_statement
    monkeypatch.setattr(admission_services, "route_for",
                        lambda **kw: parsed.append(kw["epoch_pk"]) or real_route(**kw))

    def counted(**kw):
        out = real_statement(**kw)
        statements.append((kw["hint"].epoch_pk, out.outcome, rows()))
        return out
    monkeypatch.setattr(admission_services, "_admit_statement", counted)
    before = rows()
    out = receipt_admit(account_key=account.account_key, channel=WEBHOOK, transport_key="after",
                        body=webhook_body(webhook_event("evt-2", "rec-1", 2)), actor=ACTOR)
    assert parsed == [world.epoch.pk, world.successor.pk]
    assert statements[0] == (world.epoch.pk, "refused", before)  # the stale attempt wrote nothing
    assert statements[1][:2] == (world.successor.pk, "created")
    stored = Receipt.objects.get(pk=out.receipt.pk)
    assert (out.outcome, stored.epoch_id, bytes(stored.epoch_digest)) == (
        "created", world.successor.pk, bytes(world.successor.digest))
    assert admission_services._HINTS[account.account_key].epoch_pk == world.successor.pk


@pytest.mark.django_db(transaction=True)
def test_a_gate_halting_between_hint_and_write_refuses_and_writes_nothing():
    """The hint is read while the gate serves; `halt_v2` commits before the statement: GATE_NOT_SERVING, no
    Receipt, key or work row. Proves: CV2-03-009, CV2-03-016, CV2-03-017, CV2-05-003"""
    world = build_world("hh-")
    account = world.accounts[0]
    hint = admission_hint_get(account.account_key)
    assert hint == AdmissionHint(account.pk, world.active_epoch.pk, bytes(world.active_epoch.digest))
    gate = AccountServingGate.objects.get(account=account)
    gate_services.gate_transition(account_id=account.pk, action="halt_v2", expected_fence=gate.fence, actor=ACTOR)
    before = rows()
    with pytest.raises(GateNotServing, match="halting_v2") as refused:
        receipt_admit(account_key=account.account_key, channel=DEMO_CHANNEL, transport_key="halted",
                      body=demo_event_body("halted"), actor=ACTOR, hint=hint)
    assert refused.value.code == "GATE_NOT_SERVING"
    assert rows() == before


@pytest.mark.django_db(transaction=True)
def test_an_admission_waiting_on_a_committing_halt_is_refused_and_writes_nothing():
    """A real concurrent session holds `halt_v2` (gate FOR UPDATE) uncommitted while an admission with a
    serving hint starts: the statement waits on the gate lock, sees `halting_v2` once the halt commits and writes
    nothing. Proves: CV2-03-015, CV2-03-016, CV2-15-024"""
    world = build_world("hw-")
    account = world.accounts[0]
    hint = admission_hint_get(account.account_key)
    fence = AccountServingGate.objects.get(account=account).fence
    locked, release = threading.Event(), threading.Event()

    def halt():
        with transaction.atomic():
            gate_services.gate_transition(account_id=account.pk, action="halt_v2", expected_fence=fence,
                                          actor=ACTOR)
            locked.set()
            assert release.wait(scaled(10))

    def admit():
        return receipt_admit(account_key=account.account_key, channel=DEMO_CHANNEL, transport_key="racing-halt",
                             body=demo_event_body("racing-halt"), actor=ACTOR, hint=hint)

    before = rows()
    halter = start(halt, "halt")
    assert locked.wait(scaled(10))
    writer = start(admit, "admit")
    assert wait_until(lambda: len(backend_pid_waiting()) >= 1), "the admission never waited for the halt"
    release.set()
    halter.join(scaled(10))
    writer.join(scaled(10))
    assert halter.error is None, halter.error
    assert isinstance(writer.error, GateNotServing), writer.error
    assert rows() == before
    assert AccountServingGate.objects.get(account=account).mode == GateMode.HALTING_V2


@pytest.mark.django_db(transaction=True)
def test_a_same_key_race_lost_on_the_unique_constraint_resolves_as_the_duplicate():
    """Two sessions admit one key: the first statement runs inside an open transaction (its key is inserted but
    not committed), so the second passes the key lookup and waits on the unique index; when the first commits,
    the second's whole statement fails on `connector_admissionkey_unique_key` and resolves as a duplicate of the
    winner. Exactly one Receipt, key and work row. Proves: CV2-05-001, CV2-05-004, CV2-15-001, CV2-15-024"""
    world = build_world("kr-")
    account = world.accounts[0]
    payload = demo_event_body("race")
    admission_hint_get(account.account_key)
    inserted, release = threading.Event(), threading.Event()

    def winner():
        with transaction.atomic():
            out = receipt_admit(account_key=account.account_key, channel=DEMO_CHANNEL, transport_key="race",
                                body=payload, actor=ACTOR)
            inserted.set()
            assert release.wait(scaled(10))
            return out

    def loser():
        connection.ensure_connection()
        return receipt_admit(account_key=account.account_key, channel=DEMO_CHANNEL, transport_key="race",
                             body=payload, actor=ACTOR)

    first = start(winner, "winner")
    assert inserted.wait(scaled(10))
    second = start(loser, "loser")
    assert wait_until(lambda: len(backend_pid_waiting()) >= 1), "the second admission never waited on the key"
    release.set()
    first.join(scaled(10))
    second.join(scaled(10))
    assert first.error is None and second.error is None, (first.error, second.error)
    assert first.result.outcome == "created"
    assert second.result.outcome == "duplicate" and second.result.receipt.pk == first.result.receipt.pk
    assert rows() == (1, 1, 1)
