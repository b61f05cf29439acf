"""Nonterminal predecessor outbound work blocks the successor activation (the demo push world)."""
from __future__ import annotations

import pytest

from connector.choices import EpochState, GateMode
from connector.demo import build_world
from connector.models import AccountServingGate
from connector.services import gates as gate_services
from cutover.errors import SuccessorActivationRefused
from cutover.services import succession
from effects.models import RemoteEffect
from tests.cutover.succession_helpers import ACTOR
from tests.effects.helpers import author


@pytest.mark.django_db
def test_a_prepared_predecessor_effect_blocks_successor_activation():
    """A command authored under the predecessor whose RemoteEffect is still `prepared` (no permit, so every gate
    can reach v2_halted) keeps its original epoch binding and refuses the successor activation; nothing moves.
    Proves: CV2-11-050, CV2-11-053, CV2-11-011, CV2-11-012"""
    world = build_world("se-", push=True)
    command = author(world.accounts[0])
    effect = RemoteEffect.objects.get(command=command)
    assert effect.state == "prepared" and command.epoch_id == world.active_epoch.pk
    for account in world.accounts:
        for action in ("halt_v2", "confirm_halted"):
            gate_services.gate_transition(account_id=account.pk, action=action, expected_fence=None, actor=ACTOR)
    row = succession.barrier_set_acquire(predecessor_epoch_id=world.active_epoch.epoch_id,
                                         successor_epoch_id=world.verified_epoch.epoch_id, holder="c", actor=ACTOR)
    row = succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=ACTOR)
    with pytest.raises(SuccessorActivationRefused, match=f"effect #{effect.pk} is prepared"):
        succession.successor_activate(barrier_set_pk=row.pk, expected_fence=row.fence, actor=ACTOR)
    world.active_epoch.refresh_from_db()
    assert world.active_epoch.state == EpochState.ACTIVE
    assert set(AccountServingGate.objects.filter(account__in=world.accounts).values_list("mode", "epoch_id")) == {
        (GateMode.V2_HALTED, world.active_epoch.pk)}
    command.refresh_from_db()
    assert command.epoch_id == world.active_epoch.pk


@pytest.mark.django_db
def test_an_open_predecessor_window_blocks_successor_activation():
    """An order-independent grouped window still open under the predecessor (no lane, so no handoff covers it)
    refuses the successor activation until it is sealed and its execution completes.
    Proves: CV2-11-011, CV2-11-012, CV2-11-050"""
    from connector.models import ProjectionWindow
    from tests.conformance.packs import PACK_A, PACK_B
    from tests.connector.inbound_helpers import deliver, drain, feed_body, feed_line
    from tests.cutover.succession_helpers import build_succession_world, halt_all, held_barrier

    world = build_succession_world("sw-", [PACK_A, PACK_B])
    deliver(world, "ledger.grouped", feed_body(feed_line("l-1", 1, "mem-1")))
    window = ProjectionWindow.objects.get(epoch=world.epoch)
    assert window.state == "open"
    halt_all(world)
    barrier = held_barrier(world)
    with pytest.raises(SuccessorActivationRefused, match=f"window #{window.pk}"):
        succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert drain() == []  # nothing claimable while halted: the window stays open, the activation stays refused
    with pytest.raises(SuccessorActivationRefused):
        succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
