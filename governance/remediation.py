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
from connector.selectors.browse import lane_executions
from connector.selectors.rows import (
    GapDecision,
    LaneResumption,
    OrderingLane,
    Projection,
)
from connector.selectors.lanes import (
    halting_execution,
    lane_halt_fact,
    pending_positions,
    replay_outlook,
)
from connector.selectors.replay import replay_dispositions
from connector.services import execution as execution_services
from connector.services import lanes, replay
from effects.selectors import RemoteEffect
from effects.services import identity, intents

from .access import audit_trail, screen
from .chain import EFFECT_FIELDS, REPLAY_FIELDS, effect_page, execution_or_404, execution_page
from .kept import Kept, kept_context
from .reasons import reason


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

@screen
@require_POST
def effect_link(request, pk: int):
    """One resolution of a conflict: `keep_link`, `relink_request` (asks two approvers) or `relink_apply`.
    A refusal renders the effect page again with the form as it was typed (issue 38 item 3)."""
    effect_ = get_object_or_404(RemoteEffect.objects.select_related("command", "account"), pk=pk)
    if not request.user.has_perm(identity.PERMISSION):
        raise PermissionDenied(f"resolving a RemoteLink conflict needs {identity.PERMISSION}")
    action, evidence = request.POST.get("action", ""), _evidence(request)
    calls = {"keep_link": identity.effect_link_keep, "relink_request": identity.effect_relink_request,
             "relink_apply": identity.effect_relink_apply}
    form = "keep_link" if action == "keep_link" else "relink"
    kept = Kept.of(request, form, EFFECT_FIELDS[form])
    if action not in calls:
        kept.add("action", "Refused: choose keep_link, relink_request or relink_apply.")
        return effect_page(request, effect_, kept)
    if not kept.require(reason="the reason for this resolution", evidence_ref="an evidence reference"):
        return effect_page(request, effect_, kept)
    why = ({"reason": request.POST.get("reason", ""), "evidence_ref": request.POST.get("evidence_ref", "")}
           if action == "relink_request" else {"evidence": evidence})  # the approvers read reason and evidence apart
    try:
        result = calls[action](effect_pk=pk, **why, actor=Actor.for_user(request.user),
                               expected_changed_at=_shown(request))
    except ConnectorError as error:
        return effect_page(request, effect_, kept.refused("action", error))
    if action == "relink_request":
        messages.success(request, f"Dual approval requested (request #{result.pk}): two approvers other than you "
                                  "approve it on the attestations screen, then apply the relink here.")
        return redirect("governance:effect", pk=pk)
    done = {"keep_link": "the link was kept", "relink_apply": "the slot was relinked"}[action]
    messages.success(request, f"Effect #{pk}: {done} with your evidence; the effect is {result.state}.")
    return redirect("governance:queue")


# -- an intentional new remote call (D-305) ------------------------------------------------------------------------

@screen
@require_POST
def effect_remote_call(request, pk: int):
    """Authorize an intentional new remote call for the effect's root and slot, with a reason and the page's
    state token (`intents.remote_call_for_effect`). A refusal renders the page again as typed."""
    effect_ = get_object_or_404(RemoteEffect.objects.select_related("command", "account"), pk=pk)
    if not request.user.has_perm(intents.PERMISSION):
        raise PermissionDenied(f"authorizing a new remote call needs {intents.PERMISSION}")
    kept = Kept.of(request, "remote_call", EFFECT_FIELDS["remote_call"])
    try:
        intent = intents.remote_call_for_effect(effect_pk=pk, reason=request.POST.get("reason", "").strip(),
                                                actor=Actor.for_user(request.user),
                                                expected_changed_at=_shown(request))
    except ConnectorError as error:
        return effect_page(request, effect_, kept.refused("reason", error))
    if intent.disposition == "resumed":
        messages.success(request, f"Intent {intent.intent_id}: effect #{intent.resumed_effect_id} is still open and "
                                  "resumes; no new effect was authored.")
    else:
        messages.success(request, f"Intent {intent.intent_id}: successor generation "
                                  f"{intent.successor_command.effect_generation_id} authorized; it is sent like any "
                                  "outbound effect.")
    return redirect("governance:queue")


