"""The V1 restore point, its isolated rehearsal and the full restore attempt (seed steps 6 and 10b).

All three live in the `journal` database: they are the receipts a restore of `default` is checked against, so
they must survive that restore (CV2-12-050/093). A restore point and a rehearsal are immutable; a RestoreAttempt
moves only forward through its durable boundaries and is resumed, never replaced (CV2-12-075).
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Length
from django.db.models.lookups import Exact
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from cutover.choices import RestoreAttemptState

__all__ = ["V1RestorePoint", "RestorePointRehearsal", "RestoreAttempt"]

RESTORE_POINT_DIGESTS = (
    "v1_binary_digest", "v1_schema_digest", "v1_configuration_digest", "configuration_digest", "schema_digest",
    "content_digest", "cursors_digest", "account_gate_digest", "shutdown_certificate_digest",
    "identity_coverage_digest", "ordering_coverage_digest", "effect_evidence_digest", "dump_sha256", "digest")


def _digest(field: str, name: str) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Exact(Length(field), 32), name=name)


class V1RestorePoint(models.Model):
    """A transactionally consistent full snapshot of `default`, taken at `v1_drained` before any V2 mutation.
    Freezes the attempt, the exact V1 release tuple and every digest a restore is verified against; the dump
    file is named by path, sha256 and size. `digest = sha256(payload)`; one per attempt; immutable."""

    journal_database = True

    attempt_key = models.CharField(max_length=255, unique=True)
    database_name = models.CharField(max_length=255)
    v1_release_id = models.CharField(max_length=255)
    v1_binary_digest = models.BinaryField(max_length=32)
    v1_schema_digest = models.BinaryField(max_length=32)
    v1_configuration_digest = models.BinaryField(max_length=32)
    configuration_digest = models.BinaryField(max_length=32)
    schema_digest = models.BinaryField(max_length=32)
    content_digest = models.BinaryField(max_length=32)
    cursors_digest = models.BinaryField(max_length=32)
    account_gate_digest = models.BinaryField(max_length=32)
    shutdown_certificate_digest = models.BinaryField(max_length=32)
    identity_coverage_digest = models.BinaryField(max_length=32)
    ordering_coverage_digest = models.BinaryField(max_length=32)
    effect_evidence_digest = models.BinaryField(max_length=32)
    dump_path = models.CharField(max_length=1024)
    dump_sha256 = models.BinaryField(max_length=32)
    dump_bytes = models.BigIntegerField()
    payload = models.BinaryField()
    digest = models.BinaryField(max_length=32, unique=True)
    captured_by = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            *(_digest(f, f"cutover_restorepoint_{f}_length") for f in RESTORE_POINT_DIGESTS),
            models.CheckConstraint(condition=Q(dump_bytes__gt=0), name="cutover_restorepoint_dump_nonempty"),
        ]

    def __str__(self) -> str:
        return f"V1 restore point of {self.attempt_key}"


class RestorePointRehearsal(models.Model):
    """One isolated rehearsal: the dump restored into a scratch database, its digests recomputed and equal, and
    the exact V1 release booted against it (boot receipt digest). Immutable."""

    journal_database = True

    restore_point = models.ForeignKey(V1RestorePoint, on_delete=models.PROTECT, related_name="rehearsals")
    attempt_key = models.CharField(max_length=255)
    scratch_database = models.CharField(max_length=255)
    schema_digest = models.BinaryField(max_length=32)
    content_digest = models.BinaryField(max_length=32)
    dump_sha256 = models.BinaryField(max_length=32)
    boot_receipt_digest = models.BinaryField(max_length=32)
    digest = models.BinaryField(max_length=32, unique=True)
    rehearsed_by = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [_digest(f, f"cutover_rehearsal_{f}_length") for f in (
            "schema_digest", "content_digest", "dump_sha256", "boot_receipt_digest", "digest")]

    def __str__(self) -> str:
        return f"rehearsal #{self.pk} of {self.attempt_key}"


class RestoreAttempt(ConcurrentTransitionMixin, models.Model):
    """The one full restore of an attempt (one per attempt: a crashed run resumes the same row). The recovery
    receipt (`recovery_digest` over the verified restored digests) is written with `receipt_recorded`; the new V1
    generation with `v1_serving`. State never changes because a timeout expired."""

    journal_database = True

    attempt_key = models.CharField(max_length=255, unique=True)
    restore_point = models.ForeignKey(V1RestorePoint, on_delete=models.PROTECT, related_name="restores")
    state = FSMField(default=RestoreAttemptState.STARTED, choices=RestoreAttemptState.choices, protected=True)
    fence = models.BigIntegerField(default=1)
    restored_content_digest = models.BinaryField(max_length=32, null=True, blank=True)
    recovery_payload = models.BinaryField(null=True, blank=True)
    recovery_digest = models.BinaryField(max_length=32, null=True, blank=True)
    v1_generation_id = models.CharField(max_length=255, blank=True, default="")
    started_by = models.CharField(max_length=255)
    changed_at = models.DateTimeField(auto_now=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=RestoreAttemptState.values), name="cutover_restore_state"),
            models.CheckConstraint(
                condition=Q(state=RestoreAttemptState.STARTED) | Q(restored_content_digest__isnull=False),
                name="cutover_restore_restored_has_digest"),
            models.CheckConstraint(
                condition=Q(state__in=[RestoreAttemptState.STARTED, RestoreAttemptState.DATABASE_RESTORED])
                | Q(recovery_digest__isnull=False, recovery_payload__isnull=False),
                name="cutover_restore_receipt_has_digest"),
            models.CheckConstraint(condition=~Q(state=RestoreAttemptState.V1_SERVING) | ~Q(v1_generation_id=""),
                                   name="cutover_restore_serving_has_generation"),
        ]

    def __str__(self) -> str:
        return f"restore of {self.attempt_key} ({self.state})"

    @transition(field=state, source=RestoreAttemptState.STARTED, target=RestoreAttemptState.DATABASE_RESTORED)
    def database_restored(self, *, content_digest: bytes) -> None:
        self.restored_content_digest = content_digest
        self.fence += 1

    @transition(field=state, source=RestoreAttemptState.DATABASE_RESTORED,
                target=RestoreAttemptState.RECEIPT_RECORDED)
    def record_receipt(self, *, payload: bytes, digest: bytes) -> None:
        self.recovery_payload = payload
        self.recovery_digest = digest
        self.fence += 1

    @transition(field=state, source=RestoreAttemptState.RECEIPT_RECORDED, target=RestoreAttemptState.V1_SERVING)
    def serve_v1(self, *, generation_id: str) -> None:
        self.v1_generation_id = generation_id
        self.fence += 1
