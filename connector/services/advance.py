"""Lane and window steps: `lanes_advance` applies each lane's ordering contract and mints at most one active
Execution per lane (one lane is a batch of one); `lane_gap_deadline` applies a strict gap's frozen disposition;
`window_seal_due` seals a window whose max age passed. Split from connector.services.execution (module size,
D-260), which re-exports these names."""
from __future__ import annotations

import hashlib
from datetime import timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from connector import locks, tracing
from connector.choices import LaneState, OrderingContract
from connector.models import (
    Execution,
    ExecutionTrace,
    GapDecision,
    OrderingLane,
    Projection,
    ProjectionTrace,
    ProjectionWindow,
    SupersededDecision,
)
from connector.selectors.lanes import lane_account
from connector.errors import GateNotServing
from connector.selectors.routes import epoch_profile, route_for
from connector.faults import fault_point
from connector.services import lanes as lanes_services
from connector.services.audit import audit_record
from connector.services.guard import lock_serving
from connector.services.materialize import command_id_for, execution_ref, window_seal
from connector.services.set_insert import insert_rows

from connector.services.claims import CLAIMANT


# Frozen route defaults (docs/ordering.md): no settle window, and a strict gap waits 5 minutes before its frozen
# disposition applies.
DEFAULT_SETTLE_SECONDS = 0
DEFAULT_GAP_DEADLINE_SECONDS = 300


def lane_row(lane: OrderingLane):
    """The locked lane's row for a compare-and-set, named with its account too (single-shard on the scale-out path,
    D-241)."""
    return OrderingLane.objects.filter(pk=lane.pk, account_id=lane.account_id)


def _supersede(lane: OrderingLane, projection: Projection, reason: str, selected: Decimal | None) -> None:
    SupersededDecision.objects.create(lane=lane, projection=projection, position=projection.position,
                                      high_water_at_decision=lane.high_water, selected_position=selected,
                                      reason=reason)
    Projection.objects.filter(pk=projection.pk, account_id=projection.account_id,
                              lane_status="pending").update(lane_status="superseded")


# The chosen Projections' next generation, compare-and-set on the generation each was read at: a row another writer
# moved is not updated, and the count check rolls the transaction back.
_GENERATIONS_SQL = """
UPDATE connector_projection p
   SET execution_generation = u.generation, lane_status = 'minted'
  FROM unnest(%(ids)s::bigint[], %(generations)s::integer[]) AS u(id, generation)
 WHERE p.id = u.id AND p.account_id = %(account)s AND p.execution_generation = u.generation - 1"""

# The lanes' active Execution and fence (the row trigger requires the fence to advance by one).
_LANES_SQL = """
UPDATE connector_orderinglane l
   SET active_execution_id = u.execution_id, gap_since = NULL, fence = u.fence
  FROM unnest(%(ids)s::bigint[], %(executions)s::bigint[], %(fences)s::bigint[]) AS u(id, execution_id, fence)
 WHERE l.id = u.id AND l.account_id = %(account)s"""


