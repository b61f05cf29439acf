"""Crash rows of V2 -> V2 successor activation, with real process kills (connector.faults): the activation
transaction either committed completely or not at all, and recovery follows the local barrier-set state
(`held` proves no commit; `activation_committed` requires readback before release). The drain phase before the
halt (D-315/D-316) is killed at its own two crash points and resumes from its durable state."""
from __future__ import annotations

import pytest

from connector.choices import EpochState, GateMode
from connector.models import AccountServingGate, ServingEpoch
from cutover.choices import BarrierSetState
from cutover.models import ServingPublicationBarrierSet
from cutover.services import succession
from tests.crash.support import DB, assert_killed
from tests.cutover.succession_helpers import (
    ACTOR,
    WEBHOOK,
    build_succession_world,
    drain,
    halt_all,
    handoff_all,
    held_barrier,
    send,
)

ACTIVATE_SCRIPT = """
from connector.actors import Actor
from cutover.services.succession import successor_activate
epoch = successor_activate(barrier_set_pk=ARGS["barrier"], expected_fence=ARGS["fence"],
                           actor=Actor.system("crash-child"))
emit(epoch=epoch.pk, state=epoch.state)
"""


def prepared(prefix: str):
    world = build_succession_world(prefix)
    send(world, "evt-100", 100)
    send(world, "evt-3", 3, record="rec-2", account=world.accounts[1])
    drain()
    halt_all(world)
    barrier = held_barrier(world)
    handoff_all(world, barrier)
    return world, barrier


def serving_view(world) -> tuple:
    epochs = dict(ServingEpoch.objects.filter(pk__in=[world.epoch.pk, world.successor.pk])
                  .values_list("pk", "state"))
    gates = set(AccountServingGate.objects.filter(account__in=world.accounts).values_list("mode", "epoch_id"))
    return epochs[world.epoch.pk], epochs[world.successor.pk], gates


@pytest.mark.django_db(**DB)
def test_crash_before_the_activation_commit_leaves_the_predecessor_halted(run_child):
    """The coordinator is SIGKILLed after writing every transition but before commit: the predecessor is still
    active, the successor verified, every gate v2_halted on the predecessor and the set `held`; the same set then
    activates. Proves: CV2-11-057, CV2-11-044"""
    world, barrier = prepared("ka-")
    assert_killed(run_child(ACTIVATE_SCRIPT, "succession.before_commit", barrier=barrier.pk, fence=barrier.fence))
    assert serving_view(world) == (EpochState.ACTIVE, EpochState.VERIFIED, {(GateMode.V2_HALTED, world.epoch.pk)})
    assert ServingPublicationBarrierSet.objects.get(pk=barrier.pk).state == BarrierSetState.HELD
    succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert serving_view(world) == (EpochState.DRAINING, EpochState.ACTIVE,
                                   {(GateMode.V2_SERVING, world.successor.pk)})


@pytest.mark.django_db(**DB)
def test_crash_after_the_activation_commit_reads_back_before_release(run_child):
    """SIGKILLed right after the activation committed: predecessor draining, successor active, every gate
    v2_serving on the successor, the set `activation_committed`; recovery is idempotent and releases only after
    readback. Proves: CV2-11-057, CV2-11-025, CV2-11-044"""
    world, barrier = prepared("kb-")
    assert_killed(run_child(ACTIVATE_SCRIPT, "succession.after_commit", barrier=barrier.pk, fence=barrier.fence))
    assert serving_view(world) == (EpochState.DRAINING, EpochState.ACTIVE,
                                   {(GateMode.V2_SERVING, world.successor.pk)})
    row = ServingPublicationBarrierSet.objects.get(pk=barrier.pk)
    assert row.state == BarrierSetState.ACTIVATION_COMMITTED
    assert succession.successor_activate(barrier_set_pk=row.pk, expected_fence=None, actor=ACTOR).pk == \
        world.successor.pk
    released = succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence,
                                              reason="readback verified", actor=ACTOR)
    assert released.state == BarrierSetState.RELEASED


DRAIN_OPEN_SCRIPT = """
from connector.actors import Actor
from cutover.services.succession_drain import succession_drain_open
drain = succession_drain_open(barrier_set_pk=ARGS["barrier"], actor=Actor.system("crash-child"))
emit(drain=drain.pk)
"""

