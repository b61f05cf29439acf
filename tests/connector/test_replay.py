"""Replay at the service level: immutable ReplayRequests, convergence on one request ID, fail-closed byte
mismatch, distinct generations, a byte-identical predecessor, the lane high-water guard, the only replay mode
and the serving gate (CV2-09, CV2-06-016, CV2-15-002/005/006)."""
from __future__ import annotations

import hashlib
from unittest import mock

import pytest
from django.db import IntegrityError, transaction

from connector.canonical.decoding import decode
from connector.choices import ExecutionState, ReplayMode
from connector.errors import GateNotServing
from connector.models import (
    AccountServingGate,
    ApplicationResult,
    Event,
    Execution,
    MaterializationDue,
    OrderingLane,
    Projection,
    Receipt,
    ReceiptAdmissionKey,
    ReceiptComponent,
    ReplayRequest,
    SupersededDecision,
)
from connector.services import gates as gate_services
from connector.services import materialize, runtime
from connector.services.replay import (
    ReplayMismatch,
    ReplayModeRefused,
    replay_request_admit,
)
from tests.conformance.packs import PACK_A, PACK_B, WEBHOOK_FIELDS_PROOF, with_route
from tests.connector.inbound_helpers import (
    ACTOR,
    BugReproduced,
    admit,
    build_inbound_world,
    deliver,
    drain,
    feed_body,
    feed_line,
    snapshot,
    webhook_body,
    webhook_event,
)

SNAPSHOT = "records.snapshot"
SNAPSHOT_ROUTE = {  # an immediate order-independent route of pack A's body shape
    "ordering_contract": "order_independent",
    "extract": {"format": "json", "components": "/events"},
    "normalize": {"event_kind": "/evt_type", "source_event_key": "/evt_id", "source_locator": "/record_id",
                  "payload": "/attributes"},
    "projection": {"record_key": "/record_id"},
    "mapping": "records.webhook.fields",
    "order_independence": WEBHOOK_FIELDS_PROOF,
}
PACKS = [with_route(PACK_A, SNAPSHOT, SNAPSHOT_ROUTE), PACK_B]
COUNTED = (ReplayRequest, Receipt, ReceiptComponent, Event, Projection, Execution, ApplicationResult,
           MaterializationDue, SupersededDecision)


def counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in COUNTED}


def replay(world, request_id: str, event: Event, *, reason: str = "re-apply after CRM restore",
           principal: str = "ops-alice", mode: str = "suppress_external_effects"):
    component = ReceiptComponent.objects.get(event=event, disposition="event")
    return replay_request_admit(
        account_key=world.account.account_key, request_id=request_id, target_epoch_id=world.epoch.epoch_id,
        target_epoch_digest=bytes(world.epoch.digest), predecessor_event_id=event.pk,
        predecessor_payload_digest=hashlib.sha256(bytes(component.payload)).digest(), reason=reason,
        principal=principal, mode=mode, actor=ACTOR)


def ref_fields(execution_row: Execution) -> dict:
    _, value = decode(bytes(execution_row.execution_ref))
    return dict(value)


@pytest.fixture
def world(db):
    return build_inbound_world("rp-", PACKS)


@pytest.fixture
def original(world) -> Event:
    """A completed live Event of the immediate route."""
    deliver(world, SNAPSHOT, webhook_body(webhook_event("evt-1", "rec-1", 1, full_name="Ada")))
    drain()
    event = Event.objects.get(source_event_key="evt-1")
    assert Execution.objects.get(projection__event=event).state == ExecutionState.COMPLETED
    return event


