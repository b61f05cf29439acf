"""The sweeper finds due work in PostgreSQL, so a lost broker message only delays it (Redis only wakes workers):
`prepared` ServingEpochs to verify, and the inbound chain's due work (receipts to materialize, lanes, gaps,
windows, dependencies).

Every item runs isolated (connector.services.poison, decision D-168): a transient error leaves it for the next
sweep, a deterministic failure quarantines it with a closed reason and evidence, and the sweep moves on, so one
poison item never blocks another."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

from connector.actors import Actor
from connector.choices import SweepStep
from connector.errors import OwnerUnavailable
from connector.models import Execution, MaterializationDue, OrderingLane, Projection, ProjectionWindow
from connector.selectors.serving import prepared_epoch_pks
from connector.services import dependencies, execution, materialize, poison
from connector.services.serving import epoch_verify

log = logging.getLogger(__name__)
SWEEPER = Actor.system("sweeper")


@dataclass
class SweepReport:
    verified: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


def serving_epoch_sweep(*, limit: int = 50) -> SweepReport:
    """Verify each prepared epoch once; unavailability defers it to the next sweep; a deterministic failure
    records EPOCH_VERIFY_FAILED and the sweeper stops re-verifying that candidate."""
    report = SweepReport()
    for pk in prepared_epoch_pks()[:limit]:
        if poison.epoch_held(pk):
            continue
        epoch = None
        with poison.isolated(step=SweepStep.EPOCH_VERIFY, item=f"epoch {pk}",
                             quarantine=partial(poison.epoch_verify_hold, epoch_pk=pk,
                                                step=SweepStep.EPOCH_VERIFY)) as item:
            try:
                epoch = epoch_verify(epoch_pk=pk, actor=SWEEPER)
            except OwnerUnavailable:
                report.deferred.append(pk)
                continue
        if item.failure == poison.FAILED:
            report.failed.append(pk)
        if epoch is not None:  # else moved meanwhile (FenceStale, TransitionRefused): nothing to do
            (report.verified if epoch.state == "verified" else report.rejected).append(pk)
    if report.verified or report.rejected or report.deferred or report.failed:
        log.info("serving epoch sweep", extra={"verified": report.verified, "rejected": report.rejected,
                                               "deferred": report.deferred, "failed": report.failed})
    return report


@dataclass
class InboundSweep:
    materialized: int = 0
    lanes_advanced: int = 0
    gaps_decided: int = 0
    windows_sealed: int = 0
    dependencies_resolved: int = 0
    claimable: int = 0
    quarantined: int = 0


def inbound_sweep(*, grace_seconds: int = 2, limit: int = 200,
                  materialize_grace_seconds: int | None = None,
                  materialize_skip_accounts: set[int] | frozenset[int] = frozenset()) -> InboundSweep:
    """Find due inbound work in PostgreSQL (never in the broker): receipts with missing children (held ones
    excepted), lanes with pending positions or expired gaps, windows past their close time, dependencies to
    resolve, and count the claimable executions (ready, lease free or expired). Each item is isolated: a
    receipt that fails to materialize is held (MATERIALIZATION_FAILED), a lane halted (LANE_STEP_FAILED), a
    window quarantined (WINDOW_SEAL_FAILED), a dependency's execution quarantined (EXECUTION_STEP_FAILED).
    `materialize_grace_seconds` (default `grace_seconds`): how long a receipt stays due before the sweep
    materializes it itself; the task passes a longer one when it could wake the batch materializers, and
    `materialize_skip_accounts`, the accounts whose batch materializer is running (D-270)."""
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    report = InboundSweep()
    now = timezone.now()

    def run(step: str, item: str, quarantine, **keys):
        return poison.isolated(step=step, item=item, quarantine=partial(quarantine, step=step, **keys),
                               refusals_quarantine=step == SweepStep.RECEIPT_MATERIALIZE)

    def count(item: poison.Isolated) -> None:
        report.quarantined += item.failure == poison.FAILED

    if materialize_grace_seconds is None:
        materialize_grace_seconds = grace_seconds
    due = (MaterializationDue.objects.filter(due_at__lt=now - timedelta(seconds=materialize_grace_seconds),
                                             held_reason="")
           .exclude(receipt__account_id__in=list(materialize_skip_accounts))
           .order_by("due_at").values_list("receipt_id", "receipt__account_id")[:limit])
    for receipt_pk, account_pk in due:  # each item is then its account's single-shard transaction
        with run(SweepStep.RECEIPT_MATERIALIZE, f"receipt {receipt_pk}", poison.receipt_hold,
                 receipt_pk=receipt_pk) as item:
            materialize.receipt_materialize(receipt_pk=receipt_pk, account_id=account_pk)
            report.materialized += 1
        count(item)
    lanes = set(Projection.objects.filter(lane_status="pending", lane__state="open")
                .values_list("lane_id", "account_id").distinct()[:limit])
    for lane_pk, account_pk in lanes:
        with run(SweepStep.LANE_ADVANCE, f"lane {lane_pk}", poison.lane_halt, lane_pk=lane_pk) as item:
            if execution.lanes_advance(lane_pks=[lane_pk], account_id=account_pk):
                report.lanes_advanced += 1
        count(item)
    for lane_pk in OrderingLane.objects.filter(gap_since__isnull=False, state="open").values_list("pk", flat=True):
        with run(SweepStep.LANE_GAP_DEADLINE, f"lane {lane_pk}", poison.lane_halt, lane_pk=lane_pk) as item:
            if execution.lane_gap_deadline(lane_pk=lane_pk):
                report.gaps_decided += 1
        count(item)
    for window_pk in ProjectionWindow.objects.filter(state="open", closes_at__lt=now).values_list("pk", flat=True):
        with run(SweepStep.WINDOW_SEAL_DUE, f"window {window_pk}", poison.window_quarantine,
                 window_pk=window_pk) as item:
            if execution.window_seal_due(window_pk=window_pk) is not None:
                report.windows_sealed += 1
        count(item)
    for dependency_pk, execution_pk in dependencies.waiting_dependencies(limit):
        with run(SweepStep.DEPENDENCY_RESOLVE, f"dependency {dependency_pk}", poison.execution_quarantine,
                 execution_pk=execution_pk) as item:
            if dependencies.dependency_resolve(dependency_pk=dependency_pk) != "waiting":
                report.dependencies_resolved += 1
        count(item)
    report.claimable = Execution.objects.filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now),
                                                state="ready").count()
    return report
