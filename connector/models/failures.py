"""StepFailure: the evidence of one deterministic failure of a sweeper or worker step on one item (decision D-168).

The item itself carries the decision in its own closed vocabulary (an Execution or window `quarantined`, a lane
`halted`, a held MaterializationDue, a RemoteEffect's quarantine reason, a held DeliveryOperation); this row is
what the operator reads: which step, on which item, when, the exception class and message (CV2-13-001). Like the
audit trail it names the item by model label and primary key, so one table serves every app."""
from __future__ import annotations

from django.db import models
from django.db.models import Q

from connector.choices import StepFailureReason, SweepStep

__all__ = ["StepFailure"]


class StepFailure(models.Model):
    """One deterministic failure of one step on one item. Invariants: append-only (the database refuses UPDATE
    and DELETE); reason and step are closed codes; the message holds no NUL and at most MESSAGE_LIMIT characters."""

    MESSAGE_LIMIT = 2000

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    entity_type = models.CharField(max_length=100)
    entity_id = models.CharField(max_length=255)
    step = models.CharField(max_length=64, choices=SweepStep.choices)
    reason_code = models.CharField(max_length=64, choices=StepFailureReason.choices)
    exception_class = models.CharField(max_length=255)
    message = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-at", "-pk"]
        constraints = [
            models.CheckConstraint(condition=Q(step__in=SweepStep.values), name="connector_stepfailure_step"),
            models.CheckConstraint(condition=Q(reason_code__in=StepFailureReason.values),
                                   name="connector_stepfailure_reason"),
        ]
        indexes = [models.Index(fields=["entity_type", "entity_id"], name="connector_stepfailure_entity")]

    def __str__(self) -> str:
        return f"{self.reason_code} in {self.step} on {self.entity_type}:{self.entity_id}"
