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
    ReplayRequest,
    WindowMember,
)
from connector.receipts import canonical_json, rec
from connector.errors import GateNotServing
from connector.selectors.routes import epoch_profile, route_for
from connector.services.guard import ServingContext, lock_serving
from connector.services.set_insert import insert_rows


@dataclass
class Materialized:
    components: int = 0
    events: list[int] = field(default_factory=list)
    lanes: set[int] = field(default_factory=set)
    executions: list[int] = field(default_factory=list)
    account_id: int | None = None  # the receipt's account: the lanes' wake-ups carry it (docs/scale-out.md)


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
    Projection.objects.filter(pk=projection.pk, account_id=projection.account_id,
                              execution_generation=generation - 1).update(
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

@dataclass
class _Item:
    """One component still to derive: its ordinal, normalized event, and (once decided) its event and
    disposition."""
    ordinal: int
    n: NormalizedEvent
    event_pk: int | None = None
    disposition: str = ""
    reason: str = ""


def _event_row(receipt: Receipt, n: NormalizedEvent, route: RouteProgram, contract_digest: bytes, replay,
               predecessor_pk: int | None, v1_predecessor_pk: int | None = None) -> dict:
    return dict(account_id=receipt.account_id, epoch_id=receipt.epoch_id, receipt_id=receipt.pk,
                route=route.business_key, event_kind=n.event_kind, source_locator=n.source_locator,
                occurred_at=n.occurred_at, source_event_key=n.source_event_key, payload=n.payload,
                payload_digest=hashlib.sha256(n.payload).digest(), ordering_contract=route.contract,
                contract_digest=contract_digest, partition=n.partition,
                position_kind="integer" if n.position is not None else "", position=n.position,
                position_bytes=n.position_bytes, tie_breaker=n.tie_breaker, grouping_key=n.grouping_key,
                replay_request_id=replay.pk if replay is not None else None, predecessor_id=predecessor_pk,
                v1_predecessor_id=v1_predecessor_pk)


def _events(entries: list[tuple[Receipt, _Item]], route: RouteProgram, profile_id: str, replay) -> None:
    """Insert the Events of `entries` ((receipt, item) in receipt, then ordinal order; one account) with one
    statement, or link a live duplicate (identical bytes) or quarantine a conflict (decision 14), exactly as one
    insert per component in that order would: the first component of a key is the one that may insert; a later
    one of the same key, in its receipt or a later one (D-294), meets that Event.

    Rows are proposed in ascending source event key, so two receipts racing on overlapping keys wait on each
    other's unique-index entries in one order and cannot deadlock (D-217). `ON CONFLICT DO NOTHING` skips only
    a row that meets one of the Event's unique constraints (one live per key, one per replay generation); any
    other failure raises as before. Conflicting keys are read back with one more statement."""
    contract_digest = _profile(profile_id).digest("ordering-contract", canonical_json(
        {"contract": route.contract, "ordering": route.ordering}))
    predecessor_pk = replay.predecessor_event_id if replay is not None else None
    v1_predecessor_pk = replay.v1_predecessor_id if replay is not None else None  # evidence only (D-331)
    first: dict[str, tuple[Receipt, _Item]] = {}
    for entry in entries:
        first.setdefault(entry[1].n.source_event_key, entry)
    rows = {key: _event_row(receipt, item.n, route, contract_digest, replay, predecessor_pk, v1_predecessor_pk)
            for key, (receipt, item) in first.items()}
    inserted = dict((key, pk) for pk, key in insert_rows(
        Event, [rows[key] for key in sorted(rows)], returning=("id", "source_event_key"), conflict_nothing=True))
    others = {item.n.source_event_key for _, item in entries
              if first[item.n.source_event_key][1] is not item or item.n.source_event_key not in inserted}
    existing = {}
    if others:
        existing = {e["source_event_key"]: e for e in Event.objects.filter(
            account_id=entries[0][0].account_id, replay_request=replay, source_event_key__in=sorted(others))
            .values("id", "source_event_key", "payload_digest", "partition", "position")}
    for _, item in entries:
        key = item.n.source_event_key
        if first[key][1] is item and key in inserted:
            item.event_pk, item.disposition = inserted[key], ComponentDisposition.EVENT
            continue
        found = existing[key]
        item.event_pk = found["id"]
        if (bytes(found["payload_digest"]) == hashlib.sha256(item.n.payload).digest()
                and found["partition"] == item.n.partition and found["position"] == item.n.position):
            item.disposition = ComponentDisposition.DUPLICATE_EVENT
        else:
            item.disposition, item.reason = ComponentDisposition.QUARANTINED, "EVENT_KEY_CONFLICT"


def _components(entries: list[tuple[Receipt, _Item]]) -> None:
    """The missing Components of `entries` ((receipt, item), in receipt then ordinal order), with one statement."""
    insert_rows(ReceiptComponent, [dict(
        receipt_id=r.pk, ordinal=i.ordinal, payload=i.n.component,
        payload_digest=hashlib.sha256(i.n.component).digest(), disposition=i.disposition,
        event_id=None if i.disposition == ComponentDisposition.QUARANTINED else i.event_pk,
        reason_code=i.reason) for r, i in entries])


# -- lanes and projections, set-based ------------------------------------------------------------------------

def _lanes(ctx: ServingContext, route: RouteProgram, partitions: list[str], account_id: int) -> dict[str, int]:
    """The lane of each partition (partition -> lane pk), opening the missing ones: one read, then (only for new
    partitions) one `INSERT ... ON CONFLICT DO NOTHING` in ascending partition order, then (only if a concurrent
    materializer opened one meanwhile) one more read. Two materializers opening overlapping partitions propose
    them in one order and cannot deadlock (D-217)."""
    key = dict(epoch_id=ctx.epoch_pk, account_id=account_id, route=route.business_key, route_version=route.version)
    lanes = dict(OrderingLane.objects.filter(**key, partition__in=partitions).values_list("partition", "pk"))
    missing = sorted(set(partitions) - set(lanes))
    if missing:
        for pk, partition in insert_rows(OrderingLane, [dict(key, partition=p, contract=route.contract)
                                                         for p in missing],
                                          returning=("id", "partition"), conflict_nothing=True):
            lanes[partition] = pk
        if len(lanes) < len(set(partitions)):
            lanes.update(OrderingLane.objects.filter(**key, partition__in=sorted(set(partitions) - set(lanes)))
                         .values_list("partition", "pk"))
    return lanes


def _projection_row(event_pk: int, n: NormalizedEvent, route: RouteProgram, ctx: ServingContext, profile_id: str,
                    suppress: bool, account_id: int, lane_pk: int | None) -> dict:
    payload = canonical_json({"record_key": n.record_key, "event_kind": n.event_kind,
                              "data": json.loads(n.payload)})
    return dict(account_id=account_id, epoch_id=ctx.epoch_pk, route=route.business_key, route_version=route.version,
                identity_digest=_projection_identity(profile_id, ctx.epoch_digest, route, f"event:{event_pk}"),
                event_id=event_pk, window_id=None, lane_id=lane_pk, position=n.position, tie_breaker=n.tie_breaker,
                input=payload, input_digest=hashlib.sha256(payload).digest(), suppress_external_effects=suppress,
                execution_generation=0, lane_status="pending" if lane_pk is not None else "")


def _immediate_batch(items: list[_Item], route: RouteProgram, ctx: ServingContext, profile_id: str,
                     suppress: bool, account_id: int, out: Materialized) -> None:
    """Projections of the new events of an immediate route, one statement (plus the lanes' and, for
    order-independent routes, the Executions' one statement each). Lane routes leave the projection `pending`
    for `lane_advance` (ordering and supersession are decided there, by position, tie-breaker and pk, never
    here). Projections are inserted in ascending lane pk, then ordinal, so the implicit `FOR KEY SHARE` each
    takes on its lane comes in the lanes' canonical order (docs/locking.md)."""
    if route.ordered:
        lanes = _lanes(ctx, route, sorted({i.n.partition for i in items}), account_id)
        ordered = sorted(items, key=lambda i: (lanes[i.n.partition], i.ordinal))
        projections = insert_rows(Projection, [_projection_row(i.event_pk, i.n, route, ctx, profile_id, suppress,
                                                                account_id, lanes[i.n.partition]) for i in ordered])
        tracing.remember_many(ProjectionTrace, [pk for (pk,) in projections])  # issue 21: lane advance continues
        out.lanes.update(lanes[i.n.partition] for i in items)
        return
    rows = [_projection_row(i.event_pk, i.n, route, ctx, profile_id, suppress, account_id, None) for i in items]
    for row in rows:
        row["execution_generation"] = 1  # what mint_execution's first step sets: generation 0 -> 1
    projections = [pk for (pk,) in insert_rows(Projection, rows)]
    executions = []
    for pk, row in zip(projections, rows):
        projection = Projection(pk=pk, identity_digest=row["identity_digest"], input_digest=row["input_digest"],
                                suppress_external_effects=suppress)
        command_id = command_id_for(row["identity_digest"], 1)
        ref = execution_ref(command_id=command_id, projection=projection, generation=1, route=route,
                            epoch_digest=ctx.epoch_digest, profile_id=profile_id)
        executions.append(dict(projection_id=pk, generation=1, account_id=account_id, epoch_id=ctx.epoch_pk,
                               lane_id=None, command_id=command_id, execution_ref=ref,
                               execution_ref_digest=hashlib.sha256(ref).digest()))
    minted = [pk for (pk,) in insert_rows(Execution, executions)]
    tracing.remember_many(ExecutionTrace, minted)  # issue 21: the claim continues each execution's trace
    out.executions.extend(minted)


def receipts_materialize(*, receipt_pks, account_id: int) -> Materialized:
    """Materialize the missing children of the Receipts of `receipt_pks` (all of account `account_id`; one receipt
    is a batch of one) in one guarded transaction; returns what they produced. Idempotent: only ordinals without a
    Component are derived (CV2-05-016/017: the repair of a crashed receipt is this same call), and every receipt is
    no longer due when this returns.

    Locks: the account's guard (epoch and gate FOR SHARE, gate `v2_serving`), then the receipts FOR UPDATE in
    ascending pk, so concurrent materializers of a receipt serialize. A receipt of another epoch than the one the
    gate serves refuses with GATE_NOT_SERVING, as a guard on its own epoch does; a pk of another account raises
    Receipt.DoesNotExist; either
    rolls the whole transaction back (the caller splits the batch: `poison.isolated_batches`).

    Set-based (D-217, D-294): the transport receipts of one channel share one Event insert (proposed in source
    event key order, so the first component of a key is the one that inserts, exactly as receipt after receipt in
    ascending pk would) and a replay receipt has its own (its replay request); the Components of every receipt
    are one insert; the lanes and Projections (and the Executions of an order-independent route) are one
    statement each per route. Windowed routes add their members one window at a time, in grouping-key order;
    routes with declared dependencies mint per event. Statements for any number of transport receipts of one
    immediate route: BEGIN, the guard, the receipts, their done Components, the Events (+ one read when a key met
    an existing Event), the Components, the lanes (a read, + an insert for new partitions), the Projections, the
    due rows deleted, COMMIT. Fault point `materialize.after_components` fires once the Components are written,
    before any projection."""
    out = Materialized(account_id=account_id)
    if not receipt_pks:
        return out
    logcontext.note(account_id=account_id)
    with transaction.atomic():
        ctx = lock_serving(account_id=account_id)
        receipts = locks.account_receipts_for_update(receipt_pks, account_id=account_id)
        if len(receipts) != len(set(receipt_pks)):  # a pk of another account, or none at all
            raise Receipt.DoesNotExist(f"receipts {sorted(set(receipt_pks) - {r.pk for r in receipts})} of "
                                       f"account {account_id} do not exist")
        for r in receipts:
            if r.epoch_id != ctx.epoch_pk or bytes(r.epoch_digest) != ctx.epoch_digest:
                raise GateNotServing(f"receipt {r.pk} is bound to another epoch; the gate serves {ctx.epoch_id}")
        done: dict[int, set[int]] = {}
        for receipt_pk, ordinal in ReceiptComponent.objects.filter(
                receipt_id__in=[r.pk for r in receipts]).order_by().values_list("receipt_id", "ordinal"):
            done.setdefault(receipt_pk, set()).add(ordinal)
        todo = [r for r in receipts if len(done.get(r.pk, ())) != r.component_count]
        work = _derive_events(todo, done, ctx, account_id) if todo else []
        entries = [entry for _, _, group in work for entry in group]
        if entries:
            _components(entries)
            out.components += len(entries)
            fault_point("materialize.after_components")
        profile_id = epoch_profile(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest)
        for route, replay, group in work:
            _project(route, replay, group, ctx, profile_id, account_id, out)
        MaterializationDue.objects.filter(receipt_id__in=[r.pk for r in receipts]).delete()
    return out


def _derive_events(receipts: list[Receipt], done: dict[int, set[int]], ctx: ServingContext,
                   account_id: int) -> list[tuple[RouteProgram, ReplayRequest | None, list]]:
    """The Events of every missing component (`_events`): per channel, in channel order, one call for the channel's
    transport receipts; then one call per replay receipt. Returns (route, replay request, entries) per call."""
    routes: dict[str, RouteProgram] = {}

    def route_of(channel: str) -> RouteProgram:
        if channel not in routes:
            routes[channel] = route_for(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, account_id=account_id,
                                        channel=channel)
        return routes[channel]

    profile_id = epoch_profile(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest)
    replays = [r for r in receipts if r.kind == ReceiptKind.REPLAY]
    requests = {q.pk: q for q in ReplayRequest.objects.filter(
        account_id=account_id, pk__in=[r.replay_request_id for r in replays])} if replays else {}
    work = []
    transport = [r for r in receipts if r.kind != ReceiptKind.REPLAY]
    for channel in sorted({r.channel for r in transport}):
        route = route_of(channel)
        entries = [(r, _Item(ordinal, n)) for r in transport if r.channel == channel
                   for ordinal, n in enumerate(route.parse(bytes(r.payload))) if ordinal not in done.get(r.pk, ())]
        work.append((route, None, entries))
    for r in replays:
        route = route_of(r.channel)
        normalized = [route.normalize(json.loads(bytes(r.payload)))]
        work.append((route, requests[r.replay_request_id],
                     [(r, _Item(ordinal, n)) for ordinal, n in enumerate(normalized) if ordinal not in done.get(r.pk, ())]))
    for route, replay, entries in work:
        if entries:
            _events(entries, route, profile_id, replay)
    return work


def _project(route: RouteProgram, replay: ReplayRequest | None, entries: list, ctx: ServingContext, profile_id: str,
             account_id: int, out: Materialized) -> None:
    """The Projections (windows, Executions) of the new Events of `entries`, as the route says."""
    new = [(r, i) for r, i in entries if i.disposition == ComponentDisposition.EVENT]
    out.events.extend(i.event_pk for _, i in new)
    if not new:
        return
    if route.windowed and replay is None:
        for r, i in sorted(new, key=lambda e: (e[1].n.grouping_key, e[0].pk, e[1].ordinal)):
            _windowed(Event(pk=i.event_pk, account_id=account_id), i.n, route, ctx, profile_id, out)
    elif route.definition.get("depends_on"):
        for _, i in new:
            _immediate(Event(pk=i.event_pk, account_id=account_id), i.n, route, ctx, profile_id, replay is not None,
                       out)
    else:
        # `_immediate_batch` inserts Projections in (lane pk, ordinal) order; numbered in (receipt pk, ordinal)
        # order, a lane's Projections get their pks in the order one receipt after the other would have given
        # them (pk is the last tie-breaker of a lane's order).
        _immediate_batch([_Item(seq, i.n, i.event_pk, i.disposition) for seq, (_, i) in enumerate(new)], route, ctx,
                         profile_id, replay is not None, account_id, out)


def receipt_materialize(*, receipt_pk: int, account_id: int | None = None) -> Materialized:
    """`receipts_materialize` of one receipt. `account_id`: the receipt's account as the caller knows it (the
    first read names it, docs/scale-out.md); None reads it from the receipt first."""
    if account_id is None:
        account_id = Receipt.objects.filter(pk=receipt_pk).values_list("account_id", flat=True).get()
    return receipts_materialize(receipt_pks=[receipt_pk], account_id=account_id)
