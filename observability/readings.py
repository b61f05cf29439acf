"""What the metrics read from PostgreSQL, one bounded aggregate per question (count + oldest timestamp over a
filtered state, each served by a partial index or a small work-queue table; docs/operations.md lists the plans).
PostgreSQL is the only authority, so every web worker answers a scrape with the same figures."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Exists, Min, OuterRef
from django.utils import timezone

from connector.choices import EpochState, GateMode
from connector.models import (
    AccountServingGate,
    Execution,
    LaneResumption,
    MaterializationDue,
    OrderingLane,
    Projection,
    ProjectionWindow,
    ReplayRequest,
    ServingEpoch,
)
from effects.models import DeliveryOperation, RemoteEffect


@dataclass(frozen=True)
class Backlog:
    stage: str
    count: int
    oldest: datetime | None  # when the oldest item entered the stage

    def age(self, now: datetime) -> float:
        return max(0.0, (now - self.oldest).total_seconds()) if self.oldest else 0.0


@dataclass(frozen=True)
class Quarantine:
    kind: str
    reason: str
    count: int
    oldest: datetime | None


def _backlog(stage: str, queryset, since: str) -> Backlog:
    row = queryset.aggregate(n=Count("pk"), oldest=Min(since))
    return Backlog(stage, row["n"], row["oldest"])


def backlogs(now: datetime | None = None) -> list[Backlog]:
    """Per stage of the pipeline: how many items wait and since when the oldest does."""
    now = now or timezone.now()
    return [
        # Age from the receipt's admission: the whole wait of the event, not only since the row was (re)queued.
        _backlog("materialization_due", MaterializationDue.objects.filter(held_reason=""), "receipt__created_at"),
        _backlog("materialization_held", MaterializationDue.objects.exclude(held_reason=""), "held_at"),
        _backlog("lane_pending", Projection.objects.filter(lane_status="pending"), "created_at"),
        _backlog("window_open", ProjectionWindow.objects.filter(state="open"), "opened_at"),
        _backlog("execution_ready", Execution.objects.filter(state="ready"), "created_at"),
        # Age from the expiry: how long a claim has been ownerless without being taken again.
        _backlog("execution_lease_expired", Execution.objects.filter(state="ready", lease_expires_at__lt=now),
                 "lease_expires_at"),
        _backlog("effect_prepared", RemoteEffect.objects.filter(state="prepared"), "changed_at"),
        _backlog("effect_dispatching", RemoteEffect.objects.filter(state="dispatching"), "changed_at"),
        _backlog("delivery_held", DeliveryOperation.objects.exclude(held_reason=""), "held_at"),
    ]


def _counts(queryset, field: str, values) -> dict[str, int]:
    found = dict(queryset.values_list(field).annotate(n=Count("pk")).order_by())
    return {value: found.get(value, 0) for value in values} | found


def gates_by_mode() -> dict[str, int]:
    """Every gate mode, zero included (an alert on `v2_halted > 0` needs the series to exist)."""
    return _counts(AccountServingGate.objects.all(), "mode", GateMode.values)


def epochs_by_state() -> dict[str, int]:
    return _counts(ServingEpoch.objects.all(), "state", EpochState.values)


def _grouped(kind: str, queryset, reason: str, since: str, *, blank_as: str = "") -> list[Quarantine]:
    rows = queryset.values(reason).annotate(n=Count("pk"), oldest=Min(since)).order_by(reason)
    return [Quarantine(kind, row[reason] or blank_as, row["n"], row["oldest"]) for row in rows]


def _executions_awaiting_remedy():
    """Quarantined executions with no remedy taken yet (governance's board rule, connector.selectors.lanes
    execution_remedy, as two NOT EXISTS): no replay of its event requested after the quarantine, no resumption of
    its lane past its position. The quarantined row itself never changes, so without this the count only grows."""
    replayed = ReplayRequest.objects.filter(predecessor_event_id=OuterRef("projection__event_id"),
                                            created_at__gte=OuterRef("changed_at"))
    resumed = LaneResumption.objects.filter(lane_id=OuterRef("lane_id"), halt_reason=OuterRef("quarantine_reason"),
                                            blocking_position=OuterRef("projection__position"),
                                            resumed_at__gte=OuterRef("changed_at"))
    return Execution.objects.filter(state="quarantined").filter(~Exists(replayed), ~Exists(resumed))


def _uncertain() -> list[Quarantine]:
    row = RemoteEffect.objects.filter(state="uncertain").aggregate(n=Count("pk"), oldest=Min("changed_at"))
    return [Quarantine("effect", "EFFECT_UNCERTAIN", row["n"], row["oldest"])] if row["n"] else []


def quarantines() -> list[Quarantine]:
    """Halted and quarantined items by kind and closed reason code (governance/reasons.py), with the oldest."""
    return [
        *_grouped("execution", _executions_awaiting_remedy(), "quarantine_reason", "changed_at"),
        *_grouped("lane", OrderingLane.objects.filter(state="halted"), "halt_reason", "changed_at"),
        # A window has no quarantine time of its own: it is quarantined when its seal falls due.
        *_grouped("window", ProjectionWindow.objects.filter(state="quarantined"), "quarantine_reason", "closes_at"),
        *_grouped("effect", RemoteEffect.objects.filter(state="quarantined"), "quarantine_reason", "changed_at",
                  blank_as="OPERATOR_QUARANTINE"),
        *_uncertain(),
        *_grouped("effect", RemoteEffect.objects.filter(state="remote_confirmed").exclude(quarantine_reason=""),
                  "quarantine_reason", "changed_at"),
        *_grouped("materialization", MaterializationDue.objects.exclude(held_reason=""), "held_reason", "held_at"),
        *_grouped("delivery", DeliveryOperation.objects.exclude(held_reason=""), "held_reason", "held_at"),
    ]