def test_same_request_id_converges_on_one_request_receipt_and_generation(world, original):
    """Submitting one ReplayRequest ID twice returns the same request and replay Receipt; the pair is inert
    until materialized; materializing (twice) yields one replay Event, Projection and Execution, and a third
    submission after that still returns the same request with the same descendants.
    Proves: CV2-09-005, CV2-09-007, CV2-09-010, CV2-09-027, CV2-15-002, CV2-15-006"""
    first = replay(world, "replay-1", original)
    assert first.outcome == "created"
    assert not Event.objects.filter(replay_request=first.request).exists()  # inert until materialized
    assert not Execution.objects.filter(projection__event__replay_request=first.request).exists()
    before = counts()
    second = replay(world, "replay-1", original)
    assert (second.outcome, second.request.pk, second.receipt.pk) == ("duplicate", first.request.pk,
                                                                       first.receipt.pk)
    assert counts() == before
    materialize.receipt_materialize(receipt_pk=first.receipt.pk)
    descendants = counts()
    materialize.receipt_materialize(receipt_pk=second.receipt.pk)
    third = replay(world, "replay-1", original)
    assert (third.request.pk, third.receipt.pk) == (first.request.pk, first.receipt.pk)
    assert counts() == descendants
    event = Event.objects.get(replay_request=first.request)
    assert Execution.objects.filter(projection__event=event).count() == 1
    assert (bytes(first.receipt.payload), first.receipt.kind) == (
        bytes(ReceiptComponent.objects.get(event=original).payload), "replay")


def test_a_replay_receipt_lives_outside_the_transport_key_namespace(world, original):
    """A replay Receipt takes no ReceiptAdmissionKey: a live delivery whose transport key equals the ReplayRequest
    ID is admitted as its own Receipt, and the replay, keyed by account and request ID, still resolves to its own
    Receipt. Proves: CV2-05-010"""
    first = replay(world, "replay-1", original)
    assert not ReceiptAdmissionKey.objects.filter(receipt=first.receipt).exists()
    live = admit(world, SNAPSHOT, webhook_body(webhook_event("evt-2", "rec-2", 1)), key="replay-1")
    assert live.pk != first.receipt.pk and live.kind != "replay"
    assert ReceiptAdmissionKey.objects.get(transport_key="replay-1").receipt_id == live.pk
    again = replay(world, "replay-1", original)
    assert (again.outcome, again.request.pk, again.receipt.pk) == ("duplicate", first.request.pk, first.receipt.pk)


@pytest.mark.parametrize("change", [{"reason": "another reason"}, {"principal": "ops-bob"}])
def test_same_request_id_with_different_bytes_fails_closed(world, original, change):
    """The same request ID with a different reason or principal is a byte mismatch: ReplayMismatch, and nothing
    is written. Proves: CV2-09-010, CV2-09-027, CV2-15-006, CV2-15-023"""
    replay(world, "replay-1", original)
    before = counts()
    with pytest.raises(ReplayMismatch):
        replay(world, "replay-1", original, **change)
    assert counts() == before
    with pytest.raises(IntegrityError), transaction.atomic():
        stored = ReplayRequest.objects.get()
        ReplayRequest.objects.create(
            account=stored.account, request_id="replay-1", target_epoch=stored.target_epoch,
            target_epoch_digest=bytes(stored.target_epoch_digest), predecessor_event=stored.predecessor_event,
            predecessor_payload_digest=bytes(stored.predecessor_payload_digest), reason="x", principal="p",
            mode=stored.mode, request_digest=b"\x00" * 32, gate_fence=stored.gate_fence)


def test_distinct_request_id_is_a_distinct_generation(world, original):
    """A different request ID is a separate replay generation: its own request, Receipt, Event (same
    SourceEventKey, replay_request set, predecessor = the original), Projection and Execution identities under
    the target epoch. Proves: CV2-09-009, CV2-09-010, CV2-09-027, CV2-15-005"""
    a, b = replay(world, "replay-1", original), replay(world, "replay-2", original)
    assert a.request.pk != b.request.pk and a.receipt.pk != b.receipt.pk
    for admitted in (a, b):
        materialize.receipt_materialize(receipt_pk=admitted.receipt.pk)
    events = list(Event.objects.filter(replay_request__isnull=False).order_by("pk"))
    assert [(e.replay_request_id, e.predecessor_id, e.source_event_key, e.epoch_id) for e in events] == [
        (a.request.pk, original.pk, "evt-1", world.epoch.pk), (b.request.pk, original.pk, "evt-1", world.epoch.pk)]
    projections = [Projection.objects.get(event=e) for e in events]
    identities = {bytes(p.identity_digest) for p in projections} | {
        bytes(Projection.objects.get(event=original).identity_digest)}
    assert len(identities) == 3
    commands = set(Execution.objects.values_list("command_id", flat=True))
    assert len(commands) == 3
    with pytest.raises(IntegrityError), transaction.atomic():
        Event.objects.create(**{f.attname: getattr(events[0], f.attname) for f in Event._meta.concrete_fields
                                if f.attname != "id"})


