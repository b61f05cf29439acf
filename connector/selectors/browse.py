"""Lists and chains of the connector's facts for the operator screens (issue 38 item 2, D-470, D-471): receipts,
lanes and executions filtered by account, state, reason code and age, newest first, one page at a time; and the
chain Receipt -> Event -> Projection -> Execution -> ApplicationResult read both ways.

Pages are keyset pages on the primary key (`before`: the last pk of the previous page), never an offset, so the
n-th page costs what the first does. Every statement is flat in the retained history: it reads through an index
ordered like the page, or through a small set (live work, quarantined rows); tests/governance/test_list_plans.py
measures each one over 100,000 retained receipts. Read-only; takes no lock.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from connector.models import (
    ApplicationResult,
    Event,
    Execution,
    MaterializationDue,
    OrderingLane,
    Projection,
    Receipt,
    ReceiptComponent,
)

PAGE_SIZE = 50
RECEIPT_STATES = ("waiting", "held", "materialized")


@dataclass(frozen=True)
class Filters:
    """What a list is narrowed to; empty values do not narrow. `older_than` is an age in minutes."""

    account: int | None = None
    state: str = ""
    reason: str = ""
    older_than: int | None = None
    lane: int | None = None
    before: int | None = None

    def cutoff(self, now: datetime | None = None) -> datetime | None:
        return (now or timezone.now()) - timedelta(minutes=self.older_than) if self.older_than else None


@dataclass(frozen=True)
class Page:
    rows: list
    next_before: int | None  # the `before` of the next (older) page; None on the last page


def page_of(queryset: QuerySet, filters: Filters, size: int = PAGE_SIZE) -> Page:
    """One keyset page of `queryset`, newest (highest pk) first."""
    if filters.before is not None:
        queryset = queryset.filter(pk__lt=filters.before)
    rows = list(queryset.order_by("-pk")[:size + 1])
    return Page(rows[:size], rows[size - 1].pk if len(rows) > size else None)


def _narrow(queryset: QuerySet, filters: Filters, *, time_field: str, reason_field: str) -> QuerySet:
    if filters.account is not None:
        queryset = queryset.filter(account_id=filters.account)
    if filters.reason and reason_field:
        queryset = queryset.filter(**{reason_field: filters.reason})
    cutoff = filters.cutoff()
    if cutoff is not None:
        queryset = queryset.filter(**{f"{time_field}__lte": cutoff})
    return queryset


# -- receipts -------------------------------------------------------------------------------------------------------

def receipt_list(filters: Filters) -> Page:
    """Receipts newest first. State: `waiting` (queued for materialization), `held` (a deterministic failure holds
    it, D-168), `materialized`. Reason: the closed code of a quarantined component or of the hold. A waiting or held
    receipt, or one with a reason, is found through its row in a small set first (the materialization queue, the
    coded components), so a rare state or code never scans the history."""
    queryset = Receipt.objects.select_related("account").defer("payload", "epoch_digest", "payload_digest")
    if filters.reason or filters.state in ("waiting", "held"):
        page = page_of(queryset.filter(pk__in=_receipt_candidates(filters)), Filters())
    else:
        queryset = queryset.filter(_receipt_conditions(filters, ""))
        if filters.state == "materialized":  # NOT EXISTS: an anti-join the planner estimates (a LEFT JOIN's IS NULL
            queryset = queryset.filter(~Exists(_queued()))  # it did not, and sorted the whole history)
        page = page_of(queryset, filters)
    due = dict(MaterializationDue.objects.filter(receipt_id__in=[r.pk for r in page.rows])
               .values_list("receipt_id", "held_reason"))
    for row in page.rows:
        row.list_state = ("materialized" if row.pk not in due else "held" if due[row.pk] else "waiting")
    return page


def _queued(receipt: str = "pk"):
    return MaterializationDue.objects.filter(receipt_id=OuterRef(receipt))


def _receipt_conditions(filters: Filters, prefix: str) -> Q:
    """Account, age and the page's bound, on the receipt reached through `prefix` ("" or "receipt__")."""
    q = Q()
    if filters.account is not None:
        q &= Q(**{f"{prefix}account_id": filters.account})
    cutoff = filters.cutoff()
    if cutoff is not None:
        q &= Q(**{f"{prefix}created_at__lte": cutoff})
    if filters.before is not None:
        q &= Q(**{f"{prefix}{'id' if prefix else 'pk'}__lt": filters.before})
    return q