DRAIN_COMPLETE_SCRIPT = """
from connector.actors import Actor
from cutover.services.succession_drain import succession_drain_complete
drain = succession_drain_complete(barrier_set_pk=ARGS["barrier"], expected_fence=None,
                                  actor=Actor.system("crash-child"))
emit(drain=drain.pk, state=drain.state)
"""


def _new_receipt(world, evt: str):
    from tests.connector.inbound_helpers import admit, webhook_body, webhook_event
    return admit(world, WEBHOOK, webhook_body(webhook_event(evt, "rec-7", 7)))


@pytest.mark.django_db(**DB)
def test_crash_while_opening_the_drain_leaves_roots_open_and_the_drain_reopens(run_child):
    """SIGKILLed with the drain row written (its roots lock held) but not committed: no drain exists, every gate
    is still v2_serving on the active predecessor and a new root is admitted (the crash released the roots lock);
    rerunning the phase opens the drain, which then refuses new roots and completes once the receipt admitted in
    between has drained. Proves: CV2-11-005"""
    from connector.errors import SuccessionRootsClosed
    from cutover.models import SuccessionDrain
    from cutover.services import succession_drain, succession_phases

    world = build_succession_world("kd-")
    barrier = held_barrier(world)
    assert_killed(run_child(DRAIN_OPEN_SCRIPT, "succession.drain_open_before_commit", barrier=barrier.pk))
    assert not SuccessionDrain.objects.exists()
    assert serving_view(world) == (EpochState.ACTIVE, EpochState.VERIFIED, {(GateMode.V2_SERVING, world.epoch.pk)})
    admitted = _new_receipt(world, "evt-before-reopen")
    row, inventory = succession_phases.drain_all(barrier_set=barrier, actor=ACTOR)
    assert row.state == "draining" and inventory.kinds["receipts awaiting materialization"] == (1, [admitted.pk])
    with pytest.raises(SuccessionRootsClosed):
        _new_receipt(world, "evt-after-reopen")
    from connector.services import materialize
    materialize.receipt_materialize(receipt_pk=admitted.pk)
    drain()
    assert succession_drain.succession_drain_complete(barrier_set_pk=barrier.pk, expected_fence=None,
                                                      actor=ACTOR).state == "drained"


@pytest.mark.django_db(**DB)
def test_crash_while_completing_the_drain_keeps_it_draining_under_v2_serving(run_child):
    """SIGKILLed with `draining -> drained` written but not committed: the drain is still `draining` (roots still
    refused), every gate v2_serving, the coordinator's halt still refused; rerunning the completion measures the
    inventory again and commits `drained`, after which the halt proceeds. Proves: CV2-11-005"""
    from connector.errors import SuccessionRootsClosed
    from cutover.errors import SuccessionNotDrained
    from cutover.models import SuccessionDrain
    from cutover.services import succession_drain, succession_phases

    world = build_succession_world("ke-")
    send(world, "evt-1", 1)
    drain()
    barrier = held_barrier(world)
    succession_drain.succession_drain_open(barrier_set_pk=barrier.pk, actor=ACTOR)
    assert_killed(run_child(DRAIN_COMPLETE_SCRIPT, "succession.drain_complete_before_commit", barrier=barrier.pk))
    assert SuccessionDrain.objects.get().state == "draining"
    assert serving_view(world) == (EpochState.ACTIVE, EpochState.VERIFIED, {(GateMode.V2_SERVING, world.epoch.pk)})
    with pytest.raises(SuccessionRootsClosed):
        _new_receipt(world, "evt-during-recovery")
    with pytest.raises(SuccessionNotDrained):
        succession_phases.halt_drained(barrier_set=barrier, actor=ACTOR)
    assert succession_drain.succession_drain_complete(barrier_set_pk=barrier.pk, expected_fence=None,
                                                      actor=ACTOR).state == "drained"
    assert succession_phases.halt_drained(barrier_set=barrier, actor=ACTOR).complete
    assert serving_view(world)[2] == {(GateMode.V2_HALTED, world.epoch.pk)}
