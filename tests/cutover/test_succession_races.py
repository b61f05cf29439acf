"""Real concurrent transactions on separate connections: predecessor completion racing an OrderingHandoff, a
predecessor resume racing a handoff, and two coordinators acquiring the one barrier set of a predecessor."""
from __future__ import annotations

import threading
from unittest import mock

import pytest

from connector import locks as connector_locks
from connector.choices import ExecutionState, GateMode
from connector.errors import TransitionRefused
from connector.models import Execution, OrderingLane
from connector.services import execution
from connector.services import gates as gate_services
from cutover.errors import BarrierSetRefused, HandoffRefused
from cutover.models import OrderingHandoff, ServingPublicationBarrierSet
from cutover.services import succession
from tests.concurrency import start, wait_until
from tests.connector.inbound_helpers import advance_lanes, drain, waiting_in_this_database
from tests.cutover.succession_helpers import ACTOR, WEBHOOK, build_succession_world, halt_all, held_barrier, send
from tests.support import scaled

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tx_world(transactional_db):
    return build_succession_world("sr-")


def predecessor_lane(world) -> OrderingLane:
    return OrderingLane.objects.get(epoch=world.epoch, route=WEBHOOK, partition="rec-1")


def claimed_at_100(world):
    """Position 100 minted and claimed under the predecessor, then every gate halted and the barrier held."""
    send(world, "evt-100", 100)
    minted, = advance_lanes()
    token = execution.execution_claim(holder="w1")
    assert token.execution_pk == minted.pk
    halt_all(world)
    return token, held_barrier(world)


def test_completion_committing_first_is_in_the_frozen_high_water(tx_world):
    """The predecessor result transaction holds the lane when the handoff starts: the handoff waits on the lane
    row, then sees the completion and freezes high-water 100 with the lane fence after it; nothing advances the
    lane after the handoff fence. Proves: CV2-11-046, CV2-11-050, CV2-11-014"""
    token, barrier = claimed_at_100(tx_world)
    in_tx, release = threading.Event(), threading.Event()

    def pause(name):
        if name == "result.before_commit":
            in_tx.set()
            assert release.wait(scaled(15))

    with mock.patch.object(execution, "fault_point", pause):
        completion = start(lambda: execution.execution_run(token=token), "completion")
        assert in_tx.wait(scaled(15))
        lane_pk = predecessor_lane(tx_world).pk
        handoff = start(lambda: succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane_pk, actor=ACTOR),
                        "handoff")
        assert wait_until(lambda: waiting_in_this_database() >= 1)
        release.set()
        completion.join(scaled(20))
        handoff.join(scaled(20))
    assert completion.error is None and handoff.error is None
    assert completion.result.state == ExecutionState.COMPLETED
    frozen = predecessor_lane(tx_world)
    row = OrderingHandoff.objects.get()
    assert row.high_water == 100 == frozen.high_water
    assert row.predecessor_lane_fence == frozen.fence
    assert not Execution.objects.filter(lane=frozen, state__in=["ready", "waiting_dependency"]).exists()


def test_handoff_seeing_nonterminal_work_fails_and_the_completion_then_commits(tx_world):
    """The handoff holds the lane first and finds the claimed execution nonterminal: it fails and writes
    nothing; the completion waiting on the lane then commits (high-water 100), and a retried handoff freezes
    100. Proves: CV2-11-046, CV2-11-050"""
    token, barrier = claimed_at_100(tx_world)
    locked, release = threading.Event(), threading.Event()
    real_lane_for_update = connector_locks.lane_for_update

    def lane_for_update(pk, **kwargs):
        lane = real_lane_for_update(pk, **kwargs)
        if threading.current_thread().name == "handoff":
            locked.set()
            assert release.wait(scaled(15))
        return lane

    lane_pk = predecessor_lane(tx_world).pk
    with mock.patch.object(connector_locks, "lane_for_update", lane_for_update):
        handoff = start(lambda: succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane_pk, actor=ACTOR),
                        "handoff")
        assert locked.wait(scaled(15))
        completion = start(lambda: execution.execution_run(token=token), "completion")
        assert wait_until(lambda: waiting_in_this_database() >= 1)
        release.set()
        handoff.join(scaled(20))
        completion.join(scaled(20))
    assert isinstance(handoff.error, HandoffRefused)
    assert completion.error is None and completion.result.state == ExecutionState.COMPLETED
    assert not OrderingHandoff.objects.exists()
    assert not OrderingLane.objects.filter(epoch=tx_world.successor).exists()
    assert predecessor_lane(tx_world).high_water == 100
    retried = succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane_pk, actor=ACTOR)
    assert retried.high_water == 100


