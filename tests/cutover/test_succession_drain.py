"""The drain phase of a V2 -> V2 successor activation (CV2-11-005, D-315/D-316) on real PostgreSQL: with the
attempt's barrier set held and every gate still `v2_serving` on the active predecessor, new roots of the
predecessor are refused (SUCCESSION_ROOTS_CLOSED) while continuation work of admitted roots completes; the drain
completes only when the inventory measured in the database is empty, and only then may the coordinator halt."""
from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from connector.choices import GateMode
from connector.errors import SuccessionRootsClosed
from connector.models import AuditRecord, Execution, Receipt
from connector.services import admission, materialize
from cutover.choices import SuccessionDrainState
from cutover.errors import SuccessionDrainRefused, SuccessionNotDrained
from cutover.models import SuccessionDrain
from cutover.services import succession, succession_drain, succession_phases
from tests.concurrency import backend_pid_waiting, start, wait_until
from tests.connector.inbound_helpers import admit, drain, webhook_body, webhook_event
from tests.cutover.succession_helpers import (
    ACTOR,
    WEBHOOK,
    build_succession_world,
    gate_modes,
    held_barrier,
    send,
)
from tests.support import scaled


def _admit_new(world, evt: str, position: int, **kwargs):
    return admit(world, WEBHOOK, webhook_body(webhook_event(evt, "rec-9", position)), **kwargs)


@pytest.mark.django_db
def test_drain_runs_under_v2_serving_then_the_coordinator_halts():
    """Phase order: with the barrier set held, the coordinator's halt is refused (SUCCESSION_NOT_DRAINED, every
    gate still v2_serving) until the drain is `drained`; the drain opens and completes with every gate
    `v2_serving` on the active predecessor, and only after its completion does any gate enter `halting_v2` (the
    audit trail orders them). Proves: CV2-11-005"""
    world = build_succession_world("dr-")
    send(world, "evt-1", 1)  # admitted and materialized: positions pending, no execution yet
    barrier = held_barrier(world)
    with pytest.raises(SuccessionNotDrained):
        succession_phases.halt_drained(barrier_set=barrier, actor=ACTOR)
    assert gate_modes(world) == {GateMode.V2_SERVING}
    row, inventory = succession_phases.drain_all(barrier_set=barrier, actor=ACTOR)
    assert row.state == SuccessionDrainState.DRAINING and not inventory.empty
    assert inventory.kinds["pending lane positions"][0] == 1
    assert gate_modes(world) == {GateMode.V2_SERVING}
    with pytest.raises(SuccessionNotDrained):
        succession_phases.halt_drained(barrier_set=barrier, actor=ACTOR)
    assert [e.state for e in drain()] == ["completed"]  # continuation under v2_serving, during the drain
    row, inventory = succession_phases.drain_all(barrier_set=barrier, actor=ACTOR)
    assert row.state == SuccessionDrainState.DRAINED and inventory.empty
    assert row.drained_inventory == {kind: 0 for kind in inventory.kinds}
    assert gate_modes(world) == {GateMode.V2_SERVING}  # drained while still serving
    outcome = succession_phases.halt_drained(barrier_set=barrier, actor=ACTOR)
    assert outcome.complete and gate_modes(world) == {GateMode.V2_HALTED}
    order = list(AuditRecord.objects.filter(action__in=["succession_drain_open", "succession_drain_complete",
                                                        "gate_halt_v2"]).order_by("pk").values_list("action",
                                                                                                  flat=True))
    assert order[:2] == ["succession_drain_open", "succession_drain_complete"]
    assert set(order[2:]) == {"gate_halt_v2"} and len(order) == 2 + len(world.accounts)


@pytest.mark.django_db
def test_a_new_root_is_refused_while_continuation_of_an_admitted_root_completes():
    """During the drain a new transport Receipt of the predecessor is refused with SUCCESSION_ROOTS_CLOSED and
    writes nothing (no Receipt, no admission key), on both admission paths; a Receipt admitted before the drain
    still materializes, its lane advances and its execution completes; the drain refuses to complete while that
    work is open and completes once it is terminal. Proves: CV2-11-005"""
    world = build_succession_world("dn-")
    waiting = _admit_new(world, "evt-1", 1)  # admitted before the drain, not yet materialized
    barrier = held_barrier(world)
    succession_drain.succession_drain_open(barrier_set_pk=barrier.pk, actor=ACTOR)
    with pytest.raises(SuccessionDrainRefused, match=f"receipts awaiting materialization \\(#{waiting.pk}\\)"):
        succession_drain.succession_drain_complete(barrier_set_pk=barrier.pk, expected_fence=None, actor=ACTOR)
    receipts = Receipt.objects.count()
    with pytest.raises(SuccessionRootsClosed) as refused:
        _admit_new(world, "evt-2", 2)  # the one-statement path (this process's hint is current)
    assert refused.value.code == "SUCCESSION_ROOTS_CLOSED"
    admission._HINTS.clear()
    with pytest.raises(SuccessionRootsClosed):
        _admit_new(world, "evt-3", 3, account=world.accounts[1])  # no hint: the ordered path
    assert Receipt.objects.count() == receipts
    # the continuation of the admitted root completes
    materialize.receipt_materialize(receipt_pk=waiting.pk)
    assert [e.state for e in drain()] == ["completed"]
    assert Execution.objects.get(epoch=world.epoch).state == "completed"
    row = succession_drain.succession_drain_complete(barrier_set_pk=barrier.pk, expected_fence=None, actor=ACTOR)
    assert row.state == SuccessionDrainState.DRAINED
    with pytest.raises(SuccessionRootsClosed):  # still closed once drained, until the set is released
        _admit_new(world, "evt-4", 4)


@pytest.mark.django_db
def test_a_new_root_outbound_command_is_refused_and_an_executions_command_is_authored():
    """In the push world: during the drain an OutboundCommand no Execution authored (a new business root) is
    refused with SUCCESSION_ROOTS_CLOSED, while the execution of a receipt admitted before the drain authors its
    command (continuation, `source_execution` set); that command's `prepared` effect keeps the drain open.
    Proves: CV2-11-005"""
    from connector.demo import build_world, demo_event_body
    from effects.models import OutboundCommand
    from tests.effects.helpers import author

    world = build_world("do-", push=True)
    account = world.accounts[0]
    receipt = admission.receipt_admit(account_key=account.account_key, channel="records.webhook",
                                      transport_key="before-drain", body=demo_event_body("t1"), actor=ACTOR).receipt
    row = succession.barrier_set_acquire(predecessor_epoch_id=world.active_epoch.epoch_id,
                                         successor_epoch_id=world.verified_epoch.epoch_id, holder="c", actor=ACTOR)
    row = succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=ACTOR)
    succession_drain.succession_drain_open(barrier_set_pk=row.pk, actor=ACTOR)
    with pytest.raises(SuccessionRootsClosed):
        author(account, root="new-root-during-drain")
    assert not OutboundCommand.objects.exists()
    materialize.receipt_materialize(receipt_pk=receipt.pk)
    assert [e.state for e in drain()] == ["completed"]
    command = OutboundCommand.objects.get()
    assert command.source_execution_id is not None and command.epoch_id == world.active_epoch.pk
    with pytest.raises(SuccessionDrainRefused, match="1 nonterminal remote effects"):
        succession_drain.succession_drain_complete(barrier_set_pk=row.pk, expected_fence=None, actor=ACTOR)


@pytest.mark.django_db
def test_release_reopens_roots_and_refusals_write_nothing():
    """The drain opens only under a held set with every gate v2_serving on the predecessor (a refusal writes no
    drain); releasing the barrier set (the abort) releases the drain and the predecessor admits new roots again.
    Proves: CV2-11-005"""
    from connector.services import gates as gate_services

    world = build_succession_world("dx-")
    row = succession.barrier_set_acquire(predecessor_epoch_id=world.epoch.epoch_id,
                                         successor_epoch_id=world.successor.epoch_id, holder="c", actor=ACTOR)
    with pytest.raises(SuccessionDrainRefused, match="acquiring"):
        succession_drain.succession_drain_open(barrier_set_pk=row.pk, actor=ACTOR)
    row = succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=ACTOR)
    gate_services.gate_transition(account_id=world.accounts[1].pk, action="halt_v2", expected_fence=None,
                                  actor=ACTOR)
    with pytest.raises(SuccessionDrainRefused, match="halting_v2"):
        succession_drain.succession_drain_open(barrier_set_pk=row.pk, actor=ACTOR)
    assert not SuccessionDrain.objects.exists()
    for action in ("confirm_halted", "resume_predecessor"):
        gate_services.gate_transition(account_id=world.accounts[1].pk, action=action, expected_fence=None,
                                      actor=ACTOR)
    succession_drain.succession_drain_open(barrier_set_pk=row.pk, actor=ACTOR)
    with pytest.raises(SuccessionRootsClosed):
        _admit_new(world, "evt-1", 1)
    row.refresh_from_db()
    succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence, reason="abort", actor=ACTOR)
    assert SuccessionDrain.objects.get().state == SuccessionDrainState.RELEASED
    assert _admit_new(world, "evt-1", 1).epoch_id == world.epoch.pk


@pytest.mark.django_db(transaction=True)
def test_a_root_crossing_the_barrier_when_the_drain_opens_commits_first_and_is_drained():
    """Real concurrent transactions: an admission that already inserted its Receipt (past the roots barrier) but
    has not committed makes the drain's opening wait; the receipt commits first and is in the drain's inventory,
    and an admission that starts after the drain committed is refused. Proves: CV2-11-005"""
    world = build_succession_world("dc-")
    barrier = held_barrier(world)
    inserted, release = threading.Event(), threading.Event()

    def crossing():
        with transaction.atomic():
            receipt = _admit_new(world, "evt-1", 1)
            inserted.set()
            assert release.wait(scaled(20))
        return receipt.pk

    admitter = start(crossing, "admission")
    assert inserted.wait(scaled(20))
    opener = start(lambda: succession_drain.succession_drain_open(barrier_set_pk=barrier.pk, actor=ACTOR), "drain")
    assert wait_until(lambda: len(backend_pid_waiting()) >= 1)  # the drain waits for the crossing admission
    assert opener.is_alive() and not SuccessionDrain.objects.exists()
    release.set()
    admitter.join(scaled(20))
    opener.join(scaled(20))
    assert admitter.error is None and opener.error is None
    assert admitter.finished_at <= opener.finished_at
    inventory = succession_drain.succession_drain_inventory(epoch_pk=world.epoch.pk)
    assert inventory.kinds["receipts awaiting materialization"] == (1, [admitter.result])
    with pytest.raises(SuccessionRootsClosed):
        _admit_new(world, "evt-2", 2)
    connection.close()
