"""What the metrics read from PostgreSQL, one bounded aggregate per question (count + oldest timestamp over a
filtered state, each served by a partial index or a small work-queue table; docs/operations.md lists the plans).
PostgreSQL is the only authority, so every web worker answers a scrape with the same figures."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Exists, Min, OuterRef, QuerySet
from django.utils import timezone

from connector.choices import EpochState, GateMode
from connector.selectors.rows import (
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
from effects.selectors import RECONCILIATION_WAITING, DeliveryOperation, DispatchPermit, RemoteEffect
from .models import StageSample


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


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline as the readings see it: which rows wait in it (`rows(now)`), the timestamp its
    age counts from, and which screen shows one of its items (`link`: a governance URL name and the column that
    holds that page's primary key; empty for stages whose items the quarantine board lists)."""

    name: str
    rows: Callable[[datetime], QuerySet]
    since: str
    link: tuple[str, str] = ("", "")
    action: str = ""


STAGES = (
    # Age from the receipt's admission: the whole wait of the event, not only since the row was (re)queued.
    Stage("materialization_due", lambda now: MaterializationDue.objects.filter(held_reason=""),
          "receipt__created_at", ("governance:receipt", "receipt_id"),
          "The sweeper materializes it within seconds; a receipt that stays here names why on its page."),
    Stage("materialization_held", lambda now: MaterializationDue.objects.exclude(held_reason=""), "held_at"),
    Stage("lane_pending", lambda now: Projection.objects.filter(lane_status="pending"), "created_at",
          ("governance:lane", "lane_id"),
          "It waits for the positions before it; a gap past its deadline halts the lane, and the lane page "
          "offers resume (missing arrived, skip with evidence, replay)."),
    Stage("window_open", lambda now: ProjectionWindow.objects.filter(state="open"), "opened_at"),
    Stage("execution_ready", lambda now: Execution.objects.filter(state="ready"), "created_at",
          ("governance:execution", "pk"),
          "Ready and unclaimed: check that the claims workers run (worker liveness, /readyz) and the gate serves."),
    # Age from the expiry: how long a claim has been ownerless without being taken again.
    Stage("execution_lease_expired",
          lambda now: Execution.objects.filter(state="ready", lease_expires_at__lt=now), "lease_expires_at",
          ("governance:execution", "pk"),
          "Its worker died holding the lease; the next claim takes it with a new fence. If it stays, check the "
          "claims workers."),
    Stage("effect_prepared", lambda now: RemoteEffect.objects.filter(state="prepared", next_attempt_at__isnull=True),
          "changed_at", ("governance:effect", "pk"),
          "Waiting for a permit: check the egress workers and the credential gate of its generation. A push also "
          "waits while an earlier push of the same record is uncertain or in REMOTE_LINK_CONFLICT: resolve that "
          "one first (D-441)."),
    # A retry after an attempt that never reached the receiver (issue 37, D-421): waiting for its time is normal
    # (its page shows the schedule); one due and not taken is aged from its due time.
    Stage("effect_retry_scheduled",
          lambda now: RemoteEffect.objects.filter(state="prepared", next_attempt_at__gt=now), "changed_at",
          ("governance:effect", "pk"),
          "Its receiver was unreachable; the next attempt waits for its scheduled time (the effect's page shows "
          "the schedule). Many of them mean the receiver is down."),
    Stage("effect_retry_due",
          lambda now: RemoteEffect.objects.filter(state="prepared", next_attempt_at__lte=now), "next_attempt_at",
          ("governance:effect", "pk"),
          "Its scheduled retry is due and not taken: check the egress workers and the effects sweeper (beat)."),
    Stage("effect_dispatching", lambda now: RemoteEffect.objects.filter(state="dispatching"), "changed_at",
          ("governance:effect", "pk"),
          "A permit is open; settlement records the answer. An effect that stays here becomes uncertain and waits "
          "for reconciliation on its page."),
    # Open permits (served by the partial index effects_permit_open_set's predicate): granted and not yet sending,
    # then sending (the request may be on the wire) and not yet settled.
    Stage("permit_granted", lambda now: DispatchPermit.objects.filter(state="granted"), "granted_at",
          ("governance:effect", "effect_id"),
          "Granted, the request not started: the egress worker that holds it died or is slow; the permit blocks "
          "the gate's halt until it is abandoned with proof or settles."),
    Stage("permit_sending", lambda now: DispatchPermit.objects.filter(state="sending"), "sending_at",
          ("governance:effect", "effect_id"),
          "The request may have reached the provider and no answer is settled: the effect becomes uncertain and "
          "waits for reconciliation on its page; never send it again by hand."),
    Stage("delivery_held", lambda now: DeliveryOperation.objects.exclude(held_reason=""), "held_at"),
    # Outcome unknown, partial or unverified and not reconciled, or a reconciliation open: an operator decides with
    # the provider's evidence (the quarantine board lists each); age from the last state change.
    Stage("delivery_reconciling", lambda now: DeliveryOperation.objects.filter(RECONCILIATION_WAITING), "changed_at"),
)


