"""The delivery journal's safety: the mutation gate, reconciliation campaigns, per-operation reconciliations
(operator-only transitions) and the journal epoch attestations kept in the `journal` database."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from effects.choices import GateState
from effects.models.delivery.operations import DeliveryOperation

__all__ = ["MutationGate", "ReconciliationCampaign", "DeliveryReconciliation", "JournalEpochAttestation"]


class MutationGate(ConcurrentTransitionMixin, models.Model):
    """The delivery mutation gate (one row). Submits lock it FOR SHARE and require ENABLED and the journal epoch
    attested in the journal database; blocking and unblocking lock it FOR UPDATE."""

    singleton = models.BooleanField(default=True, unique=True)
    state = FSMField(default=GateState.ENABLED, choices=GateState.choices, protected=True)
    journal_epoch = models.PositiveIntegerField(default=1)
    blocked_reason = models.CharField(max_length=64, blank=True, default="")
    blocked_detail = models.TextField(blank=True, default="")
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(singleton=True), name="delivery_gate_singleton")]

    @transition(field=state, source=[GateState.ENABLED, GateState.BLOCKED], target=GateState.BLOCKED)
    def block(self, *, reason: str, detail: str) -> None:
        self.blocked_reason, self.blocked_detail = reason, detail

    @transition(field=state, source=GateState.BLOCKED, target=GateState.ENABLED,
                permission="effects.approve_journal_epoch")
    def unblock(self, *, journal_epoch: int) -> None:
        self.journal_epoch = journal_epoch
        self.blocked_reason, self.blocked_detail = "", ""


class ReconciliationCampaign(models.Model):
    """A journal reconciliation campaign: every operation with an open attempt reconciled by attempt ID, with
    its findings. Required (completed) to unblock the mutation gate."""

    campaign_id = models.CharField(max_length=128, unique=True)
    reason = models.CharField(max_length=64)
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    findings = models.JSONField(default=list)
    completed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)


class DeliveryReconciliation(models.Model):
    """Append-only record of one operator-only transition: reconciliation ID, the tuple moved from and to, the
    proof it carried (effect proof, evidence digest or verification proof) and the approving user."""

    operation = models.ForeignKey(DeliveryOperation, on_delete=models.PROTECT, related_name="reconciliations")
    reconciliation_id = models.CharField(max_length=128)
    from_state = models.CharField(max_length=64)
    to_state = models.CharField(max_length=64)
    revision = models.PositiveIntegerField()
    proof_kind = models.CharField(max_length=24, blank=True, default="")
    proof = models.JSONField(null=True, blank=True)
    proof_digest = models.BinaryField(max_length=32, null=True, blank=True)
    approved_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operation", "pk"]
        constraints = [models.UniqueConstraint(fields=["operation", "revision"],
                                               name="delivery_reconciliation_revision")]


class JournalEpochAttestation(models.Model):
    """An attested journal epoch, kept in the `journal` database (outside what a restore of `default` replaces).
    The newest attestation is the epoch submits must match; a restored `default` that lags it is detected."""

    journal_database = True

    epoch = models.PositiveIntegerField(unique=True)
    reason = models.CharField(max_length=64)
    campaign_id = models.CharField(max_length=128, blank=True, default="")
    attested_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["epoch"]
