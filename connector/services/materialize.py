"""Materialization of a Receipt's children: Components, Events, then Projections, windows and (for
order-independent routes) Executions. Idempotent: it derives only what is missing, from the immutable Receipt,
under the serving guard of the Receipt's own epoch (CV2-05-011/017/018)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from connector import locks, logcontext, tracing
from connector.canonical.profiles import profile_for
from connector.choices import ComponentDisposition, ReceiptKind
from connector.faults import fault_point
from connector.interpreters.inbound import NormalizedEvent, RouteProgram
from connector.models import (
    Event,
    Execution,
    ExecutionDependency,
    MaterializationDue,
    OrderingLane,
    Projection,
    ExecutionTrace,
    ProjectionTrace,
    ProjectionWindow,
    Receipt,
    ReceiptComponent,
    WindowMember,
)
from connector.receipts import canonical_json, rec
from connector.selectors.routes import route_for
from connector.services.guard import ServingContext, lock_serving


@dataclass
class Materialized:
    components: int = 0
    events: list[int] = field(default_factory=list)
    lanes: set[int] = field(default_factory=set)
    executions: list[int] = field(default_factory=list)


def _constraint(exc: IntegrityError) -> str:
    return getattr(getattr(exc.__cause__, "diag", None), "constraint_name", "") or ""


def _profile(epoch_profile: str):
    return profile_for(epoch_profile)


# -- executions --------------------------------------------------------------------------------------------------

def execution_ref(*, command_id: str, projection: Projection, generation: int, route: RouteProgram,
                  epoch_digest: bytes, profile_id: str) -> bytes:
    """The complete ExecutionRef carried once in the Runtime command: Connector execution identity, opaque pack
    generation, epoch digest, definition identity and input digest (and the replay effect mode)."""
    return _profile(profile_id).preimage("execution-ref", rec(
        command_id=command_id, projection_identity=bytes(projection.identity_digest), generation=generation,
        pack_generation_id=route.pack_generation_id, epoch_digest=bytes(epoch_digest), route=route.business_key,
        route_version=route.version, definition_digest=route.definition_digest,
        input_digest=bytes(projection.input_digest), suppress_external_effects=projection.suppress_external_effects))


#: Length of a command ID: "cmd-" and 40 hex digits of the projection identity and generation (decision 7). Outbound
#: authoring derives EffectRoot IDs from it, so admission bounds the values appended to it (connector.hooks).
COMMAND_ID_PREFIX, COMMAND_ID_HEX = "cmd-", 40
COMMAND_ID_LENGTH = len(COMMAND_ID_PREFIX) + COMMAND_ID_HEX


def command_id_for(identity_digest: bytes, generation: int) -> str:
    return COMMAND_ID_PREFIX + hashlib.sha256(bytes(identity_digest) + generation.to_bytes(4, "big")).hexdigest()[
        :COMMAND_ID_HEX]


def mint_execution(*, projection: Projection, route: RouteProgram, ctx: ServingContext, profile_id: str,
                   lane: OrderingLane | None = None) -> Execution:
    """Mint the next execution generation of a projection (deterministic command ID, decision 7)."""
    assert transaction.get_connection().in_atomic_block
    generation = projection.execution_generation + 1
    command_id = command_id_for(projection.identity_digest, generation)
    ref = execution_ref(command_id=command_id, projection=projection, generation=generation, route=route,
                        epoch_digest=ctx.epoch_digest, profile_id=profile_id)
    status = "minted" if lane is not None else projection.lane_status
    Projection.objects.filter(pk=projection.pk, execution_generation=generation - 1).update(
        execution_generation=generation, lane_status=status)
    projection.execution_generation, projection.lane_status = generation, status
    execution = Execution.objects.create(
        projection=projection, generation=generation, account_id=projection.account_id, epoch_id=projection.epoch_id,
        lane=lane, command_id=command_id, execution_ref=ref, execution_ref_digest=hashlib.sha256(ref).digest())
    tracing.minted(ExecutionTrace, execution.pk, name="lane_advance", parent=ProjectionTrace,
                   projection_id=projection.pk)  # issue 21: the claim continues this execution's trace
    return execution


# -- projections -------------------------------------------------------------------------------------------------

def _projection_identity(profile_id: str, epoch_digest: bytes, route: RouteProgram, source: str) -> bytes:
    return _profile(profile_id).digest("projection", rec(epoch_digest=bytes(epoch_digest), route=route.business_key,
                                                         route_version=route.version, source=source))


def _lane(ctx: ServingContext, route: RouteProgram, partition: str, account_id: int) -> OrderingLane:
    key = dict(epoch_id=ctx.epoch_pk, account_id=account_id, route=route.business_key, route_version=route.version,
               partition=partition)
    lane = OrderingLane.objects.filter(**key).first()
    if lane is not None:
        return lane
    try:
        with transaction.atomic():
            return OrderingLane.objects.create(**key, contract=route.contract)
    except IntegrityError:
        return OrderingLane.objects.get(**key)


def _immediate(event: Event, n: NormalizedEvent, route: RouteProgram, ctx: ServingContext, profile_id: str,
               suppress: bool, out: Materialized) -> None:
    source = f"event:{event.pk}"
    payload = canonical_json({"record_key": n.record_key, "event_kind": n.event_kind,
                              "data": json.loads(n.payload)})
    lane = _lane(ctx, route, n.partition, event.account_id) if route.ordered else None
    projection = Projection.objects.create(
        account_id=event.account_id, epoch_id=ctx.epoch_pk, route=route.business_key, route_version=route.version,
        identity_digest=_projection_identity(profile_id, ctx.epoch_digest, route, source), event=event, lane=lane,
        position=n.position, tie_breaker=n.tie_breaker, input=payload, input_digest=hashlib.sha256(payload).digest(),
        suppress_external_effects=suppress, lane_status="pending" if lane is not None else "")
    if lane is not None:
        tracing.remember(ProjectionTrace, projection.pk)  # issue 21: the lane advance continues from it
    if lane is None:
        execution = mint_execution(projection=projection, route=route, ctx=ctx, profile_id=profile_id)
        if n.depends_on:
            ExecutionDependency.objects.create(
                execution=execution, requirement_key=n.depends_on,
                deadline=timezone.now() + timedelta(seconds=int(route.definition["depends_on"]["deadline_seconds"])))
            execution.wait_dependency()
            execution.save()
        out.executions.append(execution.pk)
    else:
        out.lanes.add(lane.pk)  # lane routes mint at claim time (lane_advance)


def window_seal(window: ProjectionWindow, route: RouteProgram, ctx: ServingContext, profile_id: str) -> Execution:
    """Seal the selected membership and mint its projection and execution in the caller's transaction; the
    window row is locked by the caller."""
    window.seal(at=timezone.now())
    window.save()
    members = list(window.members.select_related("event").order_by("ordinal"))
    payload = canonical_json({"grouping_key": window.grouping_key, "members": [
        {"source_event_key": m.event.source_event_key, "record_key": m.record_key,
         "data": json.loads(bytes(m.event.payload))} for m in members]})
    projection = Projection.objects.create(
        account_id=window.account_id, epoch_id=ctx.epoch_pk, route=route.business_key, route_version=route.version,
        identity_digest=_projection_identity(profile_id, ctx.epoch_digest, route, f"window:{window.pk}"),
        window=window, input=payload, input_digest=hashlib.sha256(payload).digest())
    return mint_execution(projection=projection, route=route, ctx=ctx, profile_id=profile_id)


def _windowed(event: Event, n: NormalizedEvent, route: RouteProgram, ctx: ServingContext, profile_id: str,
              out: Materialized) -> None:
    spec = route.definition["window"]
    window = None
    while window is None:
        # Lock the open window of this key, or open one; a concurrent opener or sealer makes us look again.
        window = locks.open_window_for_update(epoch_pk=ctx.epoch_pk, route=route.business_key,
                                              grouping_key=n.grouping_key)
        if window is not None:
            break
        try:
            with transaction.atomic():
                created = ProjectionWindow.objects.create(
                    account_id=event.account_id, epoch_id=ctx.epoch_pk, route=route.business_key,
                    grouping_key=n.grouping_key, max_members=spec["max_members"],
                    max_age_seconds=spec["max_age_seconds"],
                    closes_at=timezone.now() + timedelta(seconds=spec["max_age_seconds"]))
            window = locks.window_for_update(created.pk)
        except IntegrityError as exc:
            if _constraint(exc) != "connector_window_one_open_per_key":
                raise
    WindowMember.objects.create(window=window, event=event, ordinal=window.member_count, record_key=n.record_key)
    window.member_count += 1
    if window.member_count >= window.max_members:
        out.executions.append(window_seal(window, route, ctx, profile_id).pk)
    else:
        ProjectionWindow.objects.filter(pk=window.pk).update(member_count=window.member_count)


# -- events --------------------------------------------------------------------------------------------------------

def _event(receipt: Receipt, n: NormalizedEvent, route: RouteProgram, profile_id: str, *, replay=None,
           predecessor: Event | None = None) -> tuple[Event, str, str]:
    """Insert the Event, or link a live duplicate (identical bytes) or quarantine a conflict (decision 14)."""
    contract_digest = _profile(profile_id).digest("ordering-contract", canonical_json(
        {"contract": route.contract, "ordering": route.ordering}))
    fields = dict(account_id=receipt.account_id, epoch_id=receipt.epoch_id, receipt=receipt, route=route.business_key,
                  event_kind=n.event_kind, source_locator=n.source_locator, occurred_at=n.occurred_at,
                  source_event_key=n.source_event_key, payload=n.payload,
                  payload_digest=hashlib.sha256(n.payload).digest(), ordering_contract=route.contract,
                  contract_digest=contract_digest, partition=n.partition,
                  position_kind="integer" if n.position is not None else "", position=n.position,
                  position_bytes=n.position_bytes, tie_breaker=n.tie_breaker, grouping_key=n.grouping_key,
                  replay_request=replay, predecessor=predecessor)
    try:
        with transaction.atomic():
            return Event.objects.create(**fields), ComponentDisposition.EVENT, ""
    except IntegrityError as exc:
        if _constraint(exc) not in ("connector_event_one_live_per_key", "connector_event_one_replay_generation"):
            raise
    existing = Event.objects.get(account_id=receipt.account_id, source_event_key=n.source_event_key,
                                 replay_request=replay)
    if bytes(existing.payload_digest) == fields["payload_digest"] and existing.partition == n.partition and (
            existing.position == n.position):
        return existing, ComponentDisposition.DUPLICATE_EVENT, ""
    return existing, ComponentDisposition.QUARANTINED, "EVENT_KEY_CONFLICT"


def receipt_materialize(*, receipt_pk: int) -> Materialized:
    """Materialize the missing children of one Receipt in one guarded transaction (gate `v2_serving` on the
    Receipt's exact epoch). Locks: epoch, gate (FOR SHARE), then the Receipt row (FOR UPDATE) so concurrent
    materializers serialize; only ordinals without a Component are derived."""
    out = Materialized()
    receipt = Receipt.objects.select_related("epoch", "replay_request").defer("epoch__preimage").get(pk=receipt_pk)
    logcontext.note(account_id=receipt.account_id)
    with transaction.atomic():
        ctx = lock_serving(account_id=receipt.account_id, epoch_id=receipt.epoch.epoch_id,
                           epoch_digest=bytes(receipt.epoch_digest))
        locks.receipt_for_update(receipt.pk)
        done = set(ReceiptComponent.objects.filter(receipt=receipt).values_list("ordinal", flat=True))
        if len(done) == receipt.component_count:
            MaterializationDue.objects.filter(receipt=receipt).delete()
            return out
        route = route_for(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, account_id=receipt.account_id,
                          channel=receipt.channel)
        profile_id = receipt.epoch.profile_id
        replay = receipt.replay_request if receipt.kind == ReceiptKind.REPLAY else None
        if replay is not None:
            normalized = [route.normalize(json.loads(bytes(receipt.payload)))]
        else:
            normalized = route.parse(bytes(receipt.payload))
        for ordinal, n in enumerate(normalized):
            if ordinal in done:
                continue
            event, disposition, reason = _event(receipt, n, route, profile_id, replay=replay,
                                                predecessor=replay.predecessor_event if replay else None)
            ReceiptComponent.objects.create(
                receipt=receipt, ordinal=ordinal, payload=n.component,
                payload_digest=hashlib.sha256(n.component).digest(), disposition=disposition,
                event=None if disposition == ComponentDisposition.QUARANTINED else event, reason_code=reason)
            out.components += 1
            fault_point("materialize.after_components")
            if disposition != ComponentDisposition.EVENT:
                continue
            out.events.append(event.pk)
            if route.windowed and replay is None:
                _windowed(event, n, route, ctx, profile_id, out)
            else:
                _immediate(event, n, route, ctx, profile_id, replay is not None, out)
        MaterializationDue.objects.filter(receipt=receipt).delete()
    return out
