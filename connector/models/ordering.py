"""Source ordering: OrderingLane (the sole mutable claim guard of a partition) and its append-only decisions."""
from __future__ import annotations

from django.db import models
from django.db.models import Q

from connector.choices import LaneState, OrderingContract
from connector.models.serving import ServingEpoch

__all__ = ["OrderingLane", "SupersededDecision", "GapDecision"]


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
