"""The way out of a halted ordering lane (CV2-13-001..005, CV2-06-013/015; decisions D-192, D-193).

A halted lane reopens only through an authorized fact, under a new fence, never because time passed:

- `lane_resume(mode="missing_arrived")`: a GAP_DEADLINE halt whose missing position has since arrived. The lane
  reopens with its high-water unchanged; the late events then apply in order (5, 6, 7 ...). Refused while the
  missing position is still absent: a resume would cross the gap.
- `lane_resume(mode="skip_with_evidence")`: an operator's authoritative evidence that the lane may move past the
  blocking position (the provider confirms the sequence number was never issued; a rejected record was
  superseded at the source). A GAP_DEADLINE lane moves its high-water to just below the next available position,
  as the frozen `skip_with_evidence` disposition would (a GapDecision is appended); a strict lane halted by a
  quarantined execution moves its high-water to that position; a latest-position lane keeps it (the next greater
  position is selected as usual). The quarantined execution stays as it is (CV2-13-003).
- `replay_resumption` (called by `lane_advance`): a ReplayRequest of the quarantined execution that halted the
  lane is the operator's authorization; its execution runs first, and the lane continues if it completes.

Each writes one append-only LaneResumption and an audit row. An OrderingHandoff freeze is terminal here: the
predecessor lane is never resumed after the first handoff.
"""
from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from connector import locks
from connector.actors import Actor
from connector.choices import LaneState, OrderingContract
from connector.errors import ConnectorError, FenceStale, PermissionRefused, TransitionRefused
from connector.models import Execution, GapDecision, LaneResumption, OrderingLane, Projection
from connector.selectors.lanes import (
    EXECUTION_HALTS,
    GAP_DEADLINE,
    expected_position,
    halting_execution,
)
from connector.selectors.routes import route_for
from connector.services.audit import audit_record
from connector.services.guard import ServingContext, lock_serving

PERMISSION = "connector.resume_orderinglane"
OPERATOR_MODES = ("missing_arrived", "skip_with_evidence")


class LaneResumeRefused(ConnectorError):
    """The lane cannot be resumed this way: it is not halted for a reason this mode remedies, or the mode needs
    evidence it lacks. Nothing was written."""

    code = "LANE_RESUME_REFUSED"
    http_status = 409
    operator_action = "Read the lane's halt reason and use the remediation the board lists for it."


class LaneGapOpen(ConnectorError):
    """The missing position has not arrived: resuming would cross the gap (CV2-06-013). Nothing was written."""

    code = "LANE_GAP_OPEN"
    http_status = 409
    operator_action = "Obtain the missing event from the provider, or resume with skip_with_evidence and the " \
                      "provider's authoritative evidence that the position will never exist."


def _record(lane: OrderingLane, *, mode: str, blocking: Decimal, high_water_after, evidence: str, actor: Actor,
            replay_request=None, active_execution: Execution | None = None) -> LaneResumption:
    """Append the resumption and reopen the lane under fence + 1 (caller holds the lane lock)."""
    resumption = LaneResumption.objects.create(
        lane=lane, halt_reason=lane.halt_reason, mode=mode, blocking_position=blocking,
        high_water_before=lane.high_water, high_water_after=high_water_after, fence_before=lane.fence,
        fence_after=lane.fence + 1, replay_request=replay_request, evidence=evidence, actor=str(actor))
    OrderingLane.objects.filter(pk=lane.pk, fence=lane.fence).update(
        state=LaneState.OPEN, halt_reason="", gap_since=None, high_water=high_water_after,
        active_execution=active_execution, fence=lane.fence + 1)
    audit_record(actor=actor, entity=lane, action=f"lane_resume_{mode}", from_state=LaneState.HALTED,
                 to_state=LaneState.OPEN, fence=lane.fence + 1,
                 reason=f"{resumption.halt_reason} at position {blocking}: {evidence}"[:500])
    return resumption


