"""Projection, ProjectionWindow, Execution, ExecutionAttempt, ExecutionDependency."""
from __future__ import annotations

from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from connector.choices import DependencyState, ExecutionState, ResultOutcome, WindowState
from connector.models.ingress import Event
from connector.models.ordering import OrderingLane
from connector.models.routing import RoutedSaveMixin
from connector.models.owners import ConnectorAccount
from connector.models.serving import ServingEpoch

__all__ = ["ProjectionWindow", "WindowMember", "Projection", "Execution", "ExecutionAttempt",
           "ExecutionDependency"]


class ProjectionWindow(ConcurrentTransitionMixin, models.Model):
    """One explicit window of a grouped route. Invariants: one open window per (epoch, route, grouping key);
    grouping key and close policy immutable; sealing fixes its membership."""

    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="windows")
    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="windows")
    route = models.CharField(max_length=255)
    grouping_key = models.CharField(max_length=255)
    max_members = models.PositiveIntegerField()
    max_age_seconds = models.PositiveIntegerField()
    state = FSMField(default=WindowState.OPEN, choices=WindowState.choices, protected=True)
    member_count = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(auto_now_add=True)
    closes_at = models.DateTimeField()
    sealed_at = models.DateTimeField(null=True, blank=True)
    quarantine_reason = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["epoch", "route", "grouping_key"], condition=Q(state=WindowState.OPEN),
                                    name="connector_window_one_open_per_key"),
        ]
        # /metrics (issue 21): quarantined windows without scanning the sealed history (open ones are found through
        # the one-open-per-key unique index).
        indexes = [models.Index(fields=["quarantine_reason", "closes_at"], name="connector_window_quarantined",
                                condition=Q(state=WindowState.QUARANTINED))]

    def __str__(self) -> str:
        return f"window #{self.pk} {self.grouping_key} ({self.state})"

    @transition(field=state, source=WindowState.OPEN, target=WindowState.SEALED)
    def seal(self, *, at) -> None:
        self.sealed_at = at

    @transition(field=state, source=WindowState.OPEN, target=WindowState.QUARANTINED)
    def quarantine(self, *, reason: str) -> None:
        self.quarantine_reason = reason


class WindowMember(models.Model):
    """An Event's membership of one window. Invariant: an Event joins exactly one window."""

    window = models.ForeignKey(ProjectionWindow, on_delete=models.PROTECT, related_name="members")
    event = models.OneToOneField(Event, on_delete=models.PROTECT, related_name="window_member")
    ordinal = models.PositiveIntegerField()
    record_key = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["window", "ordinal"]
        constraints = [models.UniqueConstraint(fields=["window", "ordinal"], name="connector_windowmember_ordinal")]


class Projection(models.Model):
    """An immutable application-input generation derived under one route definition, from one Event (immediate
    routes) or one sealed window. Owns the pointer used to mint at most one active Execution generation.
    Invariant: one per identity digest; everything but `execution_generation` is immutable."""

    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="projections")
    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="projections")
    route = models.CharField(max_length=255)
    route_version = models.PositiveIntegerField()
    identity_digest = models.BinaryField(max_length=32, unique=True)
    event = models.OneToOneField(Event, on_delete=models.PROTECT, null=True, blank=True, related_name="projection")
    window = models.OneToOneField(ProjectionWindow, on_delete=models.PROTECT, null=True, blank=True,
                                  related_name="projection")
    lane = models.ForeignKey(OrderingLane, on_delete=models.PROTECT, null=True, blank=True,
                             related_name="projections")
    position = models.DecimalField(max_digits=38, decimal_places=0, null=True, blank=True)
    tie_breaker = models.BinaryField(null=True, blank=True)
    input = models.BinaryField()
    input_digest = models.BinaryField(max_length=32)
    suppress_external_effects = models.BooleanField(default=False)
    execution_generation = models.PositiveIntegerField(default=0)
    # lane routes only: pending (awaiting lane selection) -> minted | superseded
    lane_status = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.CheckConstraint(condition=(Q(event__isnull=False, window__isnull=True)
                                              | Q(event__isnull=True, window__isnull=False)),
                                   name="connector_projection_one_source"),
        ]
        indexes = [models.Index(fields=["lane", "position"], name="connector_proj_lane_pending",
                                condition=Q(lane_status="pending")),
                   # The overview's "materialized" throughput of the last hour (issue 21; BRIN, see ApplicationResult).
                   BrinIndex(fields=["created_at"], name="connector_proj_time_brin", autosummarize=True, pages_per_range=8)]

    def __str__(self) -> str:
        return f"projection #{self.pk} {self.route}"


