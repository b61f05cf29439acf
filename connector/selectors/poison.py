"""Read paths of poison-item evidence (D-168) that every app's operator surface shows: the StepFailure rows of
one item, newest first (CV2-13-001). Reads only; takes no lock."""
from __future__ import annotations

from connector.choices import LaneState, StepFailureReason
from connector.models import MaterializationDue, OrderingLane, StepFailure


def step_failures_of(entity, *, limit: int) -> list[StepFailure]:
    """The item's StepFailure rows, newest first (the item is named by its model label and primary key)."""
    return list(StepFailure.objects.filter(entity_type=type(entity)._meta.label, entity_id=str(entity.pk))
                .order_by("-at", "-pk")[:limit])



def held_receipts(*, account_key: str | None = None) -> list[int]:
    """Receipts whose MaterializationDue row is held (MATERIALIZATION_FAILED), oldest hold first; of one account
    when `account_key` is given. Reads only (the release re-checks the hold under the receipt's lock)."""
    rows = MaterializationDue.objects.exclude(held_reason="")
    if account_key is not None:
        rows = rows.filter(receipt__account__account_key=account_key)
    return list(rows.order_by("held_at", "receipt_id").values_list("receipt_id", flat=True))


def lanes_step_failed(*, account_key: str | None = None) -> list[int]:
    """Lanes halted with LANE_STEP_FAILED (the only halt `lane_release` reopens), by pk; of one account when
    `account_key` is given. Reads only."""
    rows = OrderingLane.objects.filter(state=LaneState.HALTED, halt_reason=StepFailureReason.LANE_STEP_FAILED)
    if account_key is not None:
        rows = rows.filter(account__account_key=account_key)
    return list(rows.order_by("pk").values_list("pk", flat=True))
