"""The evidence of a V1 -> V2 service cutover up to `v1_drained`: the readiness certificate, the owner barrier
receipts, the V1 process-generation receipts, the fenced `v1_stopped` reconciliations and the ordering baselines.
Every row names its ServiceCutoverAttempt and is append-only (PostgreSQL refuses UPDATE and DELETE: migration
`0009_readiness_db_rules`)."""
from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Length
from django.db.models.lookups import Exact

from cutover.models.attempt import ServiceCutoverAttempt

__all__ = ["OrderingDisposition", "CutoverReadinessCertificate", "MaintenanceBarrierReceipt",
           "V1GenerationReceipt", "V1Reconciliation", "OrderingBaseline", "ActivationInventory"]


def _digest(field: str, name: str) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Exact(Length(field), 32), name=name)


class OrderingDisposition(models.TextChoices):
    """The closed set of ordering-migration dispositions a route's certificate entry may freeze (CV2-12-013)."""

    ORDER_INDEPENDENT = "order_independent"
    V1_HIGH_WATER = "v1_high_water"
    PROVIDER_SNAPSHOT_BARRIER = "provider_snapshot_barrier"
    UNSUPPORTED = "unsupported"  # never certified: preflight refuses the cutover


class CutoverReadinessCertificate(models.Model):
    """Immutable, one per attempt: the exact candidate epoch and L2 generation, every route's ordering disposition
    and proof, the budget plan, the measured preflight figures and the conservative projections, the V1 release
    and egress manifest, and the closed reason-code map. `payload` is the canonical encoding of all of it and
    `digest` its sha256; the JSON columns are the same facts for reading."""

    attempt = models.OneToOneField(ServiceCutoverAttempt, on_delete=models.PROTECT,
                                   related_name="readiness_certificate")
    epoch_id = models.CharField(max_length=255)
    epoch_digest = models.BinaryField(max_length=32)
    configuration_generation_id = models.CharField(max_length=255)
    v1_release_id = models.CharField(max_length=255)
    egress_manifest_digest = models.BinaryField(max_length=32)
    # The V2 schema and binary digests verified offline before maintenance (CV2-12-019, cutover.services.v2_artifacts)
    v2_schema_digest = models.BinaryField(max_length=32)
    v2_binary_digest = models.BinaryField(max_length=32)
    routes = models.JSONField()
    budgets = models.JSONField()
    measurements = models.JSONField()
    projections = models.JSONField()
    reason_map = models.JSONField()
    payload = models.BinaryField()
    digest = models.BinaryField(max_length=32, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [_digest("digest", "cutover_readiness_digest_length"),
                       _digest("epoch_digest", "cutover_readiness_epoch_digest_length"),
                       _digest("v2_schema_digest", "cutover_readiness_v2_schema_digest_length"),
                       _digest("v2_binary_digest", "cutover_readiness_v2_binary_digest_length")]

    def __str__(self) -> str:
        return f"readiness certificate of {self.attempt.attempt_key}"


class MaintenanceBarrierReceipt(models.Model):
    """One owner barrier receipt (closed, or reopened on an abort), verified against the exact attempt and owner
    reference before it is stored (CV2-12-028)."""

    attempt = models.ForeignKey(ServiceCutoverAttempt, on_delete=models.PROTECT, related_name="barrier_receipts")
    barrier = models.CharField(max_length=32, choices=[(k, k) for k in ("ingress", "root_outbound", "authoring")])
    action = models.CharField(max_length=16, choices=[("closed", "closed"), ("reopened", "reopened")])
    owner_kind = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    payload = models.BinaryField()
    digest = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "barrier", "action"], name="cutover_barrierreceipt_once"),
            _digest("digest", "cutover_barrierreceipt_digest_length"),
        ]


