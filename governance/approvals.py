"""Dual approval in the browser: request approval of a subject's current digest (with the requester's reason and
evidence reference), and decide a request: give one of the two approvals, or refuse it with a reason. The rules
live in connector.services.approvals; these views only call it. The forms carry the digest the page showed, so an
approval of a subject that changed meanwhile is refused, never counted.

The page shows what is approved (the subject in words with a link to its own page, the change as before/after,
the requester's reason and evidence), and reads as finished once the guarded step ran (`subject_outcome`).

A set of relinks (D-494) shows its members, each with its effect, before/after and the digest approved; once
approved, its page applies the set (`action=apply`: each member by the relink service under this approval,
`governance.bulk.apply_relink_set`) and lists what became of each member."""
from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.selectors.rows import ApprovalKind, DualApprovalRequest
from connector.services import approvals
from effects.services import identity

from .access import screen
from .approval_context import approval_context
from .kept import Kept, kept_context
from .forms import ApprovalRefusalForm, ApprovalRequestForm, DigestApprovalForm, parse
from . import bulk
from .console import cutover_page

GIVE = approvals.PERMISSION


@screen
@require_POST
def request_approval(request):
    """Open the live request for a subject's current digest (voiding a live request of another digest). A refused
    request from the cutover console comes back to the console with the error beside its form and the typing
    kept."""
    if not request.user.has_perm(GIVE):
        raise PermissionDenied(f"requesting dual approval needs {GIVE}")
    form = parse(request, ApprovalRequestForm)
    kind, key = form["kind"], form["subject_key"]
    try:
        row = approvals.approval_request(kind=kind, subject_key=key, actor=Actor.for_user(request.user),
                                         reason=form["reason"], evidence_ref=form["evidence_ref"])
    except ConnectorError as error:
        if kind == ApprovalKind.ACTIVATION_DECISION:
            return cutover_page(request, status=error.http_status, refused={
                "subject_key": key, "reason": form["reason"], "evidence_ref": form["evidence_ref"],
                "error": f"{error.code}: {error.detail}"})
        messages.error(request, f"{error.code}: {error.detail}")
        return redirect("governance:attestations")
    messages.success(request, f"Dual approval requested for {row.get_kind_display()} {row.subject_key}: two "
                              "approvers other than you approve or refuse it here.")
    return redirect("governance:approval", pk=row.pk)


SET_FIELDS = {"reason": "apply-reason", "evidence_ref": "apply-evidence", "item": "apply-title"}


def _apply_set(request, pk: int):
    """Apply an approved set of relinks: each member with the change time the page showed, one by one (D-494)."""
    row = get_object_or_404(DualApprovalRequest.objects.select_related("requested_by", "refused_by"), pk=pk)
    if row.kind != ApprovalKind.REMOTE_IDENTITY_CHANGE_SET:
        raise PermissionDenied("only a set of relinks is applied here")
    if not request.user.has_perm(identity.PERMISSION):
        raise PermissionDenied(f"applying relinks needs {identity.PERMISSION}")
    kept = Kept.of(request, "apply", SET_FIELDS)
    items = bulk.parse_items(request.POST.getlist("item"))
    if not items:
        kept.add("item", "FORM_INVALID: the page lists no member to apply; reload it.")
    kept.require(reason="the reason for applying these relinks", evidence_ref="an evidence reference")
    if kept.errors:
        return _page(request, row, kept=kept, status=400)
    outcomes = bulk.apply_relink_set(approval_pk=pk, items=items, actor=Actor.for_user(request.user),
                                     reason=request.POST["reason"].strip(),
                                     evidence_ref=request.POST["evidence_ref"].strip())
    return _page(request, row, outcomes=outcomes)


def _decide(request, pk: int):
    """One decision on the request: `action=refuse` (with a reason) or an approval."""
    actor = Actor.for_user(request.user)
    if request.POST.get("action") == "refuse":
        form = parse(request, ApprovalRefusalForm)
        try:
            row = approvals.approval_refuse(request_pk=pk, digest_seen=form["digest"], reason=form["reason"],
                                            actor=actor)
        except ConnectorError as error:
            row = get_object_or_404(DualApprovalRequest.objects.select_related("requested_by"), pk=pk)
            return _page(request, row, status=error.http_status, refusal={
                "error": f"{error.code}: {error.detail}", "reason": form["reason"]})
        messages.success(request, f"Refused: request #{row.pk} is ended and can no longer be approved.")
        return redirect("governance:approval", pk=pk)
    seen = parse(request, DigestApprovalForm)["digest"]
    try:
        row = approvals.approval_give(request_pk=pk, digest_seen=seen, actor=actor)
    except ConnectorError as error:
        messages.error(request, f"{error.code}: {error.detail}")
        return redirect("governance:approval", pk=pk)
    messages.success(request, f"Approval recorded; the request is {row.state}.")
    return redirect("governance:approval", pk=pk)


def _page(request, row: DualApprovalRequest, *, refusal: dict | None = None, status: int = 200, kept=None,
          outcomes=None):
    may_give = request.user.has_perm(GIVE)
    try:
        current, summary = approvals.subject_current(row.kind, row.subject_key)
    except ConnectorError as error:
        current, summary = b"", f"the subject cannot be read: {error.detail}"
    stored = bytes(row.subject_digest)
    given = list(row.approvals.select_related("approver").order_by("pk"))
    already = any(a.approver_id == request.user.pk for a in given)
    is_requester = row.requested_by_id == request.user.pk
    outcome = approvals.subject_outcome(row)
    pending = row.state == "pending"
    context = approval_context(row)
    is_set = row.kind == ApprovalKind.REMOTE_IDENTITY_CHANGE_SET
    done = [o for o in outcomes or [] if o.done]
    return render(request, "governance/approval.html", {
        "row": row, "digest": stored.hex(), "current_summary": summary,
        # an approved set changes as its members are applied: each member says whether it still holds
        "changed": current != stored and not (is_set and row.state == "approved"),
        "outcome": outcome, "context": context, "approvals": given, "already": already,
        "is_requester": is_requester, "refusal": refusal or {}, "is_set": is_set,
        "may_apply": (is_set and row.state == "approved" and outcome is None
                      and request.user.has_perm(identity.PERMISSION)
                      and any(m.status == "waiting" for m in context.members)),
        "outcomes": [(o, f"Effect #{o.pk}", reverse("governance:effect", args=[o.pk])) for o in outcomes or []],
        "done": len(done), "refused": len(outcomes or []) - len(done), **kept_context(kept),
        "may_give": may_give and pending and not already and not is_requester and current == stored,
        "may_refuse": may_give and pending and not is_requester, "nav": "attestations"}, status=status)


@screen
@require_http_methods(["GET", "POST"])
def approval(request, pk: int):
    row = get_object_or_404(DualApprovalRequest.objects.select_related("requested_by", "refused_by"), pk=pk)
    if request.method == "POST":
        if request.POST.get("action") == "apply":  # an operator's step, not an approver's (D-494)
            return _apply_set(request, pk)
        if not request.user.has_perm(GIVE):
            raise PermissionDenied(f"deciding a dual approval needs {GIVE}")
        return _decide(request, pk)
    return _page(request, row)