def test_live_admission_has_one_event_generation_and_replay_mints_its_own(world, original):
    """A live redelivery of the same event under another transport key is a new Receipt that links the one
    existing live Event (one canonical EventGeneration: no replay request, no predecessor); a replay is a new
    generation named by its ReplayRequest, carrying the predecessor link only on the replay Event, so the live
    Event's identity and lineage never change. Proves: CV2-05-014"""
    live_before = snapshot(original)
    deliver(world, SNAPSHOT, webhook_body(webhook_event("evt-1", "rec-1", 1, full_name="Ada")), key="redelivery-1")
    live = list(Event.objects.filter(source_event_key="evt-1", replay_request__isnull=True))
    assert [e.pk for e in live] == [original.pk] and Receipt.objects.count() == 2
    assert (original.replay_request_id, original.predecessor_id) == (None, None)
    admitted = replay(world, "replay-gen-1", original)
    materialize.receipt_materialize(receipt_pk=admitted.receipt.pk)
    replayed = Event.objects.get(replay_request=admitted.request)
    assert (replayed.predecessor_id, replayed.source_event_key) == (original.pk, "evt-1")
    assert bytes(Projection.objects.get(event=replayed).identity_digest) != bytes(
        Projection.objects.get(event=original).identity_digest)
    assert snapshot(original) == live_before


def test_a_replay_reuses_no_v1_identity(world, original):
    """V1 work accepted before the upgrade exists here only as an acceptance tombstone (no Event): upgrade
    replays nothing, and a replay (even one naming a V1 predecessor as evidence, D-331, test_replay_v1_predecessor)
    never reuses a V1 identity; a replay request gets a new V2 Receipt, Event,
    Projection and Execution under the V2 target epoch, takes no admission key (so never a tombstone) and leaves
    the tombstone as it was. Proves: CV2-09-003"""
    from connector.models import V1AcceptanceTombstone
    from connector.services.tombstones import tombstones_import
    assert ReplayRequest._meta.get_field("predecessor_event").related_model is Event
    assert ReplayRequest._meta.get_field("target_epoch").related_model.__name__ == "ServingEpoch"
    tombstones_import(rows=[{"account": world.account.account_key, "channel": SNAPSHOT, "transport_key": "v1-key-1",
                             "payload_digest": hashlib.sha256(b"v1 bytes").digest(),
                             "predecessor_ref": "v1:receipt:77"}], actor=ACTOR)
    tombstone = V1AcceptanceTombstone.objects.get()
    before = (snapshot(tombstone), ReceiptAdmissionKey.objects.count(),
              set(Receipt.objects.values_list("pk", flat=True)), set(Event.objects.values_list("pk", flat=True)),
              set(Execution.objects.values_list("pk", flat=True)))
    admitted = replay(world, "replay-after-upgrade", original)
    materialize.receipt_materialize(receipt_pk=admitted.receipt.pk)
    drain()
    replayed = Event.objects.get(replay_request=admitted.request)
    assert admitted.receipt.pk not in before[2] and replayed.pk not in before[3]
    new_executions = set(Execution.objects.values_list("pk", flat=True)) - before[4]
    assert len(new_executions) == 1
    assert {Execution.objects.get(pk=pk).epoch_id for pk in new_executions} == {world.epoch.pk}
    assert (admitted.receipt.epoch_id, replayed.epoch_id) == (world.epoch.pk, world.epoch.pk)
    assert (snapshot(tombstone), ReceiptAdmissionKey.objects.count()) == before[:2]


def test_predecessor_stays_byte_identical(world, original):
    """Admitting, materializing and running two replays leaves the predecessor Event, its Receipt, Component,
    Projection, Execution and ApplicationResult byte-identical in every column.
    Proves: CV2-09-011, CV2-09-025, CV2-09-027"""
    execution_row = Execution.objects.get(projection__event=original)
    rows = [original, original.receipt, ReceiptComponent.objects.get(event=original),
            Projection.objects.get(event=original), execution_row,
            ApplicationResult.objects.get(command_id=execution_row.command_id)]
    before = [snapshot(row) for row in rows]
    for request_id in ("replay-1", "replay-2"):
        materialize.receipt_materialize(receipt_pk=replay(world, request_id, original).receipt.pk)
    done = drain()
    assert len(done) == 2 and ApplicationResult.objects.count() == 3
    assert [snapshot(row) for row in rows] == before


