"""Dual approval of a subject: a readiness certificate, a restore point, an activation decision or a remote
identity change (relinking an owner slot to another remote identity) needs two distinct people, neither the
requester, each approving the exact subject digest they were shown.

Invariants: at most one live (pending or approved) request per (kind, subject key); a request for a changed
subject (another digest) voids the live one and every approval it had; an approval is append-only, one per
(request, approver), never by the requester (a CHECK on the copied requester column). A request carries its
requester's reason and evidence reference; an approver may refuse a pending request with a reason, which ends it
(`refused`, terminal, D-460).

A set subject (D-494) is one request for many members of another kind (many relinks): its membership is stored
with the request (`DualApprovalSetMember`, append-only), each member with the digest the requester saw, and the
request's digest is the digest over those (member key, digest) pairs, so approving binds exactly that set.
"""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Length
from django.db.models.lookups import Exact
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

__all__ = ["ApprovalKind", "ApprovalState", "APPROVAL_TRANSITIONS", "DualApprovalRequest", "DualApproval",
           "DualApprovalSetMember"]


class ApprovalKind(models.TextChoices):
    """The closed set of subjects that need two approvers (issue: dual-approval attestations)."""

    READINESS_CERTIFICATE = "readiness_certificate", "readiness certificate"
    RESTORE_POINT = "restore_point", "restore point"
    ACTIVATION_DECISION = "activation_decision", "activation decision"
    REMOTE_IDENTITY_CHANGE = "remote_identity_change", "remote identity change"  # relinking an owner slot (D-191)
    # many relinks under one request: a set subject with stored membership (D-494)
    REMOTE_IDENTITY_CHANGE_SET = "remote_identity_change_set", "set of remote identity changes"


class ApprovalState(models.TextChoices):
    PENDING = "pending"  # initial: waiting for two distinct approvers
    APPROVED = "approved"  # pending -> approved: the second distinct approver approved the current digest
    VOIDED = "voided"  # pending|approved -> voided: the subject changed (a new request) or was withdrawn; terminal
    REFUSED = "refused"  # pending -> refused: an approver refused it, with a reason (D-460); terminal


APPROVAL_TRANSITIONS = (
    (ApprovalState.PENDING, ApprovalState.APPROVED),
    (ApprovalState.PENDING, ApprovalState.VOIDED),
    (ApprovalState.APPROVED, ApprovalState.VOIDED),
    (ApprovalState.PENDING, ApprovalState.REFUSED),
)
APPROVAL_LIVE = (ApprovalState.PENDING, ApprovalState.APPROVED)


class DualApprovalRequest(ConcurrentTransitionMixin, models.Model):
    kind = models.CharField(max_length=32, choices=ApprovalKind.choices)
    subject_key = models.CharField(max_length=255)
    subject_digest = models.BinaryField(max_length=32)
    summary = models.TextField()
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    state = FSMField(default=ApprovalState.PENDING, choices=ApprovalState.choices, protected=True)
    void_reason = models.TextField(blank=True, default="")
    reason = models.TextField(blank=True, default="")  # the requester's why (required by approval_request, D-461)
    evidence_ref = models.CharField(max_length=500, blank=True, default="")  # the requester's evidence reference
    refused_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True,
                                   blank=True)
    refusal_reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "subject_key"], condition=Q(state__in=APPROVAL_LIVE),
                                    name="connector_dualapproval_one_live_request"),
            models.CheckConstraint(condition=Q(kind__in=ApprovalKind.values), name="connector_dualapproval_kind"),
            models.CheckConstraint(condition=Q(state__in=ApprovalState.values), name="connector_dualapproval_state"),
            models.CheckConstraint(condition=Exact(Length("subject_digest"), 32),
                                   name="connector_dualapproval_digest_length"),
            models.CheckConstraint(condition=Q(state=ApprovalState.VOIDED) | Q(void_reason=""),
                                   name="connector_dualapproval_reason_only_when_voided"),
            models.CheckConstraint(condition=(Q(state=ApprovalState.REFUSED, refused_by__isnull=False)
                                              & ~Q(refusal_reason=""))
                                   | (~Q(state=ApprovalState.REFUSED) & Q(refused_by__isnull=True, refusal_reason="")),
                                   name="connector_dualapproval_refusal_has_who_and_why"),
        ]
        permissions = [("give_dual_approval", "Can give one of the two approvals of a cutover subject")]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject_key} ({self.state})"

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.APPROVED)
    def approve(self) -> None:
        pass

    @transition(field=state, source=[ApprovalState.PENDING, ApprovalState.APPROVED], target=ApprovalState.VOIDED)
    def void(self, *, reason: str) -> None:
        self.void_reason = reason

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.REFUSED)
    def refuse(self, *, by, reason: str) -> None:
        self.refused_by, self.refusal_reason = by, reason


class DualApproval(models.Model):
    """One person's approval of the digest they saw. Append-only."""

    request = models.ForeignKey(DualApprovalRequest, on_delete=models.PROTECT, related_name="approvals")
    approver = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    requester = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    digest_seen = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["request", "approver"], name="connector_dualapproval_once_per_person"),
            models.CheckConstraint(condition=~Q(approver=F("requester")),
                                   name="connector_dualapproval_not_the_requester"),
        ]


class DualApprovalSetMember(models.Model):
    """One member of a set subject (D-494): the member's own subject key (of the set kind's member kind, e.g.
    `effect:12` of a relink) and the digest of that member the requester saw, in the order the set lists them.
    Written with its request by `approval_request`, never changed (append-only in PostgreSQL). The guarded step
    applies a member only while its current digest is still this one."""

    request = models.ForeignKey(DualApprovalRequest, on_delete=models.PROTECT, related_name="members")
    ordinal = models.PositiveIntegerField()
    member_key = models.CharField(max_length=255)
    member_digest = models.BinaryField(max_length=32)
    summary = models.TextField()

    class Meta:
        ordering = ["request", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["request", "member_key"], name="connector_dualapprovalset_member_once"),
            models.UniqueConstraint(fields=["request", "ordinal"], name="connector_dualapprovalset_ordinal_once"),
            models.CheckConstraint(condition=Exact(Length("member_digest"), 32),
                                   name="connector_dualapprovalset_digest_length"),
        ]

    def __str__(self) -> str:
        return f"{self.member_key} of request #{self.request_id}"
