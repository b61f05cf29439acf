"""DestinationLimiter: the shared rate and concurrency state of one outbound destination (issue 20, D-222)."""
from __future__ import annotations

from django.db import models
from django.db.models import F, Q


__all__ = ["DestinationLimiter"]


class DestinationLimiter(models.Model):
    """Token-bucket and deferral state of one destination: an account's callout (the provider endpoint one
    credential addresses), shared by every egress process. The limits themselves are frozen on each
    OutboundCommand (its route policy digest covers them); this row holds only the moving state. Locked FOR UPDATE
    by permit acquisition (after the effect, before the permit: docs/locking.md) and by a settlement that carries a
    receiver's `Retry-After`. In flight = the destination's permits in `granted`/`sending`, counted through the
    `effects_permit_limiter_open` index under this lock. Invariants: one per (account, callout); tokens never
    negative; counters never negative; `deferred_until` never after `not_before`."""

    account = models.ForeignKey("connector.ConnectorAccount", on_delete=models.PROTECT,
                                related_name="destination_limiters")
    callout = models.CharField(max_length=255)
    # Tokens left at `refilled_at` (null: never used, the bucket is full).
    tokens = models.FloatField(default=0)
    refilled_at = models.DateTimeField(null=True, blank=True)
    # A receiver's Retry-After (capped): no permit for this destination before it.
    deferred_until = models.DateTimeField(null=True, blank=True)
    # The earliest time a permit can be granted as far as time is concerned (next token or deferral); claims skip
    # the destination's effects before it, so a throttled destination costs no claim.
    not_before = models.DateTimeField(null=True, blank=True)
    granted_total = models.BigIntegerField(default=0)
    refused_total = models.BigIntegerField(default=0)
    deferrals_total = models.BigIntegerField(default=0)
    last_deferral_status = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["account", "callout"], name="effects_limiter_one_per_destination",
                                    violation_error_code="limiter_exists"),
            models.CheckConstraint(condition=Q(tokens__gte=0), name="effects_limiter_tokens_not_negative"),
            models.CheckConstraint(condition=Q(granted_total__gte=0, refused_total__gte=0, deferrals_total__gte=0),
                                   name="effects_limiter_counters_not_negative"),
            models.CheckConstraint(condition=Q(deferred_until__isnull=True)
                                   | Q(not_before__isnull=False, not_before__gte=F("deferred_until")),
                                   name="effects_limiter_deferral_within_not_before"),
        ]

    def __str__(self) -> str:
        return f"limiter {self.account_id}/{self.callout}"
