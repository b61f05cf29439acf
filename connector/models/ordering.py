"""Source ordering: OrderingLane (the sole mutable claim guard of a partition) and its append-only decisions."""
from __future__ import annotations

from django.db import models
from django.db.models import Q

from connector.choices import LaneState, OrderingContract
from connector.models.serving import ServingEpoch

__all__ = ["OrderingLane", "SupersededDecision", "GapDecision", "LaneResumption"]


class OrderingLane(models.Model):
    """One per (epoch, account, route definition identity/version, canonical partition). Stores the completed high-water,
    its immutable baseline, and at most one active Execution; claims and results change it by fenced CAS.
    Invariant: `fence` advances on every change; the high-water only grows."""

    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="lanes")
    account = models.ForeignKey("connector.ConnectorAccount", on_delete=models.PROTECT, related_name="lanes")
    route = models.CharField(max_length=255)
    route_version = models.PositiveIntegerField()
    partition = models.CharField(max_length=255)
    contract = models.CharField(max_length=32, choices=OrderingContract.choices)
    baseline = models.DecimalField(max_digits=38, decimal_places=0, null=True, blank=True)
    baseline_origin = models.CharField(max_length=64, default="empty_new_partition")
    high_water = models.DecimalField(max_digits=38, decimal_places=0, null=True, blank=True)
    high_water_tie = models.BinaryField(null=True, blank=True)
    active_execution = models.OneToOneField("connector.Execution", on_delete=models.PROTECT, null=True, blank=True,
                                            related_name="+")
    state = models.CharField(max_length=16, choices=LaneState.choices, default=LaneState.OPEN)
    halt_reason = models.CharField(max_length=64, blank=True, default="")
    gap_since = models.DateTimeField(null=True, blank=True)
    fence = models.BigIntegerField(default=1)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["epoch", "account", "route", "route_version", "partition"],
                                    name="connector_lane_unique_partition"),
            models.CheckConstraint(condition=~Q(contract=OrderingContract.ORDER_INDEPENDENT),
                                   name="connector_lane_not_order_independent"),
            models.CheckConstraint(condition=Q(high_water__isnull=True) | Q(baseline__isnull=True)
                                   | Q(high_water__gte=models.F("baseline")), name="connector_lane_high_water_ge_baseline"),
        ]
        indexes = [
            # /metrics and the quarantine board count halted lanes by reason (issue 21). Lanes are rewritten on every
            # advance, so the table carries dead space that a count must not scan (buffers grew 21 -> 392 at 1M
            # retained receipts, docs/benchmarks.md). Neither indexed column changes on an advance: HOT updates of
            # the hot path are kept (changed_at, which does, stays out of every lane index).
            models.Index(fields=["halt_reason"], condition=Q(state="halted"), name="connector_lane_halted"),
        ]
        permissions = [("resume_orderinglane", "Can resume a halted ordering lane with authoritative evidence")]

    def __str__(self) -> str:
        return f"lane {self.route}/{self.partition} hw={self.high_water}"


class SupersededDecision(models.Model):
    """Append-only: a projection at or below the high-water, or lower than the selected greatest position, is
    superseded without calling Runtime (decision 8). Invariant: one per projection."""

    lane = models.ForeignKey(OrderingLane, on_delete=models.PROTECT, related_name="superseded")
    projection = models.OneToOneField("connector.Projection", on_delete=models.PROTECT, related_name="superseded")
    position = models.DecimalField(max_digits=38, decimal_places=0)
    high_water_at_decision = models.DecimalField(max_digits=38, decimal_places=0, null=True)
    selected_position = models.DecimalField(max_digits=38, decimal_places=0, null=True)
    reason = models.CharField(max_length=32)
    decided_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]


class GapDecision(models.Model):
    """Append-only record of a strict-sequence gap reaching its frozen deadline and the disposition applied."""

    lane = models.ForeignKey(OrderingLane, on_delete=models.PROTECT, related_name="gap_decisions")
    expected_position = models.DecimalField(max_digits=38, decimal_places=0)
    next_available = models.DecimalField(max_digits=38, decimal_places=0, null=True)
    disposition = models.CharField(max_length=32)
    decided_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]


class LaneResumption(models.Model):
    """Append-only: the authorized remediation that reopened a halted lane under a new fence (CV2-13-001..005),
    never a timer. `missing_arrived`: a GAP_DEADLINE halt whose missing position has since arrived (the late events
    then apply in order). `skip_with_evidence`: an operator's authoritative evidence that the lane may move past
    the blocking position (the high-water moves, as the frozen `skip_with_evidence` disposition would).
    `replay`: a ReplayRequest of the quarantined execution that halted the lane; its execution runs first.
    Invariants: the fence after is the fence before + 1; one per lane fence; never updated."""

    MODES = ("missing_arrived", "skip_with_evidence", "replay")

    lane = models.ForeignKey(OrderingLane, on_delete=models.PROTECT, related_name="resumptions")
    halt_reason = models.CharField(max_length=64)
    mode = models.CharField(max_length=32, choices=[(m, m) for m in MODES])
    blocking_position = models.DecimalField(max_digits=38, decimal_places=0)
    high_water_before = models.DecimalField(max_digits=38, decimal_places=0, null=True)
    high_water_after = models.DecimalField(max_digits=38, decimal_places=0, null=True)
    fence_before = models.BigIntegerField()
    fence_after = models.BigIntegerField()
    replay_request = models.ForeignKey("connector.ReplayRequest", on_delete=models.PROTECT, null=True, blank=True,
                                       related_name="+")
    evidence = models.TextField()
    actor = models.CharField(max_length=255)
    resumed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["lane", "fence_before"], name="connector_laneresumption_once_per_fence"),
            models.CheckConstraint(condition=Q(fence_after=models.F("fence_before") + 1),
                                   name="connector_laneresumption_new_fence"),
            models.CheckConstraint(condition=Q(mode__in=["missing_arrived", "skip_with_evidence", "replay"]),
                                   name="connector_laneresumption_mode"),
            models.CheckConstraint(condition=~Q(mode="replay") | Q(replay_request__isnull=False),
                                   name="connector_laneresumption_replay_names_request"),
            models.CheckConstraint(condition=~Q(evidence=""), name="connector_laneresumption_has_evidence"),
        ]

    def __str__(self) -> str:
        return f"{self.mode} of lane #{self.lane_id} at fence {self.fence_before}"