def _receipt_candidates(filters: Filters) -> list[int]:
    """The pks of the newest receipts (at most a page and one more) that match the filters, found from the small
    sets: the materialization queue (waiting, held, a hold's reason) and the coded components (a reason)."""
    queue = MaterializationDue.objects.filter(_receipt_conditions(filters, "receipt__"))
    if filters.state == "waiting":
        queue = queue.filter(held_reason="")
    elif filters.state == "held":
        queue = queue.exclude(held_reason="")
    sources = []
    if filters.reason:
        coded = ReceiptComponent.objects.filter(_receipt_conditions(filters, "receipt__"), reason_code=filters.reason)
        if filters.state == "materialized":
            coded = coded.filter(~Exists(_queued("receipt_id")))
        elif filters.state in ("waiting", "held"):
            coded = coded.filter(receipt_id__in=queue.values("receipt_id"))
        sources += [coded, queue.filter(held_reason=filters.reason)] if filters.state != "materialized" else [coded]
    else:
        sources.append(queue)
    found: set[int] = set()
    for source in sources:
        found |= set(source.order_by("-receipt_id").values_list("receipt_id", flat=True)[:PAGE_SIZE + 1])
    return sorted(found, reverse=True)[:PAGE_SIZE + 1]


def receipt_chain(receipt_pk: int, limit: int = 100) -> list[dict]:
    """The receipt's events, each with its projection and that projection's executions (oldest first)."""
    events = list(Event.objects.filter(receipt_id=receipt_pk).order_by("pk")
                  .only("pk", "source_event_key", "event_kind", "route", "partition", "position",
                        "replay_request_id")[:limit])
    projections = {p.event_id: p for p in Projection.objects.filter(event_id__in=[e.pk for e in events])
                   .only("pk", "event_id", "lane_id", "route", "lane_status", "position")}
    executions: dict[int, list] = {}
    for x in (Execution.objects.filter(projection_id__in=[p.pk for p in projections.values()]).order_by("pk")
              .only("pk", "projection_id", "generation", "state", "quarantine_reason")):
        executions.setdefault(x.projection_id, []).append(x)
    return [{"event": e, "projection": projections.get(e.pk),
             "executions": executions.get(projections[e.pk].pk, []) if e.pk in projections else []}
            for e in events]


# -- events ---------------------------------------------------------------------------------------------------------

def event_get(event_pk: int) -> Event:
    return Event.objects.select_related("receipt", "account").defer("payload", "receipt__payload").get(pk=event_pk)


def event_chain(event: Event) -> dict:
    """The event's projection (with its lane) and that projection's executions, and the components naming it."""
    projection = Projection.objects.select_related("lane").defer("input").filter(event_id=event.pk).first()
    executions = (list(Execution.objects.filter(projection_id=projection.pk).order_by("pk")
                       .only("pk", "generation", "state", "quarantine_reason", "command_id", "projection_id"))
                  if projection else [])
    components = list(ReceiptComponent.objects.filter(event_id=event.pk).order_by("receipt_id", "ordinal")
                      .values("receipt_id", "ordinal", "disposition")[:20])
    return {"projection": projection, "executions": executions, "components": components}


# -- executions -----------------------------------------------------------------------------------------------------

def execution_list(filters: Filters) -> Page:
    """Executions newest first, by account, state, quarantine reason, lane and age (created). A reason names a
    quarantined execution (only a quarantine sets one): read through the quarantined executions' index."""
    queryset = _narrow(Execution.objects.select_related("account").only(
        "pk", "account__account_key", "state", "quarantine_reason", "generation", "lane_id",
        "projection_id", "created_at", "changed_at"), filters, time_field="created_at",
        reason_field="quarantine_reason")
    if filters.state:
        queryset = queryset.filter(state=filters.state)
    if filters.reason:
        queryset = queryset.filter(state="quarantined")
    if filters.lane is not None:
        queryset = queryset.filter(lane_id=filters.lane)
    return page_of(queryset, filters)


def lane_executions(lane_pk: int, limit: int = 20) -> list[Execution]:
    """The lane's newest executions."""
    return page_of(Execution.objects.filter(lane_id=lane_pk).only("pk", "generation", "state", "quarantine_reason",
                                                                   "projection_id", "created_at"),
                   Filters(), size=limit).rows


def execution_chain(execution: Execution) -> dict:
    """Upstream of an execution: its projection, the projection's event (or window) and the event's receipt;
    downstream: its ApplicationResult."""
    projection = (Projection.objects.select_related("event").defer("input", "event__payload")
                  .filter(pk=execution.projection_id).first())
    event = projection.event if projection is not None else None
    return {"projection": projection, "event": event, "receipt_id": event.receipt_id if event else None,
            "result": ApplicationResult.objects.filter(command_id=execution.command_id).defer("receipt").first()}


# -- lanes ----------------------------------------------------------------------------------------------------------

def lane_list(filters: Filters) -> Page:
    """Ordering lanes newest first, by account, state, halt reason and age (last change). A halt reason names a
    halted lane (a resume clears it): read through the halted lanes' index. Lanes are one per partition, not
    per receipt; a filter on the last change reads the lane table (changed_at stays out of every lane index so
    that the hot path's lane updates stay HOT: the note on OrderingLane's index)."""
    queryset = _narrow(OrderingLane.objects.select_related("account"), filters, time_field="changed_at",
                       reason_field="halt_reason")
    if filters.state:
        queryset = queryset.filter(state=filters.state)
    if filters.reason:
        queryset = queryset.filter(state="halted")
    return page_of(queryset, filters)
