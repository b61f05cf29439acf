"""A replay whose predecessor is a V1-accepted item (decision D-331): the typed V1 predecessor ref carries the
protocol version, the V1 Receipt/Event/WorkItem identities, the original V1 epoch and the payload/result digests;
it is admitted only when it matches the account's V1 acceptance tombstone exactly, is stored as immutable
evidence that nothing owns or claims through, and its V1 epoch is evidence only: every descendant executes under
the V2 epoch that admitted the replay (CV2-09-002, CV2-09-014)."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from django.db import IntegrityError, connection, transaction

from connector.choices import ExecutionState
from connector.models import (
    AccountServingGate,
    Event,
    Execution,
    Projection,
    Receipt,
    ReplayRequest,
    ServingEpoch,
    V1AcceptanceTombstone,
    V1PredecessorRef,
)
from connector.services import materialize
from connector.services.replay import ReplayMismatch, replay_request_admit
from connector.services.replay_v1 import (
    V1_REF_PROTOCOL,
    ReplayPredecessorInvalid,
    ReplayV1PredecessorUnknown,
    V1Predecessor,
)
from connector.services.tombstones import tombstones_import
from tests import dbroles
from tests.connector.inbound_helpers import ACTOR, build_inbound_world, drain, snapshot, webhook_event
from tests.connector.test_replay import PACKS, SNAPSHOT, counts

V1_BYTES = json.dumps(webhook_event("v1-evt-7", "rec-7", 1, full_name="Grace Hopper")).encode()
V1_DIGEST = hashlib.sha256(V1_BYTES).digest()
RESULT_DIGEST = hashlib.sha256(b"v1 result evidence of work item 7").digest()
V1_EPOCH = "v1:release:v1-release-2026.12"


@pytest.fixture
def world(db):
    world = build_inbound_world("rv1-", PACKS)
    tombstones_import(rows=[{"account": world.account.account_key, "channel": SNAPSHOT, "transport_key": "v1-key-7",
                             "payload_digest": V1_DIGEST, "predecessor_ref": "v1:workitem:7"}], actor=ACTOR)
    return world


def v1_ref(**change) -> V1Predecessor:
    return dataclasses.replace(V1Predecessor(
        protocol_version=V1_REF_PROTOCOL, receipt_channel=SNAPSHOT, receipt_transport_key="v1-key-7",
        event_id="v1:event:7", work_item_id="v1:workitem:7", original_epoch=V1_EPOCH, payload_digest=V1_DIGEST,
        result_digest=RESULT_DIGEST, payload=V1_BYTES), **change)


def replay_v1(world, request_id: str = "replay-v1-1", ref: V1Predecessor | None = None, **kwargs):
    return replay_request_admit(
        account_key=world.account.account_key, request_id=request_id, target_epoch_id=world.epoch.epoch_id,
        target_epoch_digest=bytes(world.epoch.digest), v1_predecessor=ref or v1_ref(),
        reason=kwargs.get("reason", "re-apply a V1 item after the upgrade"), principal="ops-alice",
        mode="suppress_external_effects", actor=ACTOR)


def test_v1_predecessor_ref_is_typed_read_only_evidence_never_an_owner(world):
    """The admitted ref carries the protocol version, the V1 Receipt (channel, transport key), Event and
    WorkItem identities, the original V1 epoch, the payload and result digests, under a request that binds the
    reason and the authorizing principal; the same request ID with the same ref is a duplicate, any changed
    evidence (the result digest) a mismatch. The ref is immutable in the database (even the administrator's
    UPDATE is refused), has no state, lease, fence or owner column, and no model relates to it except its
    ReplayRequest and the replay's Events, which record it as lineage: no lane, projection or execution is owned
    through it. Proves: CV2-09-002"""
    first = replay_v1(world)
    ref = first.request.v1_predecessor
    assert first.outcome == "created" and first.request.predecessor_event_id is None
    assert (ref.protocol_version, ref.v1_receipt_channel, ref.v1_receipt_transport_key, ref.v1_event_id,
            ref.v1_work_item_id, ref.original_epoch, bytes(ref.payload_digest), bytes(ref.result_digest)) == (
        V1_REF_PROTOCOL, SNAPSHOT, "v1-key-7", "v1:event:7", "v1:workitem:7", V1_EPOCH, V1_DIGEST, RESULT_DIGEST)
    assert ref.tombstone == V1AcceptanceTombstone.objects.get()
    assert (first.request.reason, first.request.principal) == ("re-apply a V1 item after the upgrade", "ops-alice")
    assert (bytes(first.receipt.payload), first.receipt.channel) == (V1_BYTES, SNAPSHOT)
    assert replay_v1(world).outcome == "duplicate"
    before = counts()
    with pytest.raises(ReplayMismatch):
        replay_v1(world, ref=v1_ref(result_digest=hashlib.sha256(b"other result").digest()))
    assert counts() == before and V1PredecessorRef.objects.count() == 1

    with dbroles.as_admin(), pytest.raises(IntegrityError) as info, transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute("UPDATE connector_v1predecessorref SET original_epoch = 'v1:release:other' WHERE id = %s",
                       [ref.pk])
    assert info.value.__cause__.diag.constraint_name == "connector_v1predecessorref_immutable"
    columns = {f.name for f in V1PredecessorRef._meta.concrete_fields}
    assert not columns & {"state", "lease_until", "lease_holder", "holder", "fence", "claimed_by", "owner"}
    from django.apps import apps
    relations = sorted(f"{m._meta.label}.{f.name}" for m in apps.get_models() for f in m._meta.get_fields()
                       if f.concrete and f.is_relation and f.related_model is V1PredecessorRef)
    assert relations == ["connector.Event.v1_predecessor", "connector.ReplayRequest.v1_predecessor"]


@pytest.mark.parametrize("change, refusal", [
    ({"protocol_version": "nexuscrm.connector.v1-predecessor-ref.v0"}, ReplayPredecessorInvalid),
    ({"work_item_id": "v1:receipt:7"}, ReplayPredecessorInvalid),
    ({"event_id": "v1:event:8"}, ReplayPredecessorInvalid),  # not the same V1 item as the work item
    ({"event_id": "v1:event:07"}, ReplayPredecessorInvalid),  # not canonical
    ({"receipt_transport_key": " v1-key-7"}, ReplayPredecessorInvalid),
    ({"original_epoch": "epoch-1"}, ReplayPredecessorInvalid),  # a V2-shaped epoch is never a V1 original epoch
    ({"original_epoch": "v1:release:"}, ReplayPredecessorInvalid),
    ({"result_digest": b"\x00" * 31}, ReplayPredecessorInvalid),
    ({"payload": V1_BYTES + b" "}, ReplayPredecessorInvalid),  # the bytes are not the authorized ones
    ({"receipt_transport_key": "v1-key-8"}, ReplayV1PredecessorUnknown),
    ({"receipt_channel": "records.webhook"}, ReplayV1PredecessorUnknown),
    ({"work_item_id": "v1:workitem:8", "event_id": "v1:event:8"}, ReplayV1PredecessorUnknown),
    ({"payload": b"{}", "payload_digest": hashlib.sha256(b"{}").digest()}, ReplayV1PredecessorUnknown),
], ids=["protocol", "work-item-form", "event-of-another-item", "event-noncanonical", "key-noncanonical",
        "epoch-not-v1", "epoch-empty", "result-digest-short", "bytes-mismatch", "unknown-key", "other-channel",
        "other-work-item", "other-payload"])
def test_malformed_or_unknown_v1_predecessor_is_refused_and_writes_nothing(world, change, refusal):
    """A V1 ref whose protocol, identities, epoch, digests or bytes are not canonical and consistent is
    REPLAY_PREDECESSOR_INVALID; a well-formed one that matches no V1 acceptance tombstone of the account exactly
    (V1 Receipt, WorkItem, authorized payload digest) is REPLAY_V1_PREDECESSOR_UNKNOWN. Nothing is written.
    Proves: CV2-09-002"""
    before = counts()
    with pytest.raises(refusal) as info:
        replay_v1(world, ref=v1_ref(**change))
    assert info.value.code == refusal.code
    assert counts() == before and not V1PredecessorRef.objects.exists()


def test_both_or_neither_predecessor_form_is_refused(world):
    """A replay names exactly one predecessor: a V2 Event or a V1 ref. Proves: CV2-09-002"""
    with pytest.raises(ReplayPredecessorInvalid):
        replay_request_admit(account_key=world.account.account_key, request_id="r-none",
                             target_epoch_id=world.epoch.epoch_id, target_epoch_digest=bytes(world.epoch.digest),
                             reason="x", principal="ops-alice", mode="suppress_external_effects", actor=ACTOR)
    with pytest.raises(ReplayPredecessorInvalid):
        replay_request_admit(account_key=world.account.account_key, request_id="r-both",
                             target_epoch_id=world.epoch.epoch_id, target_epoch_digest=bytes(world.epoch.digest),
                             predecessor_event_id=1, predecessor_payload_digest=V1_DIGEST, v1_predecessor=v1_ref(),
                             reason="x", principal="ops-alice", mode="suppress_external_effects", actor=ACTOR)
    assert not ReplayRequest.objects.exists()


def test_the_v1_epoch_is_evidence_only_descendants_execute_under_the_serving_v2_epoch(world):
    """The replay of a V1 item runs: its Receipt, Event, Projection, lane and Execution carry the V2 epoch the
    admission locked (the account's serving epoch), never the V1 epoch the ref names, which is no ServingEpoch at
    all; the replay Event records the ref as lineage (and no V2 predecessor); the execution completes with external
    effects suppressed; the tombstone stays byte-identical. The database refuses a ref whose original epoch is not
    a V1 identity, and an Event of a replay without any predecessor. Proves: CV2-09-014"""
    tombstone = snapshot(V1AcceptanceTombstone.objects.get())
    admitted = replay_v1(world)
    materialize.receipt_materialize(receipt_pk=admitted.receipt.pk)
    drain()
    assert AccountServingGate.objects.get(account=world.account).epoch_id == world.epoch.pk  # the serving epoch
    event = Event.objects.get(replay_request=admitted.request)
    execution = Execution.objects.get(projection__event=event)
    projection = Projection.objects.get(event=event)
    assert (event.v1_predecessor_id, event.predecessor_id, event.source_event_key) == (
        admitted.request.v1_predecessor_id, None, "v1-evt-7")
    assert {admitted.request.target_epoch_id, admitted.receipt.epoch_id, event.epoch_id, projection.epoch_id,
            execution.epoch_id} == {world.epoch.pk}
    assert execution.state == ExecutionState.COMPLETED and projection.suppress_external_effects
    assert not ServingEpoch.objects.filter(epoch_id=V1_EPOCH).exists()
    assert not ServingEpoch.objects.filter(epoch_id__startswith="v1:").exists()
    assert snapshot(V1AcceptanceTombstone.objects.get()) == tombstone
    assert Receipt.objects.filter(epoch_id=world.epoch.pk).count() == Receipt.objects.count()

    ref = admitted.request.v1_predecessor
    with pytest.raises(IntegrityError), transaction.atomic():
        V1PredecessorRef.objects.create(**{**{f.attname: getattr(ref, f.attname) for f in
                                              V1PredecessorRef._meta.concrete_fields if f.attname != "id"},
                                           "original_epoch": world.epoch.epoch_id})
    with pytest.raises(IntegrityError), transaction.atomic():
        Event.objects.create(**{**{f.attname: getattr(event, f.attname) for f in Event._meta.concrete_fields
                                   if f.attname != "id"}, "source_event_key": "other", "v1_predecessor_id": None})
