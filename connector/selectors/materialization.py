"""Read path of the materialization to-do rows (MaterializationDue, CV2-05-017): which receipts a batch
materializer takes next. PostgreSQL is the authority; a wake-up only says "look here" (issue 18, D-269)."""
from __future__ import annotations

from datetime import datetime

from django.db.models import F

from connector.models import MaterializationDue


def due_receipts(*, account_id: int | None, limit: int, skip: set[int] | frozenset[int] = frozenset(),
                 before: datetime | None = None, slot: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """Up to `limit` (receipt pk, account pk) pairs due for materialization and not held, oldest first.
    `account_id` pins the statement to one account (docs/scale-out.md: each statement names its account);
    None reads across accounts (an older message carried none). `skip`: receipts this run already attempted
    (a transient failure stays due for the sweeper, never retried in a loop here). `slot` (slot, slots): only the
    receipts whose pk modulo `slots` is `slot` (one run's share of the account)."""
    rows = MaterializationDue.objects.filter(held_reason="")
    if account_id is not None:
        rows = rows.filter(receipt__account_id=account_id)
    if before is not None:
        rows = rows.filter(due_at__lt=before)
    if slot is not None and slot[1] > 1:
        rows = rows.alias(share=F("receipt_id") % slot[1]).filter(share=slot[0])
    if skip:
        rows = rows.exclude(receipt_id__in=list(skip))
    return list(rows.order_by("due_at", "receipt_id").values_list("receipt_id", "receipt__account_id")[:limit])


def due_slots(*, before: datetime, slots: int, limit: int = 200) -> list[tuple[int, int]]:
    """(account pk, slot) pairs with receipts due since before `before`, not held (the sweeper's cross-account
    scan): each names the batch materializer run to wake."""
    return list(MaterializationDue.objects.filter(due_at__lt=before, held_reason="").order_by()
                .annotate(share=F("receipt_id") % slots)
                .values_list("receipt__account_id", "share").distinct()[:limit])
