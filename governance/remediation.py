"""The remediation screens (issue 16): resolve a RemoteLink conflict on the effect page, resume a halted ordering
lane, and replay a quarantined execution. Each POST calls one service, which checks the permission and the state
token the page showed (the effect's or execution's last change, the lane's fence) and refuses a stale page with an
explanation; nothing is applied to a state the operator did not see. A user without the permission sees no form
and a forged POST is answered 403."""
from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_http_methods, require_POST

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.selectors.rows import (
    DualApprovalRequest,
    Execution,
    GapDecision,
    LaneResumption,
    OrderingLane,
    Projection,
    ReplayRequest,
)
from connector.selectors.lanes import (
    execution_remedy,
    halting_execution,
    lane_halt_fact,
    pending_positions,
    replay_outlook,
)
from connector.selectors.replay import remediation_request_id, replay_dispositions
from connector.services import execution as execution_services
from connector.services import lanes, replay
from effects.selectors import RemoteEffect
from effects.services import identity, intents

from .reasons import reason
from .access import _audit, screen


def _shown(request):
    """The change time the page showed (its state token); None if absent or malformed (the service refuses)."""
    try:
        return parse_datetime(request.POST.get("changed_at", ""))
    except ValueError:
        return None


def _evidence(request) -> str:
    text, reference = request.POST.get("reason", "").strip(), request.POST.get("evidence_ref", "").strip()
    return f"{text} [evidence: {reference}]" if text and reference else ""


# -- a RemoteLink conflict ------------------------------------------------------------------------------------------

def link_context(effect: RemoteEffect, user) -> dict:
    """What the effect page shows about a RemoteLink conflict: the slot, its link, the links in the way, the live
    dual-approval request of the relink and whether it is approved for the current subject."""
    if effect.state != "remote_confirmed" or effect.quarantine_reason != identity.CONFLICT:
        return {"conflict": None}
    slot = identity.effect_slot(effect)
    digest, summary = identity.relink_subject(identity.relink_subject_key(effect.pk))
    approval = (DualApprovalRequest.objects.filter(kind=identity.APPROVAL_KIND,
                                                   subject_key=identity.relink_subject_key(effect.pk),
                                                   state__in=("pending", "approved")).first())
    refused = None if approval else (DualApprovalRequest.objects.select_related("refused_by").filter(
        kind=identity.APPROVAL_KIND, subject_key=identity.relink_subject_key(effect.pk), state="refused")
        .order_by("-pk").first())
    return {"conflict": {
        "refused": refused, "slot": slot, "link": identity.active_link(account_id=effect.account_id, owner_slot=slot),
        "addressed": effect.command.target_link, "in_the_way": identity.conflicting_links(effect, slot),
        "summary": summary, "approval": approval,
        "approved": approval is not None and approval.state == "approved" and bytes(approval.subject_digest) == digest,
        "may_resolve": user.has_perm(identity.PERMISSION)}}


@screen
@require_POST
def effect_link(request, pk: int):
    """One resolution of a conflict: `keep_link`, `relink_request` (asks two approvers) or `relink_apply`."""
    get_object_or_404(RemoteEffect, pk=pk)
    if not request.user.has_perm(identity.PERMISSION):
        raise PermissionDenied(f"resolving a RemoteLink conflict needs {identity.PERMISSION}")
    action, evidence = request.POST.get("action", ""), _evidence(request)
    calls = {"keep_link": identity.effect_link_keep, "relink_request": identity.effect_relink_request,
             "relink_apply": identity.effect_relink_apply}
    if action not in calls:
        messages.error(request, "Refused: choose keep_link, relink_request or relink_apply.")
        return redirect("governance:effect", pk=pk)
    if not evidence:
        messages.error(request, "A resolution needs a reason and an evidence reference.")
        return redirect("governance:effect", pk=pk)
    why = ({"reason": request.POST.get("reason", ""), "evidence_ref": request.POST.get("evidence_ref", "")}
           if action == "relink_request" else {"evidence": evidence})  # the approvers read reason and evidence apart
    try:
        result = calls[action](effect_pk=pk, **why, actor=Actor.for_user(request.user),
                               expected_changed_at=_shown(request))
    except ConnectorError as error:
        messages.error(request, f"{error.code}: {error.detail}")
        return redirect("governance:effect", pk=pk)
    if action == "relink_request":
        messages.success(request, f"Dual approval requested (request #{result.pk}): two approvers other than you "
                                  "approve it on the attestations screen, then apply the relink here.")
        return redirect("governance:effect", pk=pk)
    done = {"keep_link": "the link was kept", "relink_apply": "the slot was relinked"}[action]
    messages.success(request, f"Effect #{pk}: {done} with your evidence; the effect is {result.state}.")
    return redirect("governance:queue")


# -- an intentional new remote call (D-305) ------------------------------------------------------------------------

def remote_call_context(effect: RemoteEffect, user) -> dict:
    """The effect page's offer of an intentional new remote call: only on a proven terminal `no_effect` effect
    (the one state from which the admission can mint a successor); the admission itself decides."""
    if effect.state != "no_effect":
        return {"remote_call": None}
    return {"remote_call": {"may_authorize": user.has_perm(intents.PERMISSION)}}