class Execution(RoutedSaveMixin, ConcurrentTransitionMixin, models.Model):
    """One immutable execution generation of a Projection. Retry reuses its identity (new Attempt, same
    command); completion only from the Runtime result receipt. Invariants: one active generation per
    projection; one per (projection, generation); the lease is ownership, not state."""

    projection = models.ForeignKey(Projection, on_delete=models.PROTECT, related_name="executions")
    generation = models.PositiveIntegerField()
    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="executions")
    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="executions")
    # Indexed by connector_exec_lane_newest (lane, id), which serves the foreign key too.
    lane = models.ForeignKey(OrderingLane, on_delete=models.PROTECT, null=True, blank=True, db_index=False,
                             related_name="executions")
    state = FSMField(default=ExecutionState.READY, choices=ExecutionState.choices, protected=True)
    command_id = models.CharField(max_length=128, unique=True)
    execution_ref = models.BinaryField()
    execution_ref_digest = models.BinaryField(max_length=32)
    lease_holder = models.CharField(max_length=255, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_fence = models.BigIntegerField(default=0)
    attempt_count = models.PositiveIntegerField(default=0)
    result_outcome = models.CharField(max_length=16, choices=ResultOutcome.choices, blank=True, default="")
    result_digest = models.BinaryField(max_length=32, null=True, blank=True)
    runtime_receipt = models.BinaryField(null=True, blank=True)
    quarantine_reason = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["projection"], condition=Q(state__in=["ready", "waiting_dependency"]),
                                    name="connector_execution_one_active_per_projection"),
            models.UniqueConstraint(fields=["projection", "generation"], name="connector_execution_unique_generation"),
            models.CheckConstraint(condition=~Q(state=ExecutionState.COMPLETED) | Q(result_digest__isnull=False),
                                   name="connector_execution_completed_has_result"),
        ]
        indexes = [models.Index(fields=["account", "state", "lease_expires_at"], name="connector_exec_claimable",
                                condition=Q(state="ready")),
                   # The batched claim (D-205): accounts with ready work by a loose scan, then each account's
                   # oldest ready executions in pk order, without sorting the account's whole ready backlog.
                   models.Index(fields=["account", "id"], name="connector_exec_ready_queue",
                                condition=Q(state="ready")),
                   # /metrics (issue 21): quarantined executions by reason without scanning the completed history.
                   models.Index(fields=["quarantine_reason", "changed_at"], name="connector_exec_quarantined",
                                condition=Q(state="quarantined")),
                   # The operator screens' execution list (issue 38, D-473): a lane's executions newest first, and
                   # the executions in a state other than `completed` (the history's state) newest first, each a
                   # page without reading the completed history.
                   models.Index(fields=["lane", "id"], name="connector_exec_lane_newest"),
                   models.Index(fields=["state", "id"], name="connector_exec_live_newest",
                                condition=~Q(state="completed"))]

    def __str__(self) -> str:
        return f"execution #{self.pk} gen {self.generation} ({self.state})"

    @transition(field=state, source=ExecutionState.READY, target=ExecutionState.WAITING_DEPENDENCY)
    def wait_dependency(self) -> None:
        self.lease_holder, self.lease_expires_at = "", None

    @transition(field=state, source=ExecutionState.WAITING_DEPENDENCY, target=ExecutionState.READY)
    def dependency_ready(self) -> None:
        pass

    @transition(field=state, source=ExecutionState.READY, target=ExecutionState.COMPLETED)
    def complete(self, *, outcome: str, result_digest: bytes, runtime_receipt: bytes) -> None:
        self.result_outcome, self.result_digest, self.runtime_receipt = outcome, result_digest, runtime_receipt
        self.lease_holder, self.lease_expires_at = "", None

    @transition(field=state, source=[ExecutionState.READY, ExecutionState.WAITING_DEPENDENCY],
                target=ExecutionState.QUARANTINED)
    def quarantine(self, *, reason: str, outcome: str = "", result_digest: bytes | None = None,
                   runtime_receipt: bytes | None = None) -> None:
        self.quarantine_reason = reason
        self.result_outcome, self.result_digest, self.runtime_receipt = outcome, result_digest, runtime_receipt
        self.lease_holder, self.lease_expires_at = "", None


class ExecutionAttempt(models.Model):
    """Append-only evidence of one claim of an Execution. Invariant: one per (execution, ordinal)."""

    execution = models.ForeignKey(Execution, on_delete=models.PROTECT, related_name="attempts")
    ordinal = models.PositiveIntegerField()
    holder = models.CharField(max_length=255)
    lease_fence = models.BigIntegerField()
    claimed_at = models.DateTimeField(auto_now_add=True)
    lease_expires_at = models.DateTimeField()

    class Meta:
        ordering = ["execution", "ordinal"]
        constraints = [models.UniqueConstraint(fields=["execution", "ordinal"], name="connector_attempt_ordinal")]


class ExecutionDependency(ConcurrentTransitionMixin, models.Model):
    """A requirement with an immutable deadline; waiting holds no lease. Invariant: one per (execution, key)."""

    execution = models.ForeignKey(Execution, on_delete=models.PROTECT, related_name="dependencies")
    requirement_key = models.CharField(max_length=255)
    deadline = models.DateTimeField()
    state = FSMField(default=DependencyState.WAITING, choices=DependencyState.choices, protected=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    evidence = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["pk"]
        constraints = [models.UniqueConstraint(fields=["execution", "requirement_key"],
                                               name="connector_dependency_unique_key")]

    @transition(field=state, source=DependencyState.WAITING, target=DependencyState.SATISFIED)
    def satisfy(self, *, at, evidence: str) -> None:
        self.resolved_at, self.evidence = at, evidence

    @transition(field=state, source=DependencyState.WAITING, target=DependencyState.EXPIRED)
    def expire(self, *, at) -> None:
        self.resolved_at = at

    @transition(field=state, source=DependencyState.WAITING, target=DependencyState.REJECTED)
    def reject(self, *, at, evidence: str) -> None:
        self.resolved_at, self.evidence = at, evidence
