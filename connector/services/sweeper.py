"""The sweeper finds due work in PostgreSQL, so a lost broker message only delays it (Redis only wakes workers).

Today it re-attempts verification of `prepared` ServingEpochs (left prepared by retryable owner
unavailability). Later aggregates add their due-work queries here (expired leases, due retries)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from connector.actors import Actor
from connector.errors import ConnectorError, OwnerUnavailable
from connector.selectors.serving import prepared_epoch_pks
from connector.services.serving import epoch_verify

log = logging.getLogger(__name__)
SWEEPER = Actor.system("sweeper")


@dataclass
class SweepReport:
    verified: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)


def serving_epoch_sweep(*, limit: int = 50) -> SweepReport:
    """Verify each prepared epoch once; unavailability defers it to the next sweep."""
    report = SweepReport()
    for pk in prepared_epoch_pks()[:limit]:
        try:
            epoch = epoch_verify(epoch_pk=pk, actor=SWEEPER)
        except OwnerUnavailable:
            report.deferred.append(pk)
            continue
        except ConnectorError as exc:  # moved meanwhile (FenceStale, TransitionRefused): nothing to do
            log.info("sweeper skipped epoch", extra={"epoch_pk": pk, "code": exc.code})
            continue
        (report.verified if epoch.state == "verified" else report.rejected).append(pk)
    if report.verified or report.rejected or report.deferred:
        log.info("serving epoch sweep", extra={"verified": report.verified, "rejected": report.rejected,
                                               "deferred": report.deferred})
    return report


@dataclass
class InboundSweep:
    materialized: int = 0
    lanes_advanced: int = 0
    gaps_decided: int = 0
    windows_sealed: int = 0
    dependencies_resolved: int = 0
    claimable: int = 0


def inbound_sweep(*, grace_seconds: int = 2, limit: int = 200) -> InboundSweep:
    """Find due inbound work in PostgreSQL (never in the broker): receipts with missing children, lanes with
    pending positions or expired gaps, windows past their close time, dependencies to resolve, and count the
    claimable executions (ready, lease free or expired)."""
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    from connector.models import Execution, MaterializationDue, OrderingLane, Projection, ProjectionWindow
    from connector.services import dependencies, execution, materialize

    report = InboundSweep()
    now = timezone.now()
    for receipt_pk in MaterializationDue.objects.filter(due_at__lt=now - timedelta(seconds=grace_seconds)) \
            .order_by("due_at").values_list("receipt_id", flat=True)[:limit]:
        try:
            materialize.receipt_materialize(receipt_pk=receipt_pk)
            report.materialized += 1
        except ConnectorError as exc:
            log.info("materialization deferred", extra={"receipt": receipt_pk, "code": exc.code})
    lanes = set(Projection.objects.filter(lane_status="pending").values_list("lane_id", flat=True).distinct()[:limit])
    for lane_pk in lanes:
        try:
            if execution.lane_advance(lane_pk=lane_pk) is not None:
                report.lanes_advanced += 1
        except ConnectorError as exc:
            log.info("lane deferred", extra={"lane": lane_pk, "code": exc.code})
    for lane_pk in OrderingLane.objects.filter(gap_since__isnull=False, state="open").values_list("pk", flat=True):
        try:
            if execution.lane_gap_deadline(lane_pk=lane_pk):
                report.gaps_decided += 1
        except ConnectorError as exc:
            log.info("gap deferred", extra={"lane": lane_pk, "code": exc.code})
    for window_pk in ProjectionWindow.objects.filter(state="open", closes_at__lt=now).values_list("pk", flat=True):
        try:
            if execution.window_seal_due(window_pk=window_pk) is not None:
                report.windows_sealed += 1
        except ConnectorError as exc:
            log.info("window deferred", extra={"window": window_pk, "code": exc.code})
    for dependency_pk in dependencies.waiting_dependency_pks(limit):
        try:
            if dependencies.dependency_resolve(dependency_pk=dependency_pk) != "waiting":
                report.dependencies_resolved += 1
        except ConnectorError as exc:
            log.info("dependency deferred", extra={"dependency": dependency_pk, "code": exc.code})
    report.claimable = Execution.objects.filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now),
                                                state="ready").count()
    return report