@screen
@require_POST
def effect_remote_call(request, pk: int):
    """Authorize an intentional new remote call for the effect's root and slot, with a reason and the page's
    state token (`intents.remote_call_for_effect`)."""
    get_object_or_404(RemoteEffect, pk=pk)
    if not request.user.has_perm(intents.PERMISSION):
        raise PermissionDenied(f"authorizing a new remote call needs {intents.PERMISSION}")
    try:
        intent = intents.remote_call_for_effect(effect_pk=pk, reason=request.POST.get("reason", "").strip(),
                                                actor=Actor.for_user(request.user),
                                                expected_changed_at=_shown(request))
    except ConnectorError as error:
        messages.error(request, f"{error.code}: {error.detail}")
        return redirect("governance:effect", pk=pk)
    if intent.disposition == "resumed":
        messages.success(request, f"Intent {intent.intent_id}: effect #{intent.resumed_effect_id} is still open and "
                                  "resumes; no new effect was authored.")
    else:
        messages.success(request, f"Intent {intent.intent_id}: successor generation "
                                  f"{intent.successor_command.effect_generation_id} authorized; it is sent like any "
                                  "outbound effect.")
    return redirect("governance:queue")


# -- a halted lane --------------------------------------------------------------------------------------------------

@screen
@require_http_methods(["GET", "POST"])
def lane(request, pk: int):
    lane_ = get_object_or_404(OrderingLane.objects.select_related("account", "epoch"), pk=pk)
    may_resume = request.user.has_perm(lanes.PERMISSION)
    if request.method == "POST":
        if not may_resume:
            raise PermissionDenied(f"resuming a lane needs {lanes.PERMISSION}")
        mode, evidence = request.POST.get("mode", ""), _evidence(request)
        try:
            fence = int(request.POST.get("fence", ""))
        except ValueError:
            fence = -1
        if not evidence:
            messages.error(request, "A resume needs a reason and an evidence reference.")
            return redirect("governance:lane", pk=pk)
        try:
            lanes.lane_resume(lane_pk=pk, mode=mode, evidence=evidence, actor=Actor.for_user(request.user),
                              expected_fence=fence)
        except ConnectorError as error:
            messages.error(request, f"{error.code}: {error.detail}")
            return redirect("governance:lane", pk=pk)
        try:  # take the first step now; the sweeper would take it a few seconds later anyway
            execution_services.lane_advance(lane_pk=pk)
        except ConnectorError:
            pass
        messages.success(request, f"Lane #{pk} resumed ({mode}) under a new fence; its events apply in order.")
        return redirect("governance:lane", pk=pk)
    halting = halting_execution(lane_)
    fact = lane_halt_fact(lane_)
    return render(request, "governance/lane.html", {
        "lane": lane_, "reason": reason(lane_.halt_reason) if lane_.halt_reason else None, "fact": fact,
        "halting": halting, "outlook": replay_outlook(halting) if halting else None,
        "pending": pending_positions(lane_),
        "projections": list(Projection.objects.filter(lane=lane_).select_related("event").order_by("-pk")[:20]),
        "gaps": list(GapDecision.objects.filter(lane=lane_).order_by("-pk")[:10]),
        "resumptions": list(LaneResumption.objects.filter(lane=lane_).order_by("-pk")[:10]),
        "modes": (("missing_arrived", "skip_with_evidence") if lane_.halt_reason == lanes.GAP_DEADLINE else
                  ("skip_with_evidence",) if halting is not None else ()),
        "may_resume": may_resume and lane_.state == "halted", "audit": _audit(lane_), "nav": "board"})


# -- a quarantined execution ----------------------------------------------------------------------------------------

def execution_context(execution: Execution, user) -> dict:
    """The replay outlook (whether a replay runs now, and why) and the replay already made of it, if any."""
    made = (ReplayRequest.objects.select_related("receipt", "target_epoch")
            .filter(account_id=execution.account_id, request_id=remediation_request_id(execution.pk)).first())
    return {"outlook": replay_outlook(execution), "replay": made, "remedied": execution_remedy(execution),
            "replay_events": replay_dispositions(made) if made else [],
            "may_replay": (user.has_perm(replay.REMEDIATION_PERMISSION) and execution.state == "quarantined"
                           and made is None)}


@screen
@require_POST
def execution_replay(request, pk: int):
    get_object_or_404(Execution, pk=pk)
    if not request.user.has_perm(replay.REMEDIATION_PERMISSION):
        raise PermissionDenied(f"replaying needs {replay.REMEDIATION_PERMISSION}")
    evidence = _evidence(request)
    if not evidence:
        messages.error(request, "A replay needs a reason and an evidence reference.")
        return redirect("governance:execution", pk=pk)
    try:
        admission = replay.execution_replay(execution_pk=pk, reason=evidence, actor=Actor.for_user(request.user),
                                            expected_changed_at=_shown(request))
    except ConnectorError as error:
        messages.error(request, f"{error.code}: {error.detail}")
        return redirect("governance:execution", pk=pk)
    for entry in replay_dispositions(admission.request):
        messages.success(request, f"Replay {admission.request.request_id} ({admission.outcome}): "
                                  f"{entry['disposition']} — {entry['detail']}.")
    return redirect("governance:execution", pk=pk)
