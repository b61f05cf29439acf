"""Crash rows of V2 -> V2 successor activation, with real process kills (connector.faults): the activation
transaction either committed completely or not at all, and recovery follows the local barrier-set state
(`held` proves no commit; `activation_committed` requires readback before release)."""
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
    activates. Proves: CV2-11-057, CV2-11-044, CV2-11-049"""
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
