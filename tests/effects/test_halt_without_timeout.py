"""A planned V2 halt has no timeout: while an open permit (a possible provider effect whose holder is not proven
isolated) remains, the gate stays `halting_v2` however much time passes and whatever the sweepers do; the only
way on is forward remediation (isolate the holder, abandon or settle the permit), then `v2_halted`."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from connector.errors import TransitionRefused
from connector.models import AccountServingGate
from connector.services import sweeper
from effects.models import DispatchPermit
from effects.services import dispatch, worker
from tests.effects.helpers import ACTOR, acquire, author, gate_action


@pytest.mark.django_db
def test_a_halt_waits_for_its_open_permit_with_no_finite_timeout(push_world, monkeypatch):
    """A gate halting with a granted permit outstanding is still `halting_v2` after a year of sweeps: no sweeper
    cancels the halt, returns the gate to `v2_serving` or moves it to `v2_halted`, and `confirm_halted` is refused
    while the permit is open; the gate's only edge out of `halting_v2` is `v2_halted`. After the holder is proven
    isolated and the permit abandoned (forward remediation), the halt completes.
    Proves: CV2-11-009, CV2-11-010, CV2-13-006"""
    acme = push_world.accounts[0]
    author(acme)
    ready = acquire("h-halt", acme)
    gate_action(acme, "halt_v2")
    halting = AccountServingGate.objects.get(account=acme)
    assert halting.mode == "halting_v2"

    later = timezone.now() + timedelta(days=365)
    monkeypatch.setattr(timezone, "now", lambda: later)
    sweeper.serving_epoch_sweep()
    sweeper.inbound_sweep()
    worker.effects_sweep()
    with pytest.raises(TransitionRefused, match="open dispatch permit"):
        gate_action(acme, "confirm_halted")
    gate = AccountServingGate.objects.get(account=acme)
    assert (gate.mode, gate.fence) == ("halting_v2", halting.fence)
    assert DispatchPermit.objects.get(pk=ready.permit.pk).state == "granted"
    exits = {t.target for t in AccountServingGate._meta.get_field("mode").get_all_transitions(AccountServingGate)
             if t.source == "halting_v2"}
    assert exits == {"v2_halted"}
    monkeypatch.undo()

    dispatch.holder_terminate(holder_id="h-halt", evidence="supervisor: generation stopped, egress cut",
                              actor=ACTOR)
    assert dispatch.permit_abandon(permit_pk=ready.permit.pk, actor=ACTOR).state == "prepared"
    assert gate_action(acme, "confirm_halted").mode == "v2_halted"
