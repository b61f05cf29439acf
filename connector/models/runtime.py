"""Runtime-owned facts: the demo CRM records and the immutable ApplicationResult. Runtime commits both in one
transaction; the Connector only keeps result correlation (command ID, ExecutionRef digest, result digest,
Runtime commit receipt)."""
from __future__ import annotations

from django.contrib.postgres.indexes import BrinIndex
from django.db import models

from connector.choices import ResultOutcome
from connector.models.owners import ConnectorAccount

__all__ = ["CrmRecord", "ApplicationResult"]


class CrmRecord(models.Model):
    """A demo CRM record owned by Runtime. Invariant: one per (account, record key); `version` counts commits."""

    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="crm_records")
    record_key = models.CharField(max_length=255)
    fields = models.JSONField(default=dict)
    version = models.PositiveIntegerField(default=0)
    last_command_id = models.CharField(max_length=128, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.UniqueConstraint(fields=["account", "record_key"], name="connector_crmrecord_unique")]

    def __str__(self) -> str:
        return f"{self.record_key} v{self.version}"


class ApplicationResult(models.Model):
    """The immutable terminal application outcome of one Runtime command. Invariant: one per command ID (one per
    Execution generation); addressed by command ID plus ExecutionRef digest; never updated."""

    command_id = models.CharField(max_length=128, unique=True)
    execution_ref_digest = models.BinaryField(max_length=32)
    outcome = models.CharField(max_length=16, choices=ResultOutcome.choices)
    result_digest = models.BinaryField(max_length=32)
    receipt = models.BinaryField()
    detail = models.TextField(blank=True, default="")
    committed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.CheckConstraint(condition=models.Q(outcome__in=ResultOutcome.values),
                                              name="connector_applicationresult_outcome")]
        # The overview's throughput of the last hour (issue 21): a BRIN index on the append-ordered commit time
        # reads only the recent block ranges, whatever the retained history, at almost no write cost.
        indexes = [BrinIndex(fields=["committed_at"], name="connector_result_time_brin", autosummarize=True, pages_per_range=8)]


    def __str__(self) -> str:
        return f"{self.command_id}: {self.outcome}"