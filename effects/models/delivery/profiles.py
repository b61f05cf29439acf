"""Operation profiles and the remote job semaphore of each (certified remote principal, profile)."""
from __future__ import annotations

from django.db import models
from django.db.models import Q

__all__ = ["DeliveryProfile", "RemoteJobSemaphore"]


class DeliveryProfile(models.Model):
    """An immutable operation profile: receiver kind, mutation policy, scope kind, the operation semantics
    (digested) and the execution policy (digested separately), and their profile contract digest."""

    name = models.CharField(max_length=128, unique=True)
    receiver_kind = models.CharField(max_length=16, choices=[("sync_batch", "sync_batch"),
                                                             ("async_bulk_job", "async_bulk_job")])
    mutation_policy = models.CharField(max_length=24, choices=[("incremental_append", "incremental_append"),
                                                               ("partition_replace", "partition_replace")])
    scope_kind = models.CharField(max_length=16, choices=[("date", "date"), ("timestamp", "timestamp")])
    operation_semantics = models.JSONField()
    execution_policy = models.JSONField()
    append_exception = models.JSONField(null=True, blank=True)
    profile_schema_id = models.CharField(max_length=128)
    profile_version = models.PositiveIntegerField()
    max_records_per_child = models.PositiveIntegerField()
    operation_semantics_digest = models.BinaryField(max_length=32)
    execution_policy_digest = models.BinaryField(max_length=32)
    profile_contract_digest = models.BinaryField(max_length=32, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return self.name

    def policy(self, name: str, default=None):
        return self.execution_policy.get(name, default)


class RemoteJobSemaphore(models.Model):
    """Remote job capacity per certified remote principal and operation profile. Reservations are the attempts
    whose `capacity_state` is `reserved`; the row is locked FOR UPDATE to count and reserve."""

    remote_principal_id = models.CharField(max_length=255)
    profile = models.ForeignKey(DeliveryProfile, on_delete=models.PROTECT, related_name="semaphores")
    capacity = models.PositiveIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["remote_principal_id", "profile"],
                                               name="delivery_semaphore_scope"),
                       models.CheckConstraint(condition=Q(capacity__gte=1), name="delivery_semaphore_capacity")]
