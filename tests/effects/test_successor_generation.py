"""A successor EffectGeneration is a separate intent, admitted only after the predecessor is proven no_effect."""
from __future__ import annotations

import pytest
from django.db import transaction

from connector.services.guard import lock_serving
from effects.errors import OutboundRefused
from effects.models import OutboundCommand, RemoteEffect
from effects.services import dispatch, outbound
from tests.effects.test_outbound_flow import test_smoke as run_flow


def _successor(world, command, generation="g2"):
    account = world.accounts[0]
    with transaction.atomic():
        ctx = lock_serving(account_id=account.pk)
        return outbound.outbound_successor_author(
            ctx=ctx, predecessor_command_id=command.pk, effect_generation_id=generation,
            body={"record_key": "r1", "display_name": "Ann"}, path_params={"record_key": "r1"},
            account_key=account.account_key)


@pytest.mark.django_db
def test_successor_only_after_proven_no_effect(push_world, receiver):
    """A finalized predecessor refuses a successor; after a predecessor ends terminal no_effect, the successor
    is admitted with explicit linkage and a new frozen binding; uncertain blocks. Proves: CV2-09 (replay and
    external effects), decision 12"""
    run_flow(push_world, receiver)
    first = OutboundCommand.objects.get()
    with pytest.raises(OutboundRefused, match="finalized"):
        _successor(push_world, first)
    # a second logical effect that the receiver refuses until the policy is exhausted: terminal no_effect
    receiver.default_mode = "refuse"
    with transaction.atomic():
        ctx = lock_serving(account_id=push_world.accounts[0].pk)
        other = outbound.outbound_command_author(
            ctx=ctx, account_key=push_world.accounts[0].account_key, application_scope="ops",
            effect_root_id="root-x", effect_slot_id="push:records.push", effect_generation_id="g1",
            push_contract="records.push", callout="records.callout", path_params={"record_key": "r9"},
            body={"record_key": "r9"}, suppress_external_effects=False)
    holder = dispatch.holder_register(holder_id="h-succ")
    from effects import egress
    from effects import egress_batch
    while RemoteEffect.objects.get(command=other).state == "prepared":
        claim = dispatch.effect_claim(holder=holder)
        permit = dispatch.permit_acquire(claim=claim)
        egress_batch.send(permit_pk=permit.pk, holder_id="h-succ", holder_fence=permit.holder_fence,
                    credential_gate_fence=permit.credential_gate_fence)
    assert RemoteEffect.objects.get(command=other).state == "no_effect"
    successor = _successor(push_world, other)
    assert successor.predecessor_id == other.pk and bytes(successor.predecessor_digest) == bytes(other.binding_digest)
    assert successor.effect_root_id == other.effect_root_id and successor.effect_generation_id == "g2"
    assert RemoteEffect.objects.get(command=successor).state == "prepared"
    with pytest.raises(OutboundRefused):
        _successor(push_world, other, generation="g1")


@pytest.mark.django_db
def test_supervisor_command_terminates_a_generation_and_abandons_its_permits(push_world, receiver):
    """`manage.py holders terminate ID --evidence ... --abandon` records termination (egress revoked) and
    abandons the generation's open permit: granted returns the effect to prepared. Proves: CV2-10-042, CV2-10-043"""
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    run_flow(push_world, receiver)
    with transaction.atomic():
        ctx = lock_serving(account_id=push_world.accounts[0].pk)
        outbound.outbound_command_author(
            ctx=ctx, account_key=push_world.accounts[0].account_key, application_scope="ops", effect_root_id="r-s",
            effect_slot_id="push:records.push", effect_generation_id="g1", push_contract="records.push",
            callout="records.callout", path_params={"record_key": "r5"}, body={"record_key": "r5"},
            suppress_external_effects=False)
    holder = dispatch.holder_register(holder_id="h-sup")
    permit = dispatch.permit_acquire(claim=dispatch.effect_claim(holder=holder))
    with pytest.raises(CommandError):
        call_command("holders", "terminate", "h-unknown", "--evidence", "x")
    out = io.StringIO()
    call_command("holders", "terminate", "h-sup", "--evidence", "pod deleted; egress policy revoked", "--abandon",
                 stdout=out)
    assert "abandoned" in out.getvalue()
    permit.refresh_from_db()
    assert permit.state == "abandoned" and permit.effect.state == "prepared"