@pytest.mark.parametrize("route", ["records.webhook", "ledger.sequenced"])
def test_replay_cannot_bypass_the_lane_high_water(world, route):
    """A replay keeps the predecessor's partition, position and tie-breaker and passes the same lane guard: at
    or below the high-water it is superseded without an Execution or a Runtime call.
    Proves: CV2-06-016, CV2-09-015, CV2-09-016"""
    if route == "records.webhook":
        deliver(world, route, webhook_body(webhook_event("evt-5", "rec-1", 5)))
        key, partition, position = "evt-5", "rec-1", 5
    else:
        deliver(world, route, feed_body(feed_line("ln-1", 1, "mem-1")))
        key, partition, position = "ln-1", "mem-1", 1
    drain()
    predecessor = Event.objects.get(source_event_key=key)
    results = ApplicationResult.objects.count()
    admitted = replay(world, "replay-hw", predecessor)
    materialize.receipt_materialize(receipt_pk=admitted.receipt.pk)
    replayed = Event.objects.get(replay_request=admitted.request)
    assert (replayed.partition, replayed.position, bytes(replayed.position_bytes), bytes(replayed.tie_breaker)) == (
        predecessor.partition, predecessor.position, bytes(predecessor.position_bytes),
        bytes(predecessor.tie_breaker))
    with mock.patch.object(runtime, "runtime_command_apply", wraps=runtime.runtime_command_apply) as spy:
        assert drain() == []
    assert spy.call_count == 0
    decision = SupersededDecision.objects.get(projection__event=replayed)
    assert (decision.position, decision.reason) == (position, "at_or_below_high_water")
    assert not Execution.objects.filter(projection__event=replayed).exists()
    assert ApplicationResult.objects.count() == results
    assert OrderingLane.objects.get(route=route, partition=partition).high_water == position


@pytest.mark.parametrize("mode", ["allow_external_effects", "", "SUPPRESS_EXTERNAL_EFFECTS"])
def test_only_suppress_external_effects_is_accepted(world, original, mode):
    """Any replay mode other than `suppress_external_effects` is refused before anything is written.
    Proves: CV2-09-017"""
    before = counts()
    with pytest.raises(ReplayModeRefused):
        replay(world, "replay-mode", original, mode=mode)
    assert counts() == before


def test_replay_accepts_the_mode_choice_constant(world, original):
    """The only valid mode, given as the product's own `ReplayMode` choice, is admitted exactly like its text.
    Proves: CV2-09-017"""
    from connector.canonical.encoding import CanonicalEncodingError

    try:
        admitted = replay(world, "replay-enum", original, mode=ReplayMode.SUPPRESS_EXTERNAL_EFFECTS)
    except CanonicalEncodingError as exc:
        raise BugReproduced(str(exc)) from exc
    assert admitted.outcome == "created"
    assert replay(world, "replay-enum", original).outcome == "duplicate"


def test_replay_execution_ref_freezes_suppress_external_effects(world, original):
    """The replay Projection has suppress_external_effects=True and the flag is part of the ExecutionRef (and
    so of its digest and the Runtime result address); the live Execution's ref says False.
    Proves: CV2-09-017, CV2-09-006, CV2-08-003, CV2-08-004"""
    admitted = replay(world, "replay-ref", original)
    assert admitted.request.mode == ReplayMode.SUPPRESS_EXTERNAL_EFFECTS
    minted = materialize.receipt_materialize(receipt_pk=admitted.receipt.pk).executions
    replayed = Execution.objects.get(pk=minted[0])
    live = Execution.objects.get(projection__event=original)
    assert replayed.projection.suppress_external_effects is True
    assert ref_fields(replayed)["suppress_external_effects"] is True
    assert ref_fields(live)["suppress_external_effects"] is False
    assert ref_fields(replayed)["command_id"] == replayed.command_id != live.command_id
    assert bytes(replayed.execution_ref_digest) == hashlib.sha256(bytes(replayed.execution_ref)).digest()
    done, = drain()
    result = ApplicationResult.objects.get(command_id=done.command_id)
    assert bytes(result.execution_ref_digest) == bytes(replayed.execution_ref_digest)
    assert result.outcome == "noop"  # same bytes, nothing new for the CRM record


