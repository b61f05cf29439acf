"""The service cutover attempt (V1 -> V2, whole service) and its V1ShutdownCertificate.

These two facts are the spine the cutover phases hang from: every maintenance-barrier receipt, readiness
certificate, gate transition, tombstone export, ordering baseline, restore point, restore attempt and activation
names exactly one attempt (CV2-12-028). The attempt's phase is not stored: it is read from the frozen gates, the
certificates and the journal's CutoverDecision (cutover.selectors.attempt_phase), so there is no second state
machine to keep in step with the gates.

Invariants: at most one open attempt per service; the binding columns never change (only `outcome`/`closed_at`
are written, once); a shutdown certificate is immutable, one per attempt.
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Length
from django.db.models.lookups import Exact


__all__ = ["AttemptOutcome", "ServiceCutoverAttempt", "V1ShutdownCertificate"]

SERVICE = "connector"


class AttemptOutcome(models.TextChoices):
    OPEN = "open"  # initial
    ABORTED = "aborted"  # halting_v1 -> v1_serving abort before termination
    COLD_ABORTED = "cold_aborted"  # v1_drained -> v1_serving with a new V1 process generation
    V1_RESTORED = "v1_restored"  # a RestoreAttempt completed
    V2_COMMITTED = "v2_committed"  # first activation committed and read back


def _digest(field: str, name: str) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Exact(Length(field), 32), name=name)


class ServiceCutoverAttempt(models.Model):
    """One planned whole-service maintenance moving every account of one configuration generation from V1 to the
    candidate V2 epoch. Binds the exact configuration generation, the candidate epoch (verified offline before
    maintenance), the frozen V1 release and process generation, and the exhaustive account-set digest."""

    service = models.CharField(max_length=64, default=SERVICE)
    attempt_key = models.CharField(max_length=255, unique=True)
    configuration = models.ForeignKey("connector.ServiceConfigurationGeneration", on_delete=models.PROTECT,
                                      related_name="+")
    candidate_epoch = models.ForeignKey("connector.ServingEpoch", on_delete=models.PROTECT, related_name="+")
    candidate_epoch_digest = models.BinaryField(max_length=32)
    v1_release_id = models.CharField(max_length=255)
    v1_generation_id = models.CharField(max_length=255)
    account_set_digest = models.BinaryField(max_length=32)
    account_count = models.PositiveIntegerField()
    opened_by = models.CharField(max_length=255)
    outcome = models.CharField(max_length=32, choices=AttemptOutcome.choices, default=AttemptOutcome.OPEN)
    closed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["service"], condition=Q(outcome=AttemptOutcome.OPEN),
                                    name="cutover_attempt_one_open_per_service",
                                    violation_error_code="attempt_open"),
            models.CheckConstraint(condition=Q(outcome__in=AttemptOutcome.values), name="cutover_attempt_outcome"),
            models.CheckConstraint(condition=Q(outcome=AttemptOutcome.OPEN, closed_at__isnull=True)
                                   | (~Q(outcome=AttemptOutcome.OPEN) & Q(closed_at__isnull=False)),
                                   name="cutover_attempt_closed_iff_outcome"),
            _digest("candidate_epoch_digest", "cutover_attempt_epoch_digest_length"),
            _digest("account_set_digest", "cutover_attempt_account_set_digest_length"),
        ]
        permissions = [("coordinate_cutover", "Can run V1 -> V2 service cutover phases")]

    def __str__(self) -> str:
        return f"cutover {self.attempt_key} ({self.outcome})"


class V1ShutdownCertificate(models.Model):
    """The durable proof that V1 is stopped and drained for one attempt (seed step 5). `payload` is the canonical
    encoding of every binding below plus the evidence digests; `digest = sha256(payload)`. Every frozen gate
    that enters `v1_drained` is audited with this digest. Immutable; one per attempt."""

    attempt = models.OneToOneField(ServiceCutoverAttempt, on_delete=models.PROTECT, related_name="shutdown_certificate")
    v1_release_id = models.CharField(max_length=255)
    v1_binary_digest = models.BinaryField(max_length=32)
    v1_schema_digest = models.BinaryField(max_length=32)
    configuration_digest = models.BinaryField(max_length=32)
    readiness_certificate_digest = models.BinaryField(max_length=32)
    account_set_digest = models.BinaryField(max_length=32)
    egress_manifest_digest = models.BinaryField(max_length=32)
    barrier_receipts_digest = models.BinaryField(max_length=32)
    inventory_digest = models.BinaryField(max_length=32)
    tombstone_coverage_digest = models.BinaryField(max_length=32)
    baseline_coverage_digest = models.BinaryField(max_length=32)
    termination_receipt_digest = models.BinaryField(max_length=32)
    isolation_receipt_digest = models.BinaryField(max_length=32)
    payload = models.BinaryField()
    digest = models.BinaryField(max_length=32, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [_digest(f, f"cutover_shutdowncert_{f}_length") for f in (
            "v1_binary_digest", "v1_schema_digest", "configuration_digest", "readiness_certificate_digest",
            "account_set_digest", "egress_manifest_digest", "barrier_receipts_digest", "inventory_digest",
            "tombstone_coverage_digest", "baseline_coverage_digest", "termination_receipt_digest",
            "isolation_receipt_digest", "digest")]

    def __str__(self) -> str:
        return f"V1 shutdown certificate of {self.attempt.attempt_key}"
