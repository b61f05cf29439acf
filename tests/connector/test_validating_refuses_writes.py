"""`v2_validating` is a pre-activation mode: the candidate epoch is verified and every gate names no active
epoch, so no production V2 path may write, claim or reach the provider until the first activation commits."""
from __future__ import annotations

import pytest
from django.db import transaction

from connector.actors import Actor
from connector.choices import GateMode
from connector.demo import DEMO_CHANNEL, build_owners, walk_gates_to_validating
from connector.errors import GateNotServing, TransitionRefused
from connector.models import AccountServingGate, AuditRecord, Execution, Receipt
from connector.services import admission, execution, gates, serving
from connector.services.guard import lock_serving
from effects.models import DispatchPermit, OutboundCommand, RemoteEffect
from effects.services import dispatch, worker
from tests.effects.helpers import author

ACTOR = Actor.system("test")


def validating_world(prefix: str):
    """Owners, a `verified` candidate epoch, and every gate walked to `v2_validating`; nothing activated."""
    world = build_owners(prefix, actor=ACTOR, push=True)
    epoch = serving.epoch_prepare_from_owners(epoch_id=f"{prefix}epoch-1",
                                              configuration_generation_id=world.configuration.generation_id,
                                              actor=ACTOR)
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    walk_gates_to_validating(world, ACTOR)
    return world, epoch


@pytest.mark.django_db
def test_v2_validating_refuses_every_production_write_claim_and_provider_call():
    """With every gate `v2_validating` and the candidate epoch `verified`: the serving guard, admission and
    outbound authoring are refused with GateNotServing; the execution and effect claimants and the effect
    dispatcher find nothing and write nothing; no Receipt, Execution, OutboundCommand, RemoteEffect or
    DispatchPermit exists, and only the gate walk is audited. Proves: CV2-12-094, CV2-12-007"""
    world, _ = validating_world("val-")
    acme = world.accounts[0]
    assert set(AccountServingGate.objects.values_list("mode", flat=True)) == {GateMode.V2_VALIDATING}
    audited = AuditRecord.objects.count()

    with pytest.raises(GateNotServing, match="v2_validating"), transaction.atomic():
        lock_serving(account_id=acme.pk)
    with pytest.raises(GateNotServing, match="v2_validating"):
        admission.receipt_admit(account_key=acme.account_key, channel=DEMO_CHANNEL, transport_key="val-1",
                                body=b'{"any": "body"}', actor=ACTOR)
    with pytest.raises(GateNotServing, match="v2_validating"):
        author(acme)
    holder = dispatch.holder_register(holder_id="val-holder")
    assert dispatch.effect_claim(holder=holder, account_id=acme.pk) is None
    assert execution.execution_claim(holder="val-holder", account_id=acme.pk) is None
    assert worker.effect_dispatch_once(holder_name="val-holder", account_id=acme.pk) is None

    assert [m.objects.count() for m in (Receipt, Execution, OutboundCommand, RemoteEffect, DispatchPermit)] == \
        [0, 0, 0, 0, 0]
    assert AuditRecord.objects.count() - audited <= 1  # at most the holder's registration, never a V2 write


@pytest.mark.django_db
def test_v2_validating_reaches_v2_serving_only_through_the_first_activation():
    """No gate action moves a `v2_validating` gate to `v2_serving` (the binding transition is not an operator
    action); only the atomic first activation does, for every gate at once, on the verified epoch.
    Proves: CV2-03-008"""
    world, epoch = validating_world("v2s-")
    acme = world.accounts[0]
    for action in ("activate_first", "resume_predecessor"):
        with pytest.raises(TransitionRefused):
            gates.gate_transition(account_id=acme.pk, action=action, expected_fence=None, actor=ACTOR,
                                  reason="test")
    assert set(AccountServingGate.objects.values_list("mode", flat=True)) == {GateMode.V2_VALIDATING}
    serving.epoch_activate_first(epoch_pk=epoch.pk, actor=ACTOR)
    assert set(AccountServingGate.objects.values_list("mode", "epoch_id")) == {(GateMode.V2_SERVING, epoch.pk)}