def test_replay_admission_and_materialization_refused_while_halting(world, original):
    """With the gate `halting_v2`, a new ReplayRequest raises GateNotServing and writes nothing; a replay
    admitted before the halt cannot be materialized (no executable descendant); an existing request ID is
    still read back without a write. Proves: CV2-09-004, CV2-09-005, CV2-09-008, CV2-09-012, CV2-09-028"""
    admitted = replay(world, "replay-early", original)
    gate = AccountServingGate.objects.get(account=world.account)
    gate_services.gate_transition(account_id=world.account.pk, action="halt_v2", expected_fence=gate.fence,
                                  actor=ACTOR)
    before = counts()
    with pytest.raises(GateNotServing):
        replay(world, "replay-late", original)
    with pytest.raises(GateNotServing):
        materialize.receipt_materialize(receipt_pk=admitted.receipt.pk)
    again = replay(world, "replay-early", original)
    assert (again.outcome, again.request.pk) == ("duplicate", admitted.request.pk)
    assert counts() == before
    assert not Event.objects.filter(replay_request__isnull=False).exists()


def test_a_held_replay_materializes_only_after_a_new_serving_fence_with_its_stored_bytes(world, original):
    """A replay admitted before a halt stays inert through `halting_v2` and `v2_halted`; after the gate returns to
    `v2_serving` by its own transition (fence advanced), materialization runs in a new transaction under the
    current fence and binds the request's stored target epoch, whose bytes never changed. Proves: CV2-09-013"""
    admitted = replay(world, "replay-held", original)
    stored = ReplayRequest.objects.values("target_epoch_id", "target_epoch_digest", "request_digest",
                                          "gate_fence").get(pk=admitted.request.pk)
    for action in ("halt_v2", "confirm_halted"):
        gate_services.gate_transition(account_id=world.account.pk, action=action, expected_fence=None,
                                      actor=ACTOR, reason="test")
        with pytest.raises(GateNotServing):
            materialize.receipt_materialize(receipt_pk=admitted.receipt.pk)
    gate = gate_services.gate_transition(account_id=world.account.pk, action="resume_predecessor",
                                         expected_fence=None, actor=ACTOR, reason="test")
    assert gate.mode == "v2_serving" and gate.fence == stored["gate_fence"] + 3
    materialize.receipt_materialize(receipt_pk=admitted.receipt.pk)
    event = Event.objects.get(replay_request=admitted.request)
    assert event.epoch_id == stored["target_epoch_id"]
    assert ReplayRequest.objects.values("target_epoch_id", "target_epoch_digest", "request_digest",
                                        "gate_fence").get(pk=admitted.request.pk) == stored


def test_windowed_replay_keeps_suppress_external_effects(world):
    """A replay of an Event on a grouped route is executed with suppress_external_effects=True in its
    Projection and ExecutionRef, and never shares a Projection with live input. Proves: CV2-09-017, CV2-09-009"""
    lines = [feed_line(f"gl-{n}", n, f"mem-{n}", batch_tag="tag-1") for n in (1, 2, 3)]
    deliver(world, "ledger.grouped", feed_body(*lines))
    drain()
    admitted = replay(world, "replay-window", Event.objects.get(source_event_key="gl-1"))
    materialize.receipt_materialize(receipt_pk=admitted.receipt.pk)
    deliver(world, "ledger.grouped", feed_body(feed_line("gl-4", 4, "mem-4", batch_tag="tag-1"),
                                               feed_line("gl-5", 5, "mem-5", batch_tag="tag-1")))
    replayed = Event.objects.get(replay_request=admitted.request)
    carrying = list(Projection.objects.filter(event=replayed)) + list(
        Projection.objects.filter(window__members__event=replayed))
    problems = []
    if not carrying:
        problems.append("no projection carries the replay event")
    for p in carrying:
        if not p.suppress_external_effects:
            problems.append(f"projection {p.pk} of replay has suppress_external_effects=False")
        if p.window_id and p.window.members.filter(event__replay_request__isnull=True).exists():
            problems.append(f"projection {p.pk} mixes replay and live events")
        for e in Execution.objects.filter(projection=p):
            if ref_fields(e)["suppress_external_effects"] is not True:
                problems.append(f"execution {e.pk} ref has suppress_external_effects=False")
    if problems:
        raise BugReproduced("; ".join(problems))
