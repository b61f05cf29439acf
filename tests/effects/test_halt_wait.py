"""`halting_v2 -> v2_halted` confirmed by the last settlement (issue 20, goal 5; D-380..D-382): the transaction
that closes a permit of a halting gate NOTIFYs at its commit, `wait_halted` wakes on it, reads the open-permit set
without a lock and runs the locked confirm only when it reads empty. Real threads, each its own connection."""
from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from connector import hooks
from connector.errors import TransitionRefused
from connector.models import AccountServingGate, AuditRecord
from connector.services.halt_wait import wait_halted
from effects.models import DispatchPermit
from effects.services import dispatch, dispatch_batch
from effects.egress_batch import send_batch
from tests.concurrency import start
from tests.effects.helpers import ACTOR, acquire, author, build_push_world, gate_action, send
from tests.support import scaled


@pytest.fixture
def tx_push_world(transactional_db):
    return build_push_world()


def _waiter(account, **kwargs):
    return start(lambda: wait_halted(account_id=account.pk, actor=ACTOR, reason="test", **kwargs), "waiter")


def _mode(account) -> str:
    return AccountServingGate.objects.get(account=account).mode


@pytest.mark.django_db(transaction=True)
def test_the_confirm_follows_the_last_settlement_and_never_precedes_it(tx_push_world, receiver):
    """Two permits of one batch are open when the gate halts. The waiter, whose poll is 30 s (so only a
    notification can wake it in time), stays out while either is open: the first settlement (the batched path)
    wakes it, its unlocked read still finds one open permit and it runs no confirm; the gate stays `halting_v2`.
    The second permit is abandoned (holder proven isolated, the other closing path): the waiter confirms within a
    second, after that permit's closing, and `v2_halted` is audited once.
    Proves: CV2-11-007, CV2-11-008, CV2-03-010, CV2-03-018"""
    acme = tx_push_world.accounts[0]
    author(acme, root="w-1")
    author(acme, root="w-2")
    holder = dispatch.holder_register(holder_id="h-wait")
    first, second = dispatch_batch.effects_claim_batch(holder=holder, n=2, account_id=acme.pk)
    gate_action(acme, "halt_v2")
    waiter = _waiter(acme, poll_seconds=30.0, timeout=scaled(20.0))
    time.sleep(0.3)
    assert waiter.is_alive() and _mode(acme) == "halting_v2"

    send_batch(permits=[first], holder_id=holder.holder_id)  # settled by permits_settle_confirmed
    assert DispatchPermit.objects.get(pk=first.permit_pk).state == "returned"
    time.sleep(0.3)
    assert waiter.is_alive() and _mode(acme) == "halting_v2"

    dispatch.holder_terminate(holder_id="h-wait", evidence="supervisor: generation stopped", actor=ACTOR)
    began = time.monotonic()
    dispatch.permit_abandon(permit_pk=second.permit_pk, actor=ACTOR)
    waiter.join(scaled(5))
    assert not waiter.is_alive() and waiter.error is None, waiter.error
    assert waiter.finished_at - began < scaled(1.0)  # woken by the notification, not its 30 s poll
    assert waiter.result["gate"].mode == "v2_halted" and waiter.result["attempts"] == 1
    assert waiter.result["wakeups"] == 2
    closed = DispatchPermit.objects.get(pk=second.permit_pk).closed_at
    confirms = AuditRecord.objects.filter(action="gate_confirm_halted", entity_id=str(waiter.result["gate"].pk))
    assert confirms.count() == 1 and confirms.get().at >= closed


@pytest.mark.django_db(transaction=True)
def test_only_a_halting_gates_permit_closing_notifies(tx_push_world, receiver):
    """A permit settled while its gate serves notifies nothing (the hot path's commits stay unserialized by
    NOTIFY); one settled while the gate is `halting_v2` notifies the gate's pk once its transaction committed,
    marked `clear` when the closing statement saw no other open permit of the gate (the last one).
    Proves: CV2-11-007"""
    acme = tx_push_world.accounts[0]
    for root in ("n-1", "n-2", "n-3"):
        author(acme, root=root)
    gate_pk = AccountServingGate.objects.get(account=acme).pk
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k not in ("cursor_factory", "context")},
                         autocommit=True) as listener:
        listener.execute(f"LISTEN {hooks.HALT_DRAIN_CHANNEL}")
        send(acquire("h-n1", acme))
        assert list(listener.notifies(timeout=0.3)) == []
        first, last = acquire("h-n2", acme), acquire("h-n3", acme)
        gate_action(acme, "halt_v2")
        assert list(listener.notifies(timeout=0.1)) == []
        send(first)
        got = [(n.channel, n.payload) for n in listener.notifies(timeout=scaled(2.0), stop_after=1)]
        send(last)
        got += [(n.channel, n.payload) for n in listener.notifies(timeout=scaled(2.0), stop_after=1)]
    assert got == [(hooks.HALT_DRAIN_CHANNEL, str(gate_pk)), (hooks.HALT_DRAIN_CHANNEL, f"{gate_pk}:clear")]


