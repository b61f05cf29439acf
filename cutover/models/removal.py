"""The record of the V1 tables' removal (CV2-12-078): which tables were dropped, with their row counts and content
digests taken inside the dropping transaction, and the digest of the dependency checks that all came back empty.
Append-only in PostgreSQL (migration 0019); at most one per service (the product runs one V1 service)."""
from __future__ import annotations

from django.db import models
from django.db.models.functions import Length
from django.db.models.lookups import Exact

from cutover.models.attempt import ServiceCutoverAttempt

__all__ = ["V1TableRemoval"]


class V1TableRemoval(models.Model):
    """`tables` is [[table, rows, sha256 hex of its rows as text in text order], ...] in drop order; `checks` the
    dependency checks run (each code with the rows it found: zero); `payload` the canonical encoding of all of it
    and `digest` its sha256."""

    attempt = models.OneToOneField(ServiceCutoverAttempt, on_delete=models.PROTECT, related_name="v1_removal")
    tables = models.JSONField()
    checks = models.JSONField()
    reason = models.TextField()
    removed_by = models.CharField(max_length=255)
    payload = models.BinaryField()
    digest = models.BinaryField(max_length=32, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.CheckConstraint(condition=Exact(Length("digest"), 32),
                                              name="cutover_v1removal_digest_length")]

    def __str__(self) -> str:
        return f"V1 tables removed after {self.attempt.attempt_key}"