def lanes_advance(*, lane_pks, account_id: int) -> list[int]:
    """One fenced step of each lane of `lane_pks` (all of account `account_id`; one lane is a batch of one), in one
    guarded transaction; returns the Executions minted, in ascending lane pk. Per lane: for
    `latest_source_position`, supersede everything but the greatest pending position above the high-water and
    mint its Execution; for `strict_source_sequence`, supersede positions at or below the high-water, mint only
    the exact successor, and otherwise record that a gap is waiting (no lease is held while it waits)
    (`apply_contract`). Nothing happens on a lane with an active Execution, or on a halted one, except that a
    halted lane whose halting execution has a pending replay resumes for it (`lanes.replay_resumption`).

    Locks: the account's guard (epoch and gate FOR SHARE, gate `v2_serving`), then the lanes FOR UPDATE in
    ascending pk. A lane of another epoch than the one the gate serves refuses with GATE_NOT_SERVING, as a guard
    on its own epoch does, and the whole transaction rolls back (the caller splits the batch: `poison.isolated_batches`).

    Statements for any number of lanes, when each mints: BEGIN, the guard, the lanes, their pending Projections,
    the generations, the Executions, the lanes' active Executions, COMMIT (a superseded Projection, a gap marker
    or a replay resumption adds that lane's own statements). Fault point `advance.before_commit` fires before the
    COMMIT."""
    if not lane_pks:
        return []
    with transaction.atomic():
        ctx = lock_serving(account_id=account_id)
        lanes = locks.account_lanes_for_update(lane_pks, account_id=account_id)
        if len(lanes) != len(set(lane_pks)):  # a pk of another account, or none at all: as the lane read refuses
            raise OrderingLane.DoesNotExist(f"lanes {sorted(set(lane_pks) - {lane.pk for lane in lanes})} of "
                                            f"account {account_id} do not exist")
        for lane in lanes:
            if lane.epoch_id != ctx.epoch_pk:  # as a guard on the lane's own epoch refuses it
                raise GateNotServing(f"lane {lane.pk} is bound to another epoch; the gate serves {ctx.epoch_id}")
        routes: dict[str, object] = {}

        def route_of(lane: OrderingLane):
            if lane.route not in routes:
                routes[lane.route] = route_for(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest,
                                               account_id=account_id, channel=lane.route)
            return routes[lane.route]

        idle = {lane.pk: lane for lane in lanes if lane.active_execution_id is None and lane.state == LaneState.OPEN}
        pending: dict[int, list[Projection]] = {}
        for p in (Projection.objects.filter(lane_id__in=sorted(idle), account_id=account_id, lane_status="pending")
                  .order_by("lane_id", "position", "tie_breaker", "pk")) if idle else ():
            pending.setdefault(p.lane_id, []).append(p)
        mint = []
        for lane in lanes:
            if lane.active_execution_id is not None:
                continue
            if lane.state != LaneState.OPEN:
                # Only an authorized fact reopens a halted lane: here, a replay of the execution that halted it.
                chosen = lanes_services.replay_resumption(lane, ctx)
            elif lane.pk in pending:
                chosen = apply_contract(lane, pending[lane.pk], route_of(lane))
            else:
                chosen = None
            if chosen is not None:
                mint.append((lane, chosen, route_of(lane)))
        minted = _mint(mint, ctx, epoch_profile(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest),
                       account_id) if mint else []
        fault_point("advance.before_commit")
    return minted


def lane_advance(*, lane_pk: int, account_id: int | None = None) -> Execution | None:
    """`lanes_advance` of one lane, returning the Execution it minted (None: nothing to mint). `account_id`: the
    lane's account as the caller knows it; None reads it from the lane first."""
    if account_id is None:
        account_id = lane_account(lane_pk)
        if account_id is None:
            raise OrderingLane.DoesNotExist(f"no lane {lane_pk}")
    minted = lanes_advance(lane_pks=[lane_pk], account_id=account_id)
    return Execution.objects.get(pk=minted[0], account_id=account_id) if minted else None


def _mint(mint: list, ctx, profile_id: str, account_id: int) -> list[int]:
    """`mint_execution` for each (lane, chosen Projection, route), set-based, lanes in ascending pk."""
    rows, ids, generations = [], [], []
    for lane, projection, route in mint:
        generation = projection.execution_generation + 1
        command_id = command_id_for(projection.identity_digest, generation)
        ref = execution_ref(command_id=command_id, projection=projection, generation=generation, route=route,
                            epoch_digest=ctx.epoch_digest, profile_id=profile_id)
        rows.append(dict(projection_id=projection.pk, generation=generation, account_id=account_id,
                         epoch_id=projection.epoch_id, lane_id=lane.pk, command_id=command_id, execution_ref=ref,
                         execution_ref_digest=hashlib.sha256(ref).digest()))
        ids.append(projection.pk)
        generations.append(generation)
    connection = transaction.get_connection()
    with connection.cursor() as cursor:
        cursor.execute(_GENERATIONS_SQL, {"ids": ids, "generations": generations, "account": account_id})
        if cursor.rowcount != len(ids):
            raise AssertionError(f"lanes_advance: {cursor.rowcount} of {len(ids)} generations moved")
    executions = [pk for (pk,) in insert_rows(Execution, rows)]
    with connection.cursor() as cursor:
        cursor.execute(_LANES_SQL, {"ids": [lane.pk for lane, _, _ in mint], "executions": executions,
                                    "fences": [lane.fence + 1 for lane, _, _ in mint], "account": account_id})
        if cursor.rowcount != len(mint):
            raise AssertionError(f"lanes_advance: {cursor.rowcount} of {len(mint)} lanes moved")
    for execution_pk, (_, projection, _) in zip(executions, mint):  # issue 21: the claim continues each trace
        tracing.minted(ExecutionTrace, execution_pk, name="lane_advance", parent=ProjectionTrace,
                       projection_id=projection.pk)
    return executions