def lane_resume(*, lane_pk: int, mode: str, evidence: str, actor: Actor, expected_fence: int) -> LaneResumption:
    """Reopen a halted lane by an operator's remediation (see the module docstring for the modes).

    Preconditions: the actor holds `connector.resume_orderinglane`; non-blank evidence; `expected_fence` is the
    fence the operator saw (FENCE_STALE otherwise); the lane is halted for GAP_DEADLINE (both modes) or by a
    quarantined execution (`skip_with_evidence` only); for `missing_arrived` the exact missing position is pending.
    Locks: the serving guard on the lane's own epoch (gate and epoch FOR SHARE), then the lane FOR UPDATE.
    Writes: one LaneResumption (+ a GapDecision for a skipped gap), the lane (open, fence + 1), an audit row.
    Raises LaneResumeRefused, LaneGapOpen, FenceStale, GateNotServing, TransitionRefused, PermissionRefused."""
    if mode not in OPERATOR_MODES:
        raise LaneResumeRefused(f"mode must be one of {', '.join(OPERATOR_MODES)} (a replay resumes by itself)")
    if actor.user is not None and not actor.user.has_perm(PERMISSION):
        raise PermissionRefused(f"{actor} lacks the {PERMISSION} permission")
    if not evidence.strip():
        raise LaneResumeRefused("a resume needs authoritative evidence (a provider query, a ticket)")
    lane = OrderingLane.objects.select_related("epoch").defer("epoch__preimage").get(pk=lane_pk)
    with transaction.atomic():
        ctx = lock_serving(account_id=lane.account_id, epoch_id=lane.epoch.epoch_id,
                           epoch_digest=bytes(lane.epoch.digest))
        lane = locks.lane_for_update(lane_pk)
        if lane.fence != expected_fence:
            raise FenceStale(f"lane #{lane_pk} moved to fence {lane.fence} since fence {expected_fence} was shown; "
                             "reload and decide again")
        if lane.state != LaneState.HALTED:
            raise TransitionRefused(f"lane #{lane_pk} is {lane.state}; only a halted lane is resumed")
        route = route_for(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, account_id=lane.account_id,
                          channel=lane.route)
        if lane.halt_reason == GAP_DEADLINE:
            return _resume_gap(lane, route, mode=mode, evidence=evidence, actor=actor)
        if lane.halt_reason in EXECUTION_HALTS and mode == "skip_with_evidence":
            return _skip_quarantined(lane, evidence=evidence, actor=actor)
        raise LaneResumeRefused(f"lane #{lane_pk} is halted by {lane.halt_reason}, which {mode} does not remedy")


def _resume_gap(lane: OrderingLane, route, *, mode: str, evidence: str, actor: Actor) -> LaneResumption:
    expected = expected_position(lane, int(route.ordering.get("first_position", 1)))
    pending = Projection.objects.filter(lane=lane, lane_status="pending")
    if mode == "missing_arrived":
        if not pending.filter(position=expected).exists():
            raise LaneGapOpen(f"position {expected} has not arrived on lane #{lane.pk}: a resume would cross the gap")
        return _record(lane, mode=mode, blocking=expected, high_water_after=lane.high_water, evidence=evidence,
                       actor=actor)
    nxt = pending.filter(position__gt=expected).order_by("position").values_list("position", flat=True).first()
    if nxt is None:
        raise LaneResumeRefused(f"nothing waits beyond position {expected}: there is no gap to skip")
    GapDecision.objects.create(lane=lane, expected_position=expected, next_available=nxt,
                               disposition="operator_skip_with_evidence")
    return _record(lane, mode=mode, blocking=expected, high_water_after=nxt - 1, evidence=evidence, actor=actor)


def _skip_quarantined(lane: OrderingLane, *, evidence: str, actor: Actor) -> LaneResumption:
    halting = halting_execution(lane)
    if halting is None:
        raise LaneResumeRefused(f"lane #{lane.pk} names {lane.halt_reason} but no quarantined execution halted it")
    position = halting.projection.position
    high_water = lane.high_water
    if lane.contract == OrderingContract.STRICT_SOURCE_SEQUENCE:
        high_water = position if high_water is None or position > high_water else high_water
    return _record(lane, mode="skip_with_evidence", blocking=position, high_water_after=high_water,
                   evidence=evidence, actor=actor)


def replay_resumption(lane: OrderingLane, ctx: ServingContext) -> Projection | None:
    """Inside `lane_advance` (lane locked, guard held): if the lane is halted by a quarantined execution and a
    replay of that execution's source event is pending at exactly its position, reopen the lane under a new fence
    for it and return its projection (the caller mints its execution first). Else None: the lane stays halted."""
    assert transaction.get_connection().in_atomic_block
    halting = halting_execution(lane)
    if halting is None or halting.projection.event_id is None:
        return None
    replay = (Projection.objects.select_related("event", "event__replay_request")
              .filter(lane=lane, lane_status="pending", position=halting.projection.position,
                      event__replay_request__isnull=False,
                      event__source_event_key=halting.projection.event.source_event_key)
              .order_by("pk").first())
    if replay is None:
        return None
    request = replay.event.replay_request
    _record(lane, mode="replay", blocking=replay.position, high_water_after=lane.high_water,
            evidence=f"replay request {request.request_id} by {request.principal}: {request.reason}",
            actor=Actor.system("claimant"), replay_request=request)
    lane.state, lane.halt_reason, lane.fence = LaneState.OPEN, "", lane.fence + 1
    return replay