# -- a halted lane --------------------------------------------------------------------------------------------------

LANE_FIELDS = {"mode": "mode", "reason": "reason", "evidence_ref": "evidence_ref"}


@screen
@require_http_methods(["GET", "POST"])
def lane(request, pk: int):
    lane_ = get_object_or_404(OrderingLane.objects.select_related("account", "epoch"), pk=pk)
    may_resume = request.user.has_perm(lanes.PERMISSION)
    if request.method == "POST":
        if not may_resume:
            raise PermissionDenied(f"resuming a lane needs {lanes.PERMISSION}")
        kept = Kept.of(request, "resume", LANE_FIELDS)
        mode, evidence = request.POST.get("mode", ""), _evidence(request)
        try:
            fence = int(request.POST.get("fence", ""))
        except ValueError:
            fence = -1
        if not kept.require(reason="the reason for resuming", evidence_ref="an evidence reference"):
            return _lane_page(request, lane_, may_resume, kept)
        try:
            lanes.lane_resume(lane_pk=pk, mode=mode, evidence=evidence, actor=Actor.for_user(request.user),
                              expected_fence=fence)
        except ConnectorError as error:
            return _lane_page(request, lane_, may_resume, kept.refused("mode", error))
        try:  # take the first step now; the sweeper would take it a few seconds later anyway
            execution_services.lane_advance(lane_pk=pk)
        except ConnectorError:
            pass
        messages.success(request, f"Lane #{pk} resumed ({mode}) under a new fence; its events apply in order.")
        return redirect("governance:lane", pk=pk)
    return _lane_page(request, lane_, may_resume)


def _lane_page(request, lane_: OrderingLane, may_resume: bool, kept: Kept | None = None):
    """The lane page; with `kept`, the refused resume form as it was typed (issue 38 item 3)."""
    halting = halting_execution(lane_)
    fact = lane_halt_fact(lane_)
    return render(request, "governance/lane.html", {
        "lane": lane_, "reason": reason(lane_.halt_reason) if lane_.halt_reason else None, "fact": fact,
        "halting": halting, "outlook": replay_outlook(halting) if halting else None,
        "pending": pending_positions(lane_),
        "projections": list(Projection.objects.filter(lane=lane_).select_related("event").order_by("-pk")[:20]),
        "executions": lane_executions(lane_.pk, limit=20),
        "gaps": list(GapDecision.objects.filter(lane=lane_).order_by("-pk")[:10]),
        "resumptions": list(LaneResumption.objects.filter(lane=lane_).order_by("-pk")[:10]),
        "modes": (("missing_arrived", "skip_with_evidence") if lane_.halt_reason == lanes.GAP_DEADLINE else
                  ("skip_with_evidence",) if halting is not None else ()),
        "may_resume": may_resume and lane_.state == "halted", "audit": audit_trail(lane_), "nav": "board",
        **kept_context(kept)}, status=kept.status if kept else 200)


# -- a quarantined execution ----------------------------------------------------------------------------------------

@screen
@require_POST
def execution_replay(request, pk: int):
    execution_ = execution_or_404(pk)
    if not request.user.has_perm(replay.REMEDIATION_PERMISSION):
        raise PermissionDenied(f"replaying needs {replay.REMEDIATION_PERMISSION}")
    kept = Kept.of(request, "replay", REPLAY_FIELDS)
    if not kept.require(reason="the reason for the replay", evidence_ref="an evidence reference"):
        return execution_page(request, execution_, kept)
    try:
        admission = replay.execution_replay(execution_pk=pk, reason=_evidence(request),
                                            actor=Actor.for_user(request.user), expected_changed_at=_shown(request))
    except ConnectorError as error:
        return execution_page(request, execution_, kept.refused("reason", error))
    for entry in replay_dispositions(admission.request):
        messages.success(request, f"Replay {admission.request.request_id} ({admission.outcome}): "
                                  f"{entry['disposition']} — {entry['detail']}.")
    return redirect("governance:execution", pk=pk)
