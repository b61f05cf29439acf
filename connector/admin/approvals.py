"""Dual-approval facts: each request with its approvals inline, read-only (they change only through
connector.services.approvals and the attestation screens)."""
from __future__ import annotations

from django.contrib import admin

from connector.admin.base import FactAdmin, FactInline, badge, digest_col, state_diagram
from connector.models.approvals import APPROVAL_TRANSITIONS, DualApproval, DualApprovalRequest, DualApprovalSetMember


class DualApprovalInline(FactInline):
    model = DualApproval
    fields = ("approver", "digest", "created_at")
    digest = digest_col("digest_seen", "digest seen")


class DualApprovalSetMemberInline(FactInline):
    """The stored membership of a set request (D-494): each member and the digest the requester saw."""

    model = DualApprovalSetMember
    fields = ("ordinal", "member_key", "digest", "summary")
    digest = digest_col("member_digest", "member digest")


@admin.register(DualApprovalRequest)
class DualApprovalRequestAdmin(FactAdmin):
    fact_description = ("A request for two distinct approvals of one subject (readiness certificate, restore point, "
                        "activation decision, remote identity change, or a set of remote identity changes with its stored "
                        "members) at an exact digest, with the requester's "
                        "reason and evidence reference. Written by connector.services.approvals; a request for a "
                        "changed subject voids this one and its approvals; an approver may refuse it with a reason, "
                        "which ends it. Approve or refuse on the attestation screens, not here.")
    list_display = ("id", "kind", "subject_key", "state_badge", "requested_by", "approval_count", "created_at")
    list_filter = ("kind", "state")
    search_fields = ("subject_key", "summary")
    date_hierarchy = "created_at"
    inlines = (DualApprovalSetMemberInline, DualApprovalInline)
    fieldsets = (
        (None, {"fields": ("kind", "subject_key", "summary", "state_badge", "requested_by", "reason",
                           "evidence_ref", "void_reason", "refused_by", "refusal_reason", "created_at",
                           "changed_at")}),
        ("Digest", {"fields": ("digest_hex",)}),
        ("Transitions", {"fields": ("diagram",)}),
    )

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        return badge(obj.state)

    @admin.display(description="approvals")
    def approval_count(self, obj):
        return obj.approvals.count()

    @admin.display(description="state machine")
    def diagram(self, obj):
        return state_diagram(obj.state, APPROVAL_TRANSITIONS)

    digest_hex = digest_col("subject_digest", "subject digest")