@pytest.mark.django_db(transaction=True)
def test_a_lost_notification_leaves_the_waiter_to_its_poll_and_a_timeout_cancels_nothing(tx_push_world,
                                                                                        monkeypatch):
    """With the notification lost (the waiter listens on a channel nobody notifies), the waiter still confirms,
    by its poll; before that, its timeout ends the wait with `gate_transition`'s refusal and leaves the gate
    `halting_v2` with its permit open (no timeout-driven cancellation). Outside `halting_v2` it refuses at once.
    Proves: CV2-11-008, CV2-11-009"""
    acme = tx_push_world.accounts[0]
    author(acme)
    ready = acquire("h-lost", acme)
    with pytest.raises(TransitionRefused, match="not allowed from v2_serving"):
        wait_halted(account_id=acme.pk, actor=ACTOR)
    gate_action(acme, "halt_v2")
    monkeypatch.setattr(hooks, "HALT_DRAIN_CHANNEL", "connector_halt_drain_lost")
    with pytest.raises(TransitionRefused, match="open dispatch permit"):
        wait_halted(account_id=acme.pk, actor=ACTOR, timeout=0.2, poll_seconds=0.05)
    assert _mode(acme) == "halting_v2"
    assert DispatchPermit.objects.get(pk=ready.permit.pk).state == "granted"

    waiter = _waiter(acme, poll_seconds=0.05, timeout=scaled(10.0))
    time.sleep(0.2)
    assert waiter.is_alive()
    dispatch.holder_terminate(holder_id="h-lost", evidence="supervisor: generation stopped", actor=ACTOR)
    dispatch.permit_abandon(permit_pk=ready.permit.pk, actor=ACTOR)
    waiter.join(scaled(5))
    assert waiter.error is None, waiter.error
    assert waiter.result["gate"].mode == "v2_halted" and waiter.result["wakeups"] == 0


@pytest.mark.django_db(transaction=True)
def test_the_gate_lock_takes_the_fair_advisory_lock_before_the_row(tx_push_world):
    """`gate_for_update` takes the gate's advisory lock and its row lock in one statement (D-384), the advisory
    lock first: while a transition waits for the advisory lock, the gate row is not locked (another session
    locks it NOWAIT), so the fairness of the advisory queue is kept. Proves: CV2-11-007"""
    from connector.locks import ADVISORY_LOCK_KEYS

    acme = tx_push_world.accounts[0]
    params = connection.get_connection_params()
    conninfo = {k: v for k, v in params.items() if k not in ("cursor_factory", "context")}
    with psycopg.connect(**conninfo, autocommit=True) as holder, psycopg.connect(**conninfo) as probe:
        holder.execute("SELECT pg_advisory_lock_shared(%s, %s)", [ADVISORY_LOCK_KEYS["account_gate"], acme.pk])
        halter = start(lambda: gate_action(acme, "halt_v2"), "halter")
        time.sleep(0.3)
        assert halter.is_alive()
        probe.execute("SELECT 1 FROM connector_accountservinggate WHERE account_id = %s FOR UPDATE NOWAIT",
                      [acme.pk])
        probe.rollback()
        holder.execute("SELECT pg_advisory_unlock_shared(%s, %s)", [ADVISORY_LOCK_KEYS["account_gate"], acme.pk])
        halter.join(scaled(5))
    assert halter.error is None, halter.error
    assert _mode(acme) == "halting_v2"


# The confirm's statements (D-382, D-384): the advisory lock and the gate FOR UPDATE (one), the open-permit set
# (once: django-fsm's condition), the UPDATE, the audit INSERT, plus the SAVEPOINT and RELEASE this test's outer
# transaction turns BEGIN and COMMIT into. Main ran 9 (the advisory lock alone, the set read three times).
CONFIRM_STATEMENTS = 6


@pytest.mark.django_db
def test_a_confirm_that_succeeds_reads_the_open_permit_set_once(push_world, django_assert_num_queries):
    """A system actor's `confirm_halted` reads the open-permit set once, under the lock taken in one statement.
    Proves: CV2-11-007"""
    acme = push_world.accounts[0]
    gate_action(acme, "halt_v2")
    with django_assert_num_queries(CONFIRM_STATEMENTS):
        assert gate_action(acme, "confirm_halted").mode == "v2_halted"
