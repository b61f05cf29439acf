"""Effect conflict domains: the domain lock row, the scoped generation every domain-scoped row carries, and the
domain's range watermarks (highest applied generation per scope, non-overlapping)."""
from __future__ import annotations

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import DateRangeField, DateTimeRangeField, RangeOperators
from django.db import models
from django.db.models import Q

__all__ = ["EffectDomainLock", "ScopedGeneration", "DeliveryWatermark"]


class EffectDomainLock(models.Model):
    """One row per effect conflict domain (a physical receiver resource shared across local namespaces and
    mutation kinds), created with INSERT ... ON CONFLICT DO NOTHING and locked FOR UPDATE in canonical order
    (domain digest) by every admission, submit and effect commit of the domain."""

    domain_digest = models.BinaryField(max_length=32, unique=True)
    remote_principal_id = models.CharField(max_length=255)
    remote_account_id = models.CharField(max_length=255)
    remote_resource_namespace = models.CharField(max_length=255)
    receiver_resource_id = models.CharField(max_length=255)
    effect_conflict_group = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "rest_delivery_effect_domain_lock"

    def __str__(self) -> str:
        return f"{self.remote_account_id}/{self.receiver_resource_id}/{self.effect_conflict_group}"


class ScopedGeneration(models.Model):
    """A half-open scope range (daterange or tstzrange, by the profile's scope kind) and a generation
    (scheduled interval end, correction revision)."""

    scope_date = DateRangeField(null=True, blank=True)
    scope_ts = DateTimeRangeField(null=True, blank=True)
    generation_end = models.DateTimeField()
    correction_revision = models.PositiveIntegerField()

    class Meta:
        abstract = True

    @property
    def scope(self):
        return self.scope_date if self.scope_date is not None else self.scope_ts

    @property
    def generation(self) -> tuple:
        return (self.generation_end, self.correction_revision)


def one_scope(prefix: str) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Q(scope_date__isnull=True, scope_ts__isnull=False)
                                  | Q(scope_date__isnull=False, scope_ts__isnull=True), name=f"{prefix}_one_scope")


class DeliveryWatermark(ScopedGeneration):
    """The normalized, non-overlapping interval map of highest applied generation per effect conflict domain.
    Non-overlap is an exclusion constraint; split and merge happen under the domain lock in the effect commit."""

    domain = models.ForeignKey(EffectDomainLock, on_delete=models.PROTECT, related_name="watermarks")

    class Meta:
        ordering = ["domain", "pk"]
        constraints = [
            one_scope("delivery_watermark"),
            ExclusionConstraint(name="delivery_watermark_ts_disjoint", index_type="gist",
                                expressions=[("domain", RangeOperators.EQUAL),
                                             ("scope_ts", RangeOperators.OVERLAPS)]),
            ExclusionConstraint(name="delivery_watermark_date_disjoint", index_type="gist",
                                expressions=[("domain", RangeOperators.EQUAL),
                                             ("scope_date", RangeOperators.OVERLAPS)]),
        ]
