import json

import pytest

from connector.actors import Actor
from connector.services import admission, execution, materialize
from effects import egress
from effects import egress_batch
from effects.models import DispatchPermit, OutboundCommand, RemoteEffect
from effects.services import dispatch


@pytest.mark.django_db
def test_smoke(push_world, receiver):
    """End to end: an admitted event's Runtime transaction authors one command; one claim, one permit, one
    request through the sole egress adapter, settlement and finalization with a RemoteLink; the receiver applied
    the effect once. Proves: CV2-10-001, CV2-10-014, CV2-10-037, CV2-10-038, CV2-10-041, CV2-10-045"""
    body = json.dumps({"events": [{"id": "e1", "type": "t", "record_id": "r1", "sequence": 1,
                                   "occurred_at": "2026-01-01T00:00:00Z",
                                   "data": {"name": "Ann", "email": "ann@example.com"}}]}).encode()
    adm = admission.receipt_admit(account_key=push_world.accounts[0].account_key, channel="records.webhook",
                                  transport_key="k", body=body, actor=Actor.system("t"))
    out = materialize.receipt_materialize(receipt_pk=adm.receipt.pk)
    for lane in out.lanes:
        execution.lane_advance(lane_pk=lane)
    execution.execution_run(token=execution.execution_claim(holder="w"))
    assert OutboundCommand.objects.count() == 1
    holder = dispatch.holder_register(holder_id="h1")
    claim = dispatch.effect_claim(holder=holder)
    permit = dispatch.permit_acquire(claim=claim)
    effect = egress_batch.send(permit_pk=permit.pk, holder_id="h1", holder_fence=permit.holder_fence,
                         credential_gate_fence=permit.credential_gate_fence)
    effect = dispatch.effect_finalize(effect_pk=effect.pk, owner_slot="r1")
    assert effect.state == "finalized"
    assert receiver.applied_total() == 1
    assert DispatchPermit.objects.get().state == "returned"
    assert RemoteEffect.objects.get().state == "finalized"