def test_predecessor_resume_racing_the_first_handoff_serializes_on_the_gate(tx_world):
    """A handoff holding the gates FOR SHARE makes a concurrent predecessor resume (FOR UPDATE) wait; once the
    handoff commits, the resume sees it and is refused: never a gate serving a frozen predecessor.
    Proves: CV2-11-020, CV2-11-051"""
    send(tx_world, "evt-1", 1)
    drain()
    halt_all(tx_world)
    barrier = held_barrier(tx_world)
    locked, release = threading.Event(), threading.Event()
    real_lane_for_update = connector_locks.lane_for_update

    def lane_for_update(pk, **kwargs):
        lane = real_lane_for_update(pk, **kwargs)
        if threading.current_thread().name == "handoff":
            locked.set()
            assert release.wait(scaled(15))
        return lane

    lane_pk = predecessor_lane(tx_world).pk
    account = tx_world.accounts[0]
    with mock.patch.object(connector_locks, "lane_for_update", lane_for_update):
        handoff = start(lambda: succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane_pk, actor=ACTOR),
                        "handoff")
        assert locked.wait(scaled(15))
        resume = start(lambda: gate_services.gate_transition(account_id=account.pk, action="resume_predecessor",
                                                             expected_fence=None, actor=ACTOR), "resume")
        assert wait_until(lambda: waiting_in_this_database() >= 1)
        release.set()
        handoff.join(scaled(20))
        resume.join(scaled(20))
    assert handoff.error is None
    assert isinstance(resume.error, TransitionRefused)
    account.serving_gate.refresh_from_db()
    assert account.serving_gate.mode == GateMode.V2_HALTED


def test_two_coordinators_acquire_at_most_one_barrier_set(tx_world):
    """Two coordinators acquiring a barrier set for the same predecessor at once: exactly one set exists, the
    other is refused. Proves: CV2-11-045, CV2-11-037"""
    go = threading.Event()

    def acquire(holder):
        def run():
            assert go.wait(scaled(10))
            return succession.barrier_set_acquire(predecessor_epoch_id=tx_world.epoch.epoch_id,
                                                  successor_epoch_id=tx_world.successor.epoch_id, holder=holder,
                                                  actor=ACTOR)
        return run

    workers = [start(acquire(f"coord-{i}"), f"coord-{i}") for i in range(4)]
    go.set()
    for w in workers:
        w.join(scaled(20))
    assert sum(w.error is None for w in workers) == 1
    refusals = [type(w.error).__name__ for w in workers if w.error is not None]
    assert refusals == [BarrierSetRefused.__name__] * 3, [repr(w.error) for w in workers]
    assert ServingPublicationBarrierSet.objects.count() == 1


def test_free_running_completions_and_handoffs_never_lose_a_result(tx_world):
    """Five partitions, each with a claimed execution; each completion and its lane's handoff start together on
    separate connections with no pause. Whatever the interleaving, every committed handoff holds its lane's
    completed position, a refused handoff leaves nothing behind, and after retrying every frozen high-water equals
    the completed position with the lane fence unchanged since. Proves: CV2-11-046, CV2-11-050"""
    records = [f"rec-{i}" for i in range(1, 6)]
    for i, record in enumerate(records, 1):
        send(tx_world, f"evt-{record}", 100 + i, record=record)
    advance_lanes()
    tokens = []
    while (token := execution.execution_claim(holder="w1")) is not None:
        tokens.append(token)
    assert len(tokens) == 5
    halt_all(tx_world)
    barrier = held_barrier(tx_world)
    lanes = {e.pk: e.lane_id for e in Execution.objects.filter(pk__in=[t.execution_pk for t in tokens])}
    outcomes = []
    for token in tokens:
        go = threading.Event()
        lane_pk = lanes[token.execution_pk]

        def completion(token=token):
            assert go.wait(scaled(10))
            return execution.execution_run(token=token)

        def handoff(lane_pk=lane_pk):
            assert go.wait(scaled(10))
            return succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane_pk, actor=ACTOR)

        workers = [start(completion, "completion"), start(handoff, "handoff")]
        go.set()
        for w in workers:
            w.join(scaled(20))
        c, h = workers
        assert c.error is None and c.result.state == ExecutionState.COMPLETED
        if h.error is None:
            outcomes.append("handoff after completion")
            assert h.result.high_water == OrderingLane.objects.get(pk=lane_pk).high_water
        else:
            assert isinstance(h.error, HandoffRefused), repr(h.error)
            outcomes.append("handoff refused")
            assert not OrderingHandoff.objects.filter(predecessor_lane_id=lane_pk).exists()
    for lane_pk in lanes.values():
        h = succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane_pk, actor=ACTOR)
        lane = OrderingLane.objects.get(pk=lane_pk)
        assert h.high_water == lane.high_water and h.predecessor_lane_fence == lane.fence
        assert h.high_water == Execution.objects.get(lane_id=lane_pk).projection.position
    assert len(outcomes) == 5
