"""What became of an admitted Receipt, read from PostgreSQL: settled (it reached an ApplicationResult, was superseded
by the ordering contract, or waits visibly for a human with a closed reason code on the quarantine board) or still
pending. The hostile HTTP suite requires every 201 to settle within 30 s (issue 15)."""
from __future__ import annotations

from django.db.models import Q

from connector.models import ApplicationResult, Execution, MaterializationDue, Projection, ReceiptComponent
from governance.reasons import REASONS


def _event_outcome(event_id: int) -> str | None:
    projection = Projection.objects.filter(Q(event_id=event_id) | Q(window__members__event_id=event_id)) \
        .select_related("lane", "window").first()
    if projection is None:
        return None
    if projection.lane_status == "superseded":
        return "superseded"
    for execution in Execution.objects.filter(projection=projection).order_by("-generation"):
        if execution.state == "completed":
            result = ApplicationResult.objects.filter(command_id=execution.command_id).first()
            return f"applied:{result.outcome}" if result else None
        if execution.state == "quarantined":
            return _visible(execution.quarantine_reason)
    if projection.window is not None and projection.window.quarantine_reason:
        return _visible(projection.window.quarantine_reason)
    if projection.lane is not None and projection.lane.state == "halted":
        return _visible(projection.lane.halt_reason)
    return None


def _visible(code: str) -> str:
    """A quarantine counts as settled only with a reason the board knows (a closed code with a remedy)."""
    assert code in REASONS, f"quarantined with {code!r}, which the quarantine board does not know"
    return f"quarantined:{code}"


def receipt_outcome(receipt_id: int) -> str | None:
    """'applied:<outcome>', 'superseded', 'quarantined:<code>' (per component, joined), or None while pending."""
    due = MaterializationDue.objects.filter(receipt_id=receipt_id).first()
    if due is not None:
        return _visible(due.held_reason) if due.held_reason else None
    outcomes = []
    components = list(ReceiptComponent.objects.filter(receipt_id=receipt_id).order_by("ordinal"))
    if not components:
        return None
    for component in components:
        if component.disposition == "quarantined":
            outcomes.append(_visible(component.reason_code))
            continue
        outcome = _event_outcome(component.event_id)
        if outcome is None:
            return None
        outcomes.append(outcome)
    return ",".join(sorted(set(outcomes)))
