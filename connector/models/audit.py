"""Append-only audit of every transition and approval. Audit observes; it never decides (CV2-02-006)."""
from __future__ import annotations

from django.db import models

__all__ = ["AuditRecord"]


class AuditRecord(models.Model):
    """One transition or approval. Invariant: append-only (the database refuses UPDATE and DELETE)."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=255)
    # The acting person's user id (None for a system actor): identity governance reads who controlled an account
    # from here (connector.selectors.identity), never from the display name, which a rename could forge.
    actor_user_id = models.BigIntegerField(null=True, blank=True)
    entity_type = models.CharField(max_length=100)
    entity_id = models.CharField(max_length=255)
    action = models.CharField(max_length=100)
    from_state = models.CharField(max_length=64, blank=True, default="")
    to_state = models.CharField(max_length=64, blank=True, default="")
    fence = models.BigIntegerField(null=True, blank=True)
    evidence_digest = models.BinaryField(max_length=32, null=True, blank=True)
    reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["entity_type", "entity_id"], name="connector_audit_entity_idx")]

    def __str__(self) -> str:
        return f"{self.entity_type}:{self.entity_id} {self.from_state}->{self.to_state} by {self.actor}"
