"""The serving guard and gate fences, on real PostgreSQL with concurrent transactions on separate connections."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from connector.actors import Actor
from connector.choices import EpochState, GateMode
from connector.demo import build_world
from connector.errors import FenceStale, GateNotServing, TransitionRefused
from connector.models import AccountServingGate, AuditRecord
from connector.services import gates as gate_services
from connector.services import serving
from connector.services.guard import lock_serving
from tests.concurrency import backend_pid_waiting, start, wait_until
from tests.support import scaled
from tests import dbroles

ACTOR = Actor.system("test")


def guarded_write(account_id, **kwargs):
    """A production-shaped V2 write: the guard, then a row written in the same transaction."""
    with transaction.atomic():
        ctx = lock_serving(account_id=account_id, **kwargs)
        AuditRecord.objects.create(actor="probe", entity_type="probe", entity_id=str(account_id),
                                   action="guarded_write", fence=ctx.fence)
        return ctx


def probe_writes() -> int:
    return AuditRecord.objects.filter(entity_type="probe").count()


@pytest.mark.django_db
def test_guard_binds_the_exact_active_epoch_and_current_fence(world):
    """A write on a v2_serving gate binds the exact epoch ID, digest and current fence.
    Proves: CV2-03-014, CV2-03-015, CV2-03-016"""
    account = world.accounts[0]
    ctx = guarded_write(account.pk, epoch_id=world.active_epoch.epoch_id,
                        epoch_digest=bytes(world.active_epoch.digest), expected_fence=6)
    assert (ctx.epoch_id, ctx.epoch_digest, ctx.fence) == (world.active_epoch.epoch_id,
                                                          bytes(world.active_epoch.digest), 6)
    assert probe_writes() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("kwargs,error", [
    ({"expected_fence": 5}, FenceStale),
    ({"epoch_id": "w-epoch-2"}, GateNotServing),
    ({"epoch_digest": b"\x00" * 32}, GateNotServing),
])
def test_stale_fence_or_wrong_epoch_writes_nothing(world, kwargs, error):
    """A writer holding a stale fence, or bound to another epoch ID or digest, writes nothing.
    Proves: CV2-03-016, CV2-03-017, CV2-03-022"""
    with pytest.raises(error):
        guarded_write(world.accounts[0].pk, **kwargs)
    assert probe_writes() == 0


@pytest.mark.django_db
def test_halting_gate_refuses_writes(world):
    """After `v2_serving -> halting_v2` no production write passes the guard. Proves: CV2-03-009, CV2-03-017"""
    account = world.accounts[0]
    gate_services.gate_transition(account_id=account.pk, action="halt_v2", expected_fence=6, actor=ACTOR)
    with pytest.raises(GateNotServing, match="halting_v2"):
        guarded_write(account.pk)
    assert probe_writes() == 0


@pytest.mark.django_db
def test_corrupt_gate_naming_a_verified_epoch_writes_nothing(world):
    """A gate row corrupted to name a `verified` (never activated) epoch, with a correct digest and fence, still
    produces nothing: the guard locks and checks the epoch row itself (decision 16).
    Proves: CV2-03-019, CV2-03-022"""
    account = world.accounts[0]
    verified = world.verified_epoch
    assert verified.state == EpochState.VERIFIED
    with connection.cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE connector_accountservinggate SET epoch_id=%s, epoch_digest=%s WHERE account_id=%s",
                       [verified.pk, bytes(verified.digest), account.pk])
        cursor.execute("SET session_replication_role = origin")
        dbroles.admin_off(cursor)
    with pytest.raises(GateNotServing, match="verified"):
        guarded_write(account.pk, epoch_id=verified.epoch_id, epoch_digest=bytes(verified.digest))
    with pytest.raises(GateNotServing):
        guarded_write(account.pk)
    assert probe_writes() == 0


@pytest.mark.django_db
def test_gate_transition_with_stale_fence_is_refused(world):
    """A gate transition acting on an older fence changes nothing. Proves: CV2-03-013"""
    account = world.accounts[0]
    with pytest.raises(FenceStale):
        gate_services.gate_transition(account_id=account.pk, action="halt_v2", expected_fence=5, actor=ACTOR)
    gate = AccountServingGate.objects.get(account=account)
    assert (gate.mode, gate.fence) == (GateMode.V2_SERVING, 6)


@pytest.mark.django_db
def test_every_gate_transition_advances_the_fence_and_is_audited(world):
    """halt_v2, confirm_halted and resume_predecessor each advance the fence by one and write one audit row.
    Proves: CV2-03-009, CV2-03-010, CV2-03-011, CV2-03-013"""
    account = world.accounts[0]
    fence = 6
    for action, mode in (("halt_v2", "halting_v2"), ("confirm_halted", "v2_halted"),
                         ("resume_predecessor", "v2_serving")):
        gate = gate_services.gate_transition(account_id=account.pk, action=action, expected_fence=fence,
                                             actor=ACTOR)
        fence += 1
        assert (gate.mode, gate.fence) == (mode, fence)
        row = AuditRecord.objects.filter(action=f"gate_{action}").get()
        assert row.fence == fence and row.to_state == mode
    with pytest.raises(TransitionRefused):
        gate_services.gate_transition(account_id=account.pk, action="halt_v1", expected_fence=fence, actor=ACTOR)


@pytest.mark.django_db
def test_halt_blocker_keeps_gate_halting(world):
    """While a registered blocker (the open-permit set, once effects exists) reports anything,
    `halting_v2 -> v2_halted` is refused. Proves: CV2-03-010"""
    from connector import hooks

    account = world.accounts[0]
    gate_services.gate_transition(account_id=account.pk, action="halt_v2", expected_fence=6, actor=ACTOR)
    blocker = hooks.register_halt_blocker(lambda gate: ["1 open permit"] if gate.account_id == account.pk else [])
    try:
        with pytest.raises(TransitionRefused, match="1 open permit"):
            gate_services.gate_transition(account_id=account.pk, action="confirm_halted", expected_fence=7,
                                          actor=ACTOR)
    finally:
        hooks._HALT_BLOCKERS.remove(blocker)
    assert AccountServingGate.objects.get(account=account).mode == GateMode.HALTING_V2


# -- concurrency ---------------------------------------------------------------------------------------------

@pytest.fixture
def tx_world(transactional_db):
    return build_world("c-")


def _hold_gate_transition(account_id, action, fence, locked: threading.Event, release: threading.Event):
    """Run a gate transition but keep its transaction open until `release` is set."""
    def run():
        with transaction.atomic():
            gate = gate_services.gate_transition(account_id=account_id, action=action, expected_fence=fence,
                                                 actor=ACTOR)
            locked.set()
            assert release.wait(scaled(10))
            return gate.fence
    return run


@pytest.mark.django_db(transaction=True)
def test_two_transactions_changing_one_gate_serialize(tx_world):
    """Two concurrent transitions of the same gate on separate connections serialize on the row lock: the
    second waits for the first to commit, then sees the new fence and is refused as stale; exactly one
    transition and one audit row result. Proves: CV2-03-013, CV2-15-024"""
    account = tx_world.accounts[0]
    locked, release = threading.Event(), threading.Event()
    first = start(_hold_gate_transition(account.pk, "halt_v2", 6, locked, release), "first")
    assert locked.wait(scaled(10))
    second = start(lambda: gate_services.gate_transition(account_id=account.pk, action="halt_v2",
                                                         expected_fence=6, actor=ACTOR), "second")
    assert wait_until(lambda: len(backend_pid_waiting()) >= 1), "the second transaction never waited on the lock"
    assert second.is_alive()
    released_at = time.monotonic()  # the first commits only after this; the second cannot finish before it
    release.set()
    first.join(scaled(10))
    second.join(scaled(10))
    assert first.error is None and first.result == 7
    assert isinstance(second.error, FenceStale)
    assert second.finished_at >= released_at
    gate = AccountServingGate.objects.get(account=account)
    assert (gate.mode, gate.fence) == (GateMode.HALTING_V2, 7)
    assert AuditRecord.objects.filter(action="gate_halt_v2").count() == 1


@pytest.mark.django_db(transaction=True)
def test_writer_share_lock_and_transition_serialize(tx_world):
    """A guarded write holding the gate FOR SHARE blocks a concurrent halt until it commits (the write lands
    under the old fence); a write that starts after the halt commits is refused. Two writers of one account
    do not block each other. Proves: CV2-03-015, CV2-03-021, CV2-03-022"""
    account = tx_world.accounts[0]
    in_write, release = threading.Event(), threading.Event()

    def slow_write():
        with transaction.atomic():
            ctx = lock_serving(account_id=account.pk)
            AuditRecord.objects.create(actor="probe", entity_type="probe", entity_id="slow", action="w",
                                       fence=ctx.fence)
            in_write.set()
            assert release.wait(scaled(10))
            return ctx.fence

    writer = start(slow_write, "writer")
    assert in_write.wait(scaled(10))
    # a second writer of the same account is not blocked by the first (share locks)
    other = start(lambda: guarded_write(account.pk).fence, "writer-2")
    other.join(scaled(10))
    assert other.error is None and other.result == 6
    halter = start(lambda: gate_services.gate_transition(account_id=account.pk, action="halt_v2",
                                                         expected_fence=6, actor=ACTOR), "halter")
    assert wait_until(lambda: len(backend_pid_waiting()) >= 1)
    assert halter.is_alive(), "halt must wait for the writer holding the share lock"
    release.set()
    writer.join(scaled(10))
    halter.join(scaled(10))
    assert writer.error is None and writer.result == 6
    assert halter.error is None and halter.result.fence == 7
    with pytest.raises(GateNotServing):
        guarded_write(account.pk)
    assert AuditRecord.objects.filter(entity_type="probe").count() == 2


@pytest.mark.django_db(transaction=True)
def test_admission_racing_activation_binds_only_the_new_epoch(transactional_db):
    """While the first activation holds the epoch and gates, a guarded write waits; after the atomic switch it
    binds the newly active epoch and its fence, never writing before the switch. Proves: CV2-03-021, CV2-02-041"""
    from connector.demo import build_owners, walk_gates_to_validating

    world = build_owners("r-")
    epoch = serving.epoch_prepare_from_owners(epoch_id="r-epoch", configuration_generation_id=
                                              world.configuration.generation_id, actor=ACTOR)
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    walk_gates_to_validating(world, ACTOR)
    account = world.accounts[0]
    with pytest.raises(GateNotServing):
        guarded_write(account.pk)

    activated, release = threading.Event(), threading.Event()
    from connector import locks

    def activation():
        with transaction.atomic():
            locked = locks.epoch_for_update(epoch.pk)
            # the product's own set-based body (D-210): one UPDATE of every gate, one audit INSERT
            serving.activate_first_locked(epoch=locked, account_ids=[a.pk for a in world.accounts], actor=ACTOR,
                                          observed=bytes(locked.digest))
            activated.set()
            assert release.wait(scaled(10))

    activator = start(activation, "activation")
    assert activated.wait(scaled(10))
    writer = start(lambda: guarded_write(account.pk), "writer")
    assert wait_until(lambda: len(backend_pid_waiting()) >= 1)
    assert writer.is_alive()
    release.set()
    activator.join(scaled(10))
    writer.join(scaled(10))
    assert activator.error is None
    assert writer.error is None, writer.error
    assert (writer.result.epoch_id, writer.result.fence) == ("r-epoch", 6)


@pytest.mark.django_db(transaction=True)
def test_a_waiting_transition_is_not_starved_by_later_writers(tx_world):
    """Fair queueing on the gate: while a writer holds the gate and a halt waits for it, a writer arriving later
    queues behind the halt instead of jumping ahead (plain row share locks would let it in, and a steady stream
    of writers could starve the transition). The later writer then sees halting_v2 and writes nothing.
    Proves: CV2-03-015, CV2-03-021 (capacity: starvation bound, CV2-14)"""
    account = tx_world.accounts[0]
    in_write, release = threading.Event(), threading.Event()

    def slow_write():
        with transaction.atomic():
            lock_serving(account_id=account.pk)
            in_write.set()
            assert release.wait(scaled(10))

    first = start(slow_write, "writer-1")
    assert in_write.wait(scaled(10))
    halter = start(lambda: gate_services.gate_transition(account_id=account.pk, action="halt_v2",
                                                         expected_fence=6, actor=ACTOR), "halter")
    assert wait_until(lambda: len(backend_pid_waiting()) >= 1)
    late = start(lambda: guarded_write(account.pk), "writer-late")
    assert wait_until(lambda: len(backend_pid_waiting()) >= 2), "the late writer must queue behind the halt"
    assert late.is_alive()
    release.set()
    for worker in (first, halter, late):
        worker.join(scaled(10))
    assert first.error is None and halter.error is None and halter.result.fence == 7
    # The late writer was refused because it saw the halted gate: it ran after the halt committed. (Comparing
    # the threads' own finish times is not evidence: a thread may record its time after the other woke.)
    assert isinstance(late.error, GateNotServing)
    assert probe_writes() == 0


# -- one round trip, once per transaction (issue 18, D-199) -----------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_the_guard_locks_in_one_round_trip_once_per_transaction(tx_world, django_assert_num_queries):
    """The first guard of a transaction locks epoch and gate in one statement; later guards of the same account
    in the same transaction check the rows it holds without a round trip, each with its own expectations."""
    account = tx_world.accounts[0]
    with transaction.atomic():
        with django_assert_num_queries(1) as captured:
            ctx = lock_serving(account_id=account.pk)
        assert "connector_lock_serving" in captured.captured_queries[0]["sql"]
        assert "preimage" not in captured.captured_queries[0]["sql"]
        with django_assert_num_queries(0):
            again = lock_serving(account_id=account.pk, epoch_id=ctx.epoch_id, epoch_digest=ctx.epoch_digest,
                                 expected_fence=ctx.fence)
            with pytest.raises(FenceStale):
                lock_serving(account_id=account.pk, expected_fence=ctx.fence - 1)
            with pytest.raises(GateNotServing, match="writer bound to epoch"):
                lock_serving(account_id=account.pk, epoch_id="c-epoch-2")
        assert again == ctx
    with transaction.atomic(), django_assert_num_queries(1):
        lock_serving(account_id=account.pk)  # a new transaction locks again


@pytest.mark.django_db(transaction=True)
def test_a_guard_inside_a_rolled_back_savepoint_is_not_remembered(tx_world, django_assert_num_queries):
    """Rolling back a savepoint releases the locks taken inside it, so the next guard locks again."""
    account = tx_world.accounts[0]
    with transaction.atomic():
        with pytest.raises(RuntimeError):
            with transaction.atomic():
                lock_serving(account_id=account.pk)
                raise RuntimeError("roll back the savepoint")
        with django_assert_num_queries(1):
            lock_serving(account_id=account.pk)
        with transaction.atomic():  # a nested savepoint uses the outer transaction's locks
            with django_assert_num_queries(0):
                lock_serving(account_id=account.pk)
        with django_assert_num_queries(0):
            lock_serving(account_id=account.pk)


@pytest.mark.django_db
def test_a_gate_transition_in_the_same_transaction_forgets_the_guard(world):
    """A transaction that changes the gate after guarding it sees the new mode at its next guard."""
    account = world.accounts[0]
    with transaction.atomic():
        lock_serving(account_id=account.pk)
        gate_services.gate_transition(account_id=account.pk, action="halt_v2", expected_fence=6, actor=ACTOR)
        with pytest.raises(GateNotServing, match="halting_v2"):
            lock_serving(account_id=account.pk)
        assert lock_serving(account_id=account.pk, settling=True).fence == 7


def _epoch_locked_elsewhere(epoch_pk: int) -> bool:
    """Whether another transaction holds the epoch row locked (FOR UPDATE NOWAIT from a fresh connection)."""
    def probe():
        from django.db import OperationalError
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM connector_servingepoch WHERE id = %s FOR UPDATE NOWAIT", [epoch_pk])
            return False
        except OperationalError:
            return True
    worker = start(probe, "probe")
    worker.join(scaled(10))
    assert worker.error is None, worker.error
    return worker.result


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempts", [1, 2])
def test_a_lost_race_releases_the_old_epoch_and_retries_epoch_before_gate(tx_world, attempts):
    """The gate is re-pointed while a guard waits for the epoch it read: the guard's attempt releases that epoch's
    and the gate's locks (never holding the gate while it locks the new epoch) and starts again from the top; with
    no attempt left it reports the move and holds nothing."""
    from connector import locks

    account = tx_world.accounts[0]
    old, new = tx_world.active_epoch, tx_world.verified_epoch
    holding, release = threading.Event(), threading.Event()

    def repoint():
        with transaction.atomic(), connection.cursor() as cursor:
            dbroles.admin_on(cursor)
            cursor.execute("SELECT 1 FROM connector_servingepoch WHERE id = %s FOR UPDATE", [old.pk])
            holding.set()
            assert release.wait(scaled(10))
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute("UPDATE connector_accountservinggate SET epoch_id=%s, epoch_digest=%s WHERE account_id=%s",
                           [new.pk, bytes(new.digest), account.pk])

    locked, finish = threading.Event(), threading.Event()

    def guard():
        with transaction.atomic():
            row = locks.serving_for_share(account.pk, attempts=attempts)
            locked.set()
            assert finish.wait(scaled(10))
            return row

    mover = start(repoint, "repoint")
    assert holding.wait(scaled(10))
    writer = start(guard, "guard")
    assert wait_until(lambda: len(backend_pid_waiting()) >= 1), "the guard never waited for the old epoch"
    release.set()
    mover.join(scaled(10))
    assert mover.error is None, mover.error
    assert locked.wait(scaled(10))
    try:
        assert _epoch_locked_elsewhere(old.pk) is False, "the lost attempt kept the old epoch locked"
        assert _epoch_locked_elsewhere(new.pk) is (attempts == 2)
    finally:
        finish.set()
        writer.join(scaled(10))
    assert writer.error is None, writer.error
    if attempts == 2:
        assert (writer.result.outcome, writer.result.gate_epoch_pk, writer.result.epoch_id) == (
            "locked", new.pk, new.epoch_id)
    else:
        assert writer.result.outcome == "moved"
