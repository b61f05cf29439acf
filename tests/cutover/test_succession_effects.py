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