def apply_contract(lane: OrderingLane, pending: list[Projection], route) -> Projection | None:
    """The lane's ordering contract over its pending Projections (`pending`, non-empty, ordered by position,
    tie-breaker, pk), on the lane locked `FOR UPDATE`: supersede what the contract supersedes, move the gap
    marker, and return the Projection to mint, or None (the lane's fence then already advanced where the contract
    changed anything)."""
    chosen = None
    hw = lane.high_water
    if lane.contract == OrderingContract.LATEST_SOURCE_POSITION:
        settle = int(route.ordering.get("settle_seconds", DEFAULT_SETTLE_SECONDS))
        if settle and max(p.created_at for p in pending) > timezone.now() - timedelta(seconds=settle):
            return None  # the settle window is still open
        top = pending[-1]
        for p in pending:
            if hw is not None and p.position <= hw:
                _supersede(lane, p, "at_or_below_high_water", None)
            elif p is not top:
                _supersede(lane, p, "lower_than_selected", top.position)
        if hw is None or top.position > hw:
            chosen = top
    else:  # strict_source_sequence
        expected = (hw + 1) if hw is not None else Decimal(route.ordering.get("first_position", 1))
        waiting = False
        for p in pending:
            if p.position < expected:
                _supersede(lane, p, "at_or_below_high_water", None)
            elif p.position == expected and chosen is None:
                chosen = p
            elif p.position > expected:
                waiting = True
        if chosen is None:
            # A gap exists only while a later position waits for the missing one; stale duplicates alone
            # never open (or keep open) a gap.
            if waiting and lane.gap_since is None:
                lane_row(lane).update(gap_since=timezone.now(), fence=lane.fence + 1)
            elif not waiting and lane.gap_since is not None:
                lane_row(lane).update(gap_since=None, fence=lane.fence + 1)
            return None
    if chosen is None:
        lane_row(lane).update(fence=lane.fence + 1)
    return chosen


def lane_gap_deadline(*, lane_pk: int) -> str | None:
    """Apply the frozen gap disposition once a strict lane's gap outlived its deadline: `quarantine_partition`
    halts the lane with a reason code; `skip_with_evidence` appends a GapDecision and moves past the gap."""
    lane = OrderingLane.objects.select_related("epoch").defer("epoch__preimage").get(pk=lane_pk)
    with transaction.atomic():
        ctx = lock_serving(account_id=lane.account_id, epoch_id=lane.epoch.epoch_id,
                           epoch_digest=bytes(lane.epoch.digest))
        lane = locks.lane_for_update(lane_pk)
        route = route_for(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, account_id=lane.account_id,
                          channel=lane.route)
        deadline = int(route.ordering.get("gap_deadline_seconds", DEFAULT_GAP_DEADLINE_SECONDS))
        if (lane.contract != OrderingContract.STRICT_SOURCE_SEQUENCE or lane.gap_since is None
                or lane.active_execution_id or lane.state != LaneState.OPEN
                or lane.gap_since > timezone.now() - timedelta(seconds=deadline)):
            return None
        expected = (lane.high_water + 1) if lane.high_water is not None else Decimal(
            route.ordering.get("first_position", 1))
        nxt = (Projection.objects.filter(lane=lane, lane_status="pending", position__gt=expected)
               .order_by("position").values_list("position", flat=True).first())
        if nxt is None:  # nothing waits beyond the gap any more: there is no gap to decide
            lane_row(lane).update(gap_since=None, fence=lane.fence + 1)
            return None
        disposition = route.ordering.get("gap_disposition", "quarantine_partition")
        GapDecision.objects.create(lane=lane, expected_position=expected, next_available=nxt, disposition=disposition)
        audit_record(actor=CLAIMANT, entity=lane, action="lane_gap_deadline", fence=lane.fence + 1,
                     reason=f"{disposition}: expected {expected}, next available {nxt}")
        if disposition == "skip_with_evidence" and nxt is not None:
            lane_row(lane).update(high_water=nxt - 1, gap_since=None, fence=lane.fence + 1)
        else:
            lane_row(lane).update(state=LaneState.HALTED, halt_reason="GAP_DEADLINE",
                                                           fence=lane.fence + 1)
        return disposition


def window_seal_due(*, window_pk: int) -> Execution | None:
    """Seal a window whose max age passed (the sweeper's close policy). Races new input on the window row lock:
    whichever commits first decides the membership; later input opens a successor window."""
    window = ProjectionWindow.objects.select_related("epoch").defer("epoch__preimage").get(pk=window_pk)
    profile_id = window.epoch.profile_id  # the relocked window's `.epoch` would load the preimage (D-251)
    with transaction.atomic():
        ctx = lock_serving(account_id=window.account_id, epoch_id=window.epoch.epoch_id,
                           epoch_digest=bytes(window.epoch.digest))
        window = locks.window_for_update(window_pk)
        if window.state != "open" or window.closes_at > timezone.now() or window.member_count == 0:
            return None
        route = route_for(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, account_id=window.account_id,
                          channel=window.route)
        return window_seal(window, route, ctx, profile_id)
