"""Lane and window steps: `lane_advance` applies the lane's ordering contract and mints at most one active
Execution per lane; `lane_gap_deadline` applies a strict gap's frozen disposition; `window_seal_due` seals a
window whose max age passed. Split from connector.services.execution (module size, D-260), which re-exports
these names."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from connector import locks
from connector.choices import LaneState, OrderingContract
from connector.models import (
    Execution,
    GapDecision,
    OrderingLane,
    Projection,
    ProjectionWindow,
    SupersededDecision,
)
from connector.selectors.routes import route_for
from connector.services import lanes
from connector.services.audit import audit_record
from connector.services.guard import lock_serving
from connector.services.materialize import mint_execution, window_seal

from connector.services.claims import CLAIMANT


# Frozen route defaults (docs/ordering.md): no settle window, and a strict gap waits 5 minutes before its frozen
# disposition applies.
DEFAULT_SETTLE_SECONDS = 0
DEFAULT_GAP_DEADLINE_SECONDS = 300


def _lane_row(lane: OrderingLane):
    """The locked lane's row for a compare-and-set, named with its account too (single-shard on the scale-out path,
    D-241)."""
    return OrderingLane.objects.filter(pk=lane.pk, account_id=lane.account_id)


def _supersede(lane: OrderingLane, projection: Projection, reason: str, selected: Decimal | None) -> None:
    SupersededDecision.objects.create(lane=lane, projection=projection, position=projection.position,
                                      high_water_at_decision=lane.high_water, selected_position=selected,
                                      reason=reason)
    Projection.objects.filter(pk=projection.pk, account_id=projection.account_id,
                              lane_status="pending").update(lane_status="superseded")


def lane_advance(*, lane_pk: int, account_id: int | None = None) -> Execution | None:
    """One fenced step of a lane: for `latest_source_position`, supersede everything but the greatest pending
    position above the high-water and mint its Execution; for `strict_source_sequence`, supersede positions
    at or below the high-water, mint only the exact successor, and otherwise record that a gap is waiting (no
    lease is held while it waits). Nothing happens while the lane has an active Execution or is halted, except
    that a halted lane whose halting execution has a pending replay resumes for it (`lanes.replay_resumption`).
    `account_id`: the lane's account as the caller knows it (task message, sweeper row), named by the first read
    (docs/scale-out.md); None reads the lane by its pk alone."""
    lanes_of = OrderingLane.objects if account_id is None else OrderingLane.objects.filter(account_id=account_id)
    lane = lanes_of.select_related("epoch").defer("epoch__preimage").get(pk=lane_pk)
    profile_id = lane.epoch.profile_id  # read here: the relocked lane's `.epoch` would load the preimage (D-251)
    with transaction.atomic():
        ctx = lock_serving(account_id=lane.account_id, epoch_id=lane.epoch.epoch_id,
                           epoch_digest=bytes(lane.epoch.digest))
        lane = locks.lane_for_update(lane_pk, account_id=lane.account_id)
        if lane.active_execution_id is not None:
            return None
        route = route_for(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, account_id=lane.account_id,
                          channel=lane.route)
        if lane.state != LaneState.OPEN:
            # Only an authorized fact reopens a halted lane: here, a replay of the execution that halted it.
            replayed = lanes.replay_resumption(lane, ctx)
            if replayed is None:
                return None
            return _mint_on_lane(lane, replayed, route, ctx, profile_id)
        pending = list(Projection.objects.filter(lane=lane, account_id=lane.account_id, lane_status="pending")
                       .order_by("position", "tie_breaker", "pk"))
        if not pending:
            return None
        chosen = apply_contract(lane, pending, route)
        if chosen is None:
            return None
        return _mint_on_lane(lane, chosen, route, ctx, profile_id)


def apply_contract(lane: OrderingLane, pending: list[Projection], route) -> Projection | None:
    """The lane's ordering contract over its pending Projections (`pending`, non-empty, ordered by position,
    tie-breaker, pk), on the lane locked `FOR UPDATE`: supersede what the contract supersedes, move the gap
    marker, and return the Projection to mint, or None (the lane's fence then already advanced where the contract
    changed anything). Shared by `lane_advance` and the batched advance (D-295), so both decide alike."""
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
                _lane_row(lane).update(gap_since=timezone.now(), fence=lane.fence + 1)
            elif not waiting and lane.gap_since is not None:
                _lane_row(lane).update(gap_since=None, fence=lane.fence + 1)
            return None
    if chosen is None:
        _lane_row(lane).update(fence=lane.fence + 1)
    return chosen


def _mint_on_lane(lane: OrderingLane, projection: Projection, route, ctx, profile_id: str) -> Execution:
    execution = mint_execution(projection=projection, route=route, ctx=ctx, profile_id=profile_id, lane=lane)
    _lane_row(lane).update(active_execution=execution, gap_since=None, fence=lane.fence + 1)
    return execution


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
            _lane_row(lane).update(gap_since=None, fence=lane.fence + 1)
            return None
        disposition = route.ordering.get("gap_disposition", "quarantine_partition")
        GapDecision.objects.create(lane=lane, expected_position=expected, next_available=nxt, disposition=disposition)
        audit_record(actor=CLAIMANT, entity=lane, action="lane_gap_deadline", fence=lane.fence + 1,
                     reason=f"{disposition}: expected {expected}, next available {nxt}")
        if disposition == "skip_with_evidence" and nxt is not None:
            _lane_row(lane).update(high_water=nxt - 1, gap_since=None, fence=lane.fence + 1)
        else:
            _lane_row(lane).update(state=LaneState.HALTED, halt_reason="GAP_DEADLINE",
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
