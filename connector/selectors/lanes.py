"""Read paths of halted lanes and their remediation: what halted a lane and when (the board's times come from that
fact, never from the lane row), which position blocks it, and whether a replay of a quarantined execution will run
(the board recommends replay only where it runs). Read-only."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from connector.choices import ExecutionState, GateMode, LaneState, OrderingContract
from connector.models import (
    AccountServingGate,
    Execution,
    GapDecision,
    LaneResumption,
    OrderingLane,
    Projection,
    ReplayRequest,
)

GAP_DEADLINE = "GAP_DEADLINE"
ORDERING_HANDOFF = "ORDERING_HANDOFF"
# Lane halts caused by a quarantined execution (decision 6): remedied by a replay, or skipped with evidence.
EXECUTION_HALTS = ("RESULT_FAILED", "RESULT_REJECTED", "DEPENDENCY_EXPIRED", "DEPENDENCY_REJECTED",
                   "EXECUTION_STEP_FAILED")  # a quarantined execution halted the lane (D-168)


@dataclass(frozen=True)
class HaltFact:
    at: datetime
    what: str  # a human description of the fact, with its identity
    blocking_position: Decimal | None


def halting_execution(lane: OrderingLane) -> Execution | None:
    """The quarantined execution whose result halted the lane (the latest one with the lane's halt reason)."""
    if lane.state != LaneState.HALTED or lane.halt_reason not in EXECUTION_HALTS:
        return None
    return (Execution.objects.select_related("projection", "projection__event")
            .filter(lane=lane, state=ExecutionState.QUARANTINED, quarantine_reason=lane.halt_reason)
            .order_by("-pk").first())


def expected_position(lane: OrderingLane, first_position: int = 1) -> Decimal:
    """The exact successor a strict lane waits for."""
    return lane.high_water + 1 if lane.high_water is not None else Decimal(first_position)


def lane_halt_fact(lane: OrderingLane) -> HaltFact | None:
    """The fact that halted the lane: the GapDecision that applied `quarantine_partition`, or the quarantined
    execution's result. None for an open lane or a halt with no such fact (an OrderingHandoff freeze, whose fact
    lives in the cutover app)."""
    if lane.state != LaneState.HALTED:
        return None
    if lane.halt_reason == GAP_DEADLINE:
        decision = (GapDecision.objects.filter(lane=lane, disposition="quarantine_partition")
                    .order_by("-pk").first())
        if decision is not None:
            return HaltFact(decision.decided_at, f"gap decision #{decision.pk}: position "
                            f"{decision.expected_position} missing, next available {decision.next_available}",
                            decision.expected_position)
    execution = halting_execution(lane)
    if execution is not None:
        return HaltFact(execution.changed_at, f"execution #{execution.pk} quarantined ({execution.quarantine_reason})",
                        execution.projection.position)
    return None


def pending_positions(lane: OrderingLane) -> list[Decimal]:
    return list(Projection.objects.filter(lane=lane, lane_status="pending").order_by("position")
                .values_list("position", flat=True).distinct())


@dataclass(frozen=True)
class Outlook:
    runs: bool
    why: str


def replay_outlook(execution: Execution) -> Outlook:
    """Whether a ReplayRequest of this quarantined execution's event would run now, and why (the board recommends
    replay only where it runs). The high-water counts completed positions only (decision 6, CV2-06-014), so a
    quarantined position stays above it; the replay runs unless the lane is halted by something else or moved past
    the position meanwhile."""
    if execution.state != ExecutionState.QUARANTINED:
        return Outlook(False, f"execution is {execution.state}; only a quarantined execution is remedied by replay")
    projection = execution.projection
    if projection.event_id is None:
        return Outlook(False, "a window execution has no single source event: replay its member events")
    gate = AccountServingGate.objects.filter(account_id=execution.account_id).first()
    if gate is None or gate.mode != GateMode.V2_SERVING:
        return Outlook(False, f"the account gate is {getattr(gate, 'mode', 'missing')}: replay needs v2_serving")
    if gate.epoch_id != execution.epoch_id:
        return Outlook(False, "the execution's epoch no longer serves: a replay would be ordered on the successor "
                              "epoch's lane, not this one")
    lane = execution.lane
    if lane is None:
        return Outlook(True, "runs as a new execution generation with external effects suppressed")
    lane = OrderingLane.objects.get(pk=lane.pk)
    position = projection.position
    if lane.state == LaneState.HALTED:
        halting = halting_execution(lane)
        if halting is not None and halting.projection.position == position:
            return Outlook(True, f"runs first at position {position} and resumes the halted partition; later "
                                 "positions follow in order, with external effects of the replay suppressed")
        return Outlook(False, f"the partition is halted by {lane.halt_reason}: remediate that first")
    if lane.high_water is not None and position <= lane.high_water:
        return Outlook(False, f"would be superseded: position {position} is at or below the lane high-water "
                              f"{lane.high_water}")
    if lane.contract == OrderingContract.STRICT_SOURCE_SEQUENCE and position != expected_position(lane):
        return Outlook(False, f"waits: the strict lane expects position {expected_position(lane)} first")
    return Outlook(True, "runs in order on its lane with external effects suppressed")


def remediation_request_id(execution_pk: int) -> str:
    """The ReplayRequest ID of the remediation of one quarantined execution (one per execution)."""
    return f"execution-{execution_pk}-replay"


def execution_remedy(execution: Execution) -> str:
    """The remediation already taken for a quarantined execution, or "" while it still waits for one: a replay of
    its source event admitted after the quarantine (its own execution is then followed on its own), or a
    resumption of its lane past its position. The quarantined execution itself never changes (CV2-13-003)."""
    projection = execution.projection
    if projection.event_id is not None:
        replays = ReplayRequest.objects.filter(predecessor_event_id=projection.event_id).order_by("pk")
        request = (replays.filter(request_id=remediation_request_id(execution.pk)).first()
                   or replays.filter(created_at__gte=execution.changed_at).first())
        if request is not None:
            return f"replayed by {request.request_id}"
    if execution.lane_id is not None:
        resumption = (LaneResumption.objects.filter(lane_id=execution.lane_id, halt_reason=execution.quarantine_reason,
                                                    blocking_position=projection.position,
                                                    resumed_at__gte=execution.changed_at).order_by("pk").first())
        if resumption is not None:
            return f"its lane resumed past it ({resumption.mode}, resumption #{resumption.pk})"
    return ""


def lane_account(lane_pk: int) -> int | None:
    """The account of a lane (None: no such lane), for a caller that knows only the lane's pk."""
    return OrderingLane.objects.filter(pk=lane_pk).values_list("account_id", flat=True).first()
