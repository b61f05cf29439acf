"""Dual approval of cutover subjects in the browser: request approval of a subject's current digest, and give one
of the two approvals. The rules live in connector.services.approvals; these views only call it. The form carries
the digest the page showed, so an approval of a subject that changed meanwhile is refused, never counted."""
from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.selectors.rows import DualApprovalRequest
from connector.services import approvals

from .forms import ApprovalRequestForm, DigestApprovalForm, parse
from .access import screen

GIVE = approvals.PERMISSION


@screen
@require_POST
def request_approval(request):
    """Open the live request for a subject's current digest (voiding a live request of another digest)."""
    if not request.user.has_perm(GIVE):
        raise PermissionDenied(f"requesting dual approval needs {GIVE}")
    form = parse(request, ApprovalRequestForm)
    kind, key = form["kind"], form["subject_key"]
    try:
        row = approvals.approval_request(kind=kind, subject_key=key, actor=Actor.for_user(request.user))
    except ConnectorError as error:
        messages.error(request, f"{error.code}: {error.detail}")
        return redirect("governance:attestations")
    messages.success(request, f"Dual approval requested for {row.kind} {row.subject_key}.")
    return redirect("governance:approval", pk=row.pk)


@screen
@require_http_methods(["GET", "POST"])
def approval(request, pk: int):
    row = get_object_or_404(DualApprovalRequest.objects.select_related("requested_by"), pk=pk)
    may_give = request.user.has_perm(GIVE)
    if request.method == "POST":
        if not may_give:
            raise PermissionDenied(f"approving needs {GIVE}")
        seen = parse(request, DigestApprovalForm)["digest"]
        try:
            row = approvals.approval_give(request_pk=pk, digest_seen=seen, actor=Actor.for_user(request.user))
        except ConnectorError as error:
            messages.error(request, f"{error.code}: {error.detail}")
            return redirect("governance:approval", pk=pk)
        messages.success(request, f"Approval recorded; the request is {row.state}.")
        return redirect("governance:approval", pk=pk)
    try:
        current, summary = approvals.subject_current(row.kind, row.subject_key)
    except ConnectorError as error:
        current, summary = b"", f"the subject cannot be read: {error.detail}"
    stored = bytes(row.subject_digest)
    given = list(row.approvals.select_related("approver").order_by("pk"))
    already = any(a.approver_id == request.user.pk for a in given)
    is_requester = row.requested_by_id == request.user.pk
    return render(request, "governance/approval.html", {
        "row": row, "digest": stored.hex(), "current_summary": summary, "changed": current != stored,
        "approvals": given, "already": already, "is_requester": is_requester,
        "may_give": may_give and row.state == "pending" and not already and not is_requester and current == stored,
        "nav": "attestations"})
