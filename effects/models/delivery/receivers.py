"""Receivers: the approval receipt of the researched contract, receiver bindings with their secret versions, and
their certifications with the approvals of a platform-attested one."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django_fsm import FSMField, transition

from effects.choices import AuthenticationMode, CertificationState

__all__ = ["DeliveryApprovalReceipt", "ReceiverBinding", "ReceiverSecretVersion", "ReceiverCertification",
           "CertificationApproval"]


class DeliveryApprovalReceipt(models.Model):
    """The separate approval receipt (`dpone.rest-bulk-delivery-approval.v1`) that references the researched
    contract by digest and never edits it. Immutable; one per contract digest."""

    contract_digest = models.CharField(max_length=64, unique=True)
    schema = models.CharField(max_length=128, default="dpone.rest-bulk-delivery-approval.v1")
    adr_digests = models.JSONField()
    owner_approvals = models.JSONField()
    evidence_requirements = models.JSONField()
    approved_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"approval of contract {self.contract_digest[:12]}"


class ReceiverBinding(models.Model):
    """A receiver's stable, non-secret identity (the contract's `stable_non_secret_identity_fields`) and its
    semantics digest. Immutable: a principal swap is a new binding; a secret rotation is a new
    ReceiverSecretVersion of the same binding."""

    name = models.CharField(max_length=128, unique=True)
    base_url = models.CharField(max_length=512)
    authority_origin = models.CharField(max_length=512)
    remote_principal_id = models.CharField(max_length=255)
    remote_account_id = models.CharField(max_length=255)
    remote_resource_namespace = models.CharField(max_length=255)
    authentication_mode = models.CharField(max_length=32, choices=AuthenticationMode.choices)
    authentication_semantics = models.CharField(max_length=255)
    tls_policy_identity = models.CharField(max_length=255)
    network_policy_identity = models.CharField(max_length=255)
    api_key_query_exception = models.JSONField(null=True, blank=True)
    semantics_digest = models.BinaryField(max_length=32, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.CheckConstraint(
            condition=~Q(authentication_mode="api_key_query") | Q(api_key_query_exception__isnull=False),
            name="delivery_binding_api_key_query_needs_exception")]

    def __str__(self) -> str:
        return self.name


class ReceiverSecretVersion(models.Model):
    """A version reference of the binding's secret in the secret backend (never the secret). Append-only; the
    newest is used. Rotation adds one and leaves the binding's identity as it was."""

    binding = models.ForeignKey(ReceiverBinding, on_delete=models.PROTECT, related_name="secret_versions")
    version = models.PositiveIntegerField()
    secret_version_ref = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["binding", "version"]
        constraints = [models.UniqueConstraint(fields=["binding", "version"], name="delivery_secret_version")]


class ReceiverCertification(models.Model):
    """Certification of a binding from the connection handshake, with the remote identity (mode, principal,
    account, evidence ref, verified_at, valid_until) and immutable evidence (its digest). `platform_attested`
    needs dual approval and expires at `valid_until` (periodic recertification)."""

    binding = models.ForeignKey(ReceiverBinding, on_delete=models.PROTECT, related_name="certifications")
    assurance_mode = models.CharField(max_length=32, choices=[("receiver_attested", "receiver_attested"),
                                                              ("platform_attested", "platform_attested")])
    principal_id = models.CharField(max_length=255)
    account_id = models.CharField(max_length=255)
    evidence_ref = models.CharField(max_length=512)
    evidence = models.JSONField()
    evidence_digest = models.BinaryField(max_length=32)
    verified_at = models.DateTimeField()
    valid_until = models.DateTimeField()
    state = FSMField(default=CertificationState.PENDING_APPROVAL, choices=CertificationState.choices,
                     protected=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    certified_at = models.DateTimeField(null=True, blank=True)
    refused_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True,
                                   blank=True)
    refusal_reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.CheckConstraint(condition=Q(valid_until__gt=models.F("verified_at")),
                                              name="delivery_certification_window"),
                       models.CheckConstraint(
                           condition=(Q(state=CertificationState.REFUSED, refused_by__isnull=False)
                                      & ~Q(refusal_reason=""))
                           | (~Q(state=CertificationState.REFUSED) & Q(refused_by__isnull=True, refusal_reason="")),
                           name="delivery_certification_refusal_has_who_and_why")]

    @transition(field=state, source=CertificationState.PENDING_APPROVAL, target=CertificationState.CERTIFIED)
    def certify(self, *, at) -> None:
        self.certified_at = at

    @transition(field=state, source=[CertificationState.PENDING_APPROVAL, CertificationState.CERTIFIED],
                target=CertificationState.EXPIRED)
    def expire(self) -> None:
        pass

    @transition(field=state, source=CertificationState.PENDING_APPROVAL, target=CertificationState.REFUSED)
    def refuse(self, *, by, reason: str) -> None:
        self.refused_by, self.refusal_reason = by, reason


class CertificationApproval(models.Model):
    """One approver's approval of a platform-attested certification. Append-only; one per (certification,
    approver), so two rows are two distinct people."""

    certification = models.ForeignKey(ReceiverCertification, on_delete=models.PROTECT, related_name="approvals")
    approver = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    digest_seen = models.BinaryField(max_length=32)  # the subject digest the approver was shown
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["certification", "approver"],
                                               name="delivery_approval_distinct_approver")]
