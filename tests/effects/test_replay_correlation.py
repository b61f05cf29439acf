"""A replay preserves its predecessor's EffectRootID for correlation and mints no EffectGenerationID (D-309): the
replay-admission transaction records, through the connector's replay hook, the EffectRoots the predecessor event
authored (and, for a replay of a replay, the roots its predecessor replay correlated with); the replay's own
execution context is `suppress_external_effects` and authors no OutboundCommand, so no command, effect, attempt or
remote call results from it."""
from __future__ import annotations

import hashlib

import pytest

from connector.actors import Actor
from connector.models import Event, ReceiptComponent
from connector.selectors.serving import gate_get
from connector.services.replay import replay_request_admit, replay_request_settle
from effects import selectors
from effects.models import OutboundCommand, RemoteEffect, RemoteEffectAttempt, ReplayEffectCorrelation
from effects.services import worker
from tests.effects.helpers import refused_by
from tests.effects.test_outbound_flow import test_smoke as run_flow


def _replay(account, event: Event, request_id: str):
    component = ReceiptComponent.objects.get(event=event, disposition="event")
    gate = gate_get(account_id=account.pk)
    return replay_request_admit(
        account_key=account.account_key, request_id=request_id, target_epoch_id=gate.epoch.epoch_id,
        target_epoch_digest=bytes(gate.epoch_digest), predecessor_event_id=event.pk,
        predecessor_payload_digest=hashlib.sha256(bytes(component.payload)).digest(), reason="re-apply after restore",
        principal="ops-alice", mode="suppress_external_effects", actor=Actor.system("t")).request


def _minted() -> tuple[int, int, int, set[str]]:
    return (OutboundCommand.objects.count(), RemoteEffect.objects.count(), RemoteEffectAttempt.objects.count(),
            set(OutboundCommand.objects.values_list("effect_generation_id", flat=True)))


@pytest.mark.django_db
def test_a_replay_carries_the_predecessor_effect_root_and_mints_no_generation(push_world, receiver):
    """Event e1 was applied by Runtime, which authored one command (root `<command id>:r1`, generation g1) that
    the receiver applied and the worker finalized. A replay of e1 records, at its admission, that it correlates
    with that root, slot and generation; settled and followed by a dispatch sweep it authors nothing: still one
    command, one effect, one attempt, the one generation g1, one request at the receiver. A replay of the
    replay's derived event carries the same root through the lineage, again minting nothing. The correlation is
    append-only in PostgreSQL. Proves: CV2-09-019"""
    acme = push_world.accounts[0]
    run_flow(push_world, receiver)
    original = OutboundCommand.objects.get()
    assert original.effect_root_id.endswith(":r1") and original.source_execution_id is not None
    before = _minted()
    event = Event.objects.get(replay_request__isnull=True)
    first = _replay(acme, event, "rr-1")
    expected = [(original.effect_root_id, original.effect_slot_id, "g1")]
    assert selectors.replay_effect_roots(replay_request_pk=first.pk) == expected
    assert replay_request_settle(request_pk=first.pk)
    while worker.effect_dispatch_once(holder_name="h-replay", account_id=acme.pk):
        pass
    assert _minted() == before and before[3] == {"g1"}
    assert len(receiver.requests) == 1 and receiver.applied_total() == 1

    derived = Event.objects.get(replay_request=first)
    assert derived.predecessor_id == event.pk
    second = _replay(acme, derived, "rr-2")
    assert selectors.replay_effect_roots(replay_request_pk=second.pk) == expected
    assert replay_request_settle(request_pk=second.pk)
    assert _minted() == before and len(receiver.requests) == 1
    assert ReplayEffectCorrelation.objects.filter(predecessor_command=original).count() == 2
    row = ReplayEffectCorrelation.objects.filter(replay_request=first).get()
    assert refused_by("UPDATE effects_replayeffectcorrelation SET effect_root_id = 'x' WHERE id = %s",
                      [row.pk]) == "effects_replayeffectcorrelation_append_only"


@pytest.mark.django_db
def test_a_replay_that_executes_runs_runtime_without_minting_a_generation(push_world, receiver):
    """e1 is applied and pushed (g1). Runtime fails e2 (its execution is quarantined RESULT_FAILED and authors
    nothing). A replay of e2 runs Runtime again under the replay's generation and applies the change, but its
    execution context is `suppress_external_effects`: no OutboundCommand is authored, so no EffectGenerationID is
    minted and the receiver sees nothing new; the replay correlates with no root, since e2 authored none.
    Proves: CV2-09-019"""
    import json
    from unittest import mock

    from connector.models import CrmRecord, Execution
    from connector.services import admission, execution, materialize, runtime

    acme = push_world.accounts[0]
    run_flow(push_world, receiver)
    before = _minted()
    body = json.dumps({"events": [{"id": "e2", "type": "t", "record_id": "r1", "sequence": 2,
                                   "occurred_at": "2026-01-01T00:00:01Z",
                                   "data": {"name": "Bea", "email": "bea@example.com"}}]}).encode()
    adm = admission.receipt_admit(account_key=acme.account_key, channel="records.webhook", transport_key="k2",
                                  body=body, actor=Actor.system("t"))
    for lane in materialize.receipt_materialize(receipt_pk=adm.receipt.pk).lanes:
        execution.lane_advance(lane_pk=lane)
    with mock.patch.object(runtime, "_apply_record", return_value="failed"):
        execution.execution_run(token=execution.execution_claim(holder="w"))
    assert Execution.objects.filter(quarantine_reason="RESULT_FAILED").count() == 1
    request = _replay(acme, Event.objects.get(source_event_key="e2", replay_request__isnull=True), "rr-e2")
    assert replay_request_settle(request_pk=request.pk)
    rerun = Execution.objects.get(projection__event__replay_request=request)
    if rerun.state != "completed":
        execution.execution_run(token=execution.execution_claim(holder="w"))
    rerun.refresh_from_db()
    assert rerun.state == "completed"
    assert CrmRecord.objects.get(record_key="r1").fields["display_name"] == "Bea"
    while worker.effect_dispatch_once(holder_name="h-replay", account_id=acme.pk):
        pass
    assert _minted() == before and len(receiver.requests) == 1
    assert selectors.replay_effect_roots(replay_request_pk=request.pk) == []