class V1GenerationReceipt(models.Model):
    """The termination or provider-egress isolation receipt of the exact V1 process generation (CV2-12-037/038)."""

    attempt = models.ForeignKey(ServiceCutoverAttempt, on_delete=models.PROTECT, related_name="generation_receipts")
    kind = models.CharField(max_length=16, choices=[("terminated", "terminated"), ("isolated", "isolated")])
    generation_id = models.CharField(max_length=255)
    payload = models.BinaryField()
    digest = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "kind"], name="cutover_generationreceipt_once"),
            _digest("digest", "cutover_generationreceipt_digest_length"),
        ]


class V1Reconciliation(models.Model):
    """One fenced `v1_stopped` reconciliation: the V1 effect row, the outcome proved, the evidence digest and the
    gate-set fences it was taken under (CV2-12-040..042)."""

    attempt = models.ForeignKey(ServiceCutoverAttempt, on_delete=models.PROTECT, related_name="reconciliations")
    effect_row_id = models.CharField(max_length=64)
    outcome = models.CharField(max_length=32, choices=[("remote_finalized", "remote_finalized"),
                                                       ("no_effect", "no_effect")])
    evidence_digest = models.BinaryField(max_length=32)
    gate_fences_digest = models.BinaryField(max_length=32)
    receipt_digest = models.BinaryField(max_length=32)
    reason = models.TextField()
    actor = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.UniqueConstraint(fields=["attempt", "effect_row_id"],
                                               name="cutover_reconciliation_once_per_row")]


class OrderingBaseline(models.Model):
    """The drained V1 high-water (or frozen provider snapshot barrier) of one order-dependent route and partition:
    the first V2 lane continues after it. Evidence only: no lease, command or executable state."""

    attempt = models.ForeignKey(ServiceCutoverAttempt, on_delete=models.PROTECT, related_name="baselines")
    account = models.ForeignKey("connector.ConnectorAccount", on_delete=models.PROTECT, related_name="+")
    route_key = models.CharField(max_length=255)
    partition = models.CharField(max_length=255)
    high_water = models.DecimalField(max_digits=38, decimal_places=0)
    comparator = models.CharField(max_length=64)
    origin = models.CharField(max_length=32, choices=[(OrderingDisposition.V1_HIGH_WATER, "v1 high-water"), (
        OrderingDisposition.PROVIDER_SNAPSHOT_BARRIER, "provider snapshot barrier")])
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "account", "route_key", "partition"],
                                    name="cutover_baseline_once"),
            models.CheckConstraint(condition=Q(origin__in=(OrderingDisposition.V1_HIGH_WATER,
                                                           OrderingDisposition.PROVIDER_SNAPSHOT_BARRIER)),
                                   name="cutover_baseline_origin"),
        ]


class ActivationInventory(models.Model):
    """The closed inventory of the first activation (CV2-12-010, D-320), frozen when the barrier set is held: the
    digest of the code-level path registry (connector.selectors.inventory.PATHS) and of the per-activation
    inventory computed from the database (every account, gate, enabled route, credential dispatch gate and
    certified partition, each with its selected authority), with the count per kind. Written only when nothing
    is uncovered; the activation commit recomputes it and refuses any difference. Append-only (migration 0016);
    one per barrier set."""

    attempt = models.ForeignKey(ServiceCutoverAttempt, on_delete=models.PROTECT, related_name="inventories")
    barrier_set = models.OneToOneField("cutover.ServingPublicationBarrierSet", on_delete=models.PROTECT,
                                       related_name="inventory")
    epoch_digest = models.BinaryField(max_length=32)
    registry_digest = models.BinaryField(max_length=32)
    counts = models.JSONField()
    digest = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [_digest("digest", "cutover_inventory_digest_length"),
                       _digest("registry_digest", "cutover_inventory_registry_digest_length"),
                       _digest("epoch_digest", "cutover_inventory_epoch_digest_length")]

    def __str__(self) -> str:
        return f"activation inventory of {self.attempt.attempt_key}"
