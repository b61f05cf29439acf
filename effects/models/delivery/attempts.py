"""Submit attempts of an operation: the MAY_ATTEMPT marker committed before any attempt, the attempt with its
remote job capacity reservation, and the append-only observations of each receiver answer."""
from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from effects.choices import CapacityState
from effects.models.delivery.operations import DeliveryOperation
from effects.models.delivery.profiles import RemoteJobSemaphore

__all__ = ["MayAttemptMarker", "DeliveryAttempt", "DeliveryObservation"]


class MayAttemptMarker(models.Model):
    """The immutable pre-attempt marker, created if absent per (namespace, operation, attempt ordinal) in the same
    transaction as the capacity reservation, the attempt row and the CAS to SUBMITTING."""

    kind = models.CharField(max_length=16, default="MAY_ATTEMPT", editable=False)
    attempt_id = models.UUIDField(unique=True, default=uuid.uuid4)
    attempt_ordinal = models.PositiveIntegerField()
    operation = models.ForeignKey(DeliveryOperation, on_delete=models.PROTECT, related_name="markers")
    operation_namespace = models.BinaryField(max_length=32)
    parent_and_child_identity = models.CharField(max_length=512)
    generation = models.CharField(max_length=64)
    expected_journal_revision = models.PositiveIntegerField()
    journal_epoch = models.PositiveIntegerField()
    mutation_intent_digest = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operation", "attempt_ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["operation_namespace", "operation", "attempt_ordinal"],
                                    name="delivery_marker_create_if_absent_key"),
            models.CheckConstraint(condition=Q(kind="MAY_ATTEMPT"), name="delivery_marker_kind"),
        ]


class DeliveryAttempt(models.Model):
    """One submit attempt, bound to its MAY_ATTEMPT marker and holding a remote job capacity reservation until
    the contract's release policy lets it go. `io_may_have_started` is committed by the egress adapter before any
    byte leaves; the outcome is written once."""

    operation = models.ForeignKey(DeliveryOperation, on_delete=models.PROTECT, related_name="attempts")
    ordinal = models.PositiveIntegerField()
    attempt_id = models.UUIDField(unique=True)
    marker = models.OneToOneField(MayAttemptMarker, on_delete=models.PROTECT, related_name="attempt")
    semaphore = models.ForeignKey(RemoteJobSemaphore, on_delete=models.PROTECT, related_name="attempts")
    capacity_state = models.CharField(max_length=16, choices=CapacityState.choices, default=CapacityState.RESERVED)
    capacity_released_reason = models.CharField(max_length=64, blank=True, default="")
    io_may_have_started = models.BooleanField(default=False)
    io_started_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=24, blank=True, default="")  # not_started | answered | ambiguous
    response_status = models.PositiveIntegerField(null=True, blank=True)
    response_digest = models.BinaryField(max_length=32, null=True, blank=True)
    evidence = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["operation", "ordinal"]
        constraints = [models.UniqueConstraint(fields=["operation", "ordinal"], name="delivery_attempt_ordinal")]
        indexes = [models.Index(fields=["semaphore"], name="delivery_capacity_reserved",
                                condition=Q(capacity_state="reserved"))]


class DeliveryObservation(models.Model):
    """Append-only evidence of each answer the receiver gave (submit response, receipt poll)."""

    operation = models.ForeignKey(DeliveryOperation, on_delete=models.PROTECT, related_name="observations")
    ordinal = models.PositiveIntegerField()
    attempt = models.ForeignKey(DeliveryAttempt, on_delete=models.PROTECT, null=True, related_name="+")
    kind = models.CharField(max_length=16)  # submit | poll | verify
    acknowledgement = models.CharField(max_length=24)
    http_status = models.PositiveIntegerField(null=True)
    applied_count = models.IntegerField(null=True)
    body_digest = models.BinaryField(max_length=32, null=True)
    detail = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operation", "ordinal"]
        constraints = [models.UniqueConstraint(fields=["operation", "ordinal"], name="delivery_observation_ordinal")]