def backlogs(now: datetime | None = None) -> list[Backlog]:
    """Per stage of the pipeline: how many items wait and since when the oldest does."""
    now = now or timezone.now()
    found = []
    for stage in STAGES:
        row = stage.rows(now).aggregate(n=Count("pk"), oldest=Min(stage.since))
        found.append(Backlog(stage.name, row["n"], row["oldest"]))
    return found


@dataclass(frozen=True)
class StuckItem:
    stage: str
    label: str
    since: datetime
    age_seconds: float
    url_name: str
    url_pk: int | None
    action: str


def stuck(budgets: dict[str, int], *, now: datetime | None = None, limit: int = 10) -> list[StuckItem]:
    """The oldest items (at most `limit` per stage) that have waited longer than their stage's budget, oldest first.
    Each read is the stage's filter plus `since < now - budget`, ordered by `since`, LIMIT: served by the same
    partial indexes as the backlog gauges. Stages without a budget (held, quarantined: the board lists them) are
    skipped."""
    now = now or timezone.now()
    items = []
    for stage in STAGES:
        budget = budgets.get(stage.name)
        if budget is None or not stage.link[0]:
            continue
        url_name, column = stage.link
        rows = (stage.rows(now).filter(**{f"{stage.since}__lt": now - timedelta(seconds=budget)})
                .order_by(stage.since).values_list("pk", column, stage.since)[:limit])
        for pk, target, since in rows:
            noun = url_name.partition(":")[2]  # receipt, lane, execution, effect: the page the link opens
            items.append(StuckItem(stage.name, f"{noun} #{target} ({stage.name.replace('_', ' ')})", since,
                                   (now - since).total_seconds(), url_name, target, stage.action))
    return sorted(items, key=lambda item: item.since)


def stage_history(*, since: datetime) -> dict[str, list[tuple[datetime, int, float]]]:
    """The stored samples (observability.services.stage_samples_record) since `since`, per stage, oldest first."""
    history: dict[str, list[tuple[datetime, int, float]]] = {stage.name: [] for stage in STAGES}
    for taken_at, stage, count, age in (StageSample.objects.filter(taken_at__gte=since)
                                        .values_list("taken_at", "stage", "count", "oldest_age_seconds")):
        history.setdefault(stage, []).append((taken_at, count, age))
    return history


def _counts(queryset, field: str, values) -> dict[str, int]:
    found = dict(queryset.values_list(field).annotate(n=Count("pk")).order_by())
    return {value: found.get(value, 0) for value in values} | found


def gates_by_mode() -> dict[str, int]:
    """Every gate mode, zero included (an alert on `v2_halted > 0` needs the series to exist)."""
    return _counts(AccountServingGate.objects.all(), "mode", GateMode.values)


@dataclass(frozen=True)
class OpenPermits:
    gates: int  # serving gates with at least one open (granted or sending) permit
    max_per_gate: int  # the most open permits any one gate holds


def open_permits() -> OpenPermits:
    """Open permits per gate, summarized with a bounded label set: one row per gate that holds an open permit
    (at most the in-flight requests), read from the partial index effects_permit_open_set."""
    counts = list(DispatchPermit.objects.filter(state__in=("granted", "sending")).values_list("gate_id")
                  .annotate(n=Count("pk")).order_by().values_list("n", flat=True))
    return OpenPermits(len(counts), max(counts, default=0))


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
        # Terminal no_effect with a reason code the frozen policy wrote (issue 37, D-423), until a new remote call.
        *_grouped("effect", RemoteEffect.objects.filter(state="no_effect", successor_intents__isnull=True)
                  .exclude(quarantine_reason=""), "quarantine_reason", "changed_at"),
        *_grouped("materialization", MaterializationDue.objects.exclude(held_reason=""), "held_reason", "held_at"),
        *_grouped("delivery", DeliveryOperation.objects.exclude(held_reason=""), "held_reason", "held_at"),
    ]
