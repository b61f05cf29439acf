"""Every page a path to the fact (issue 38 item 2, D-471): the chain Receipt -> Event -> Projection -> Execution ->
ApplicationResult -> OutboundCommand -> RemoteEffect -> RemoteLink, linked both ways. The receipt page lists its
events; an event's page its receipt, projection, lane and executions; an execution's page its projection, event,
receipt, result and the effects it authored; an effect's page its execution and its RemoteLinks; a RemoteLink's
page the effect that made it and the effects that addressed it.

The execution and effect pages are rendered here for their views and for the remediation views that refuse a
form on them: a refusal renders the page again with what was typed (governance.kept, issue 38 item 3)."""
from __future__ import annotations

from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from connector.selectors import browse
from connector.selectors.rows import Event, Execution
from effects.selectors import RemoteEffect, RemoteLink, effect_links, effects_of_execution, link_get
from effects.services.dispatch import RECONCILE_DECISIONS
from effects.services.recovery import effect_recovery_outlook
from effects.services.retry import schedule_view

from .access import audit_trail, screen
from .kept import Kept, kept_context
from .reasons import REASONS, reason
from .offers import execution_context, link_context, remote_call_context

EFFECT_FIELDS = {"decide": {"decision": "decision", "remote_id": "remote_id", "reason": "reason",
                            "evidence_ref": "evidence_ref", "changed_at": "decide-title"},
                 "remote_call": {"reason": "remote-call-reason", "changed_at": "remote-call-title"},
                 "keep_link": {"reason": "keep-reason", "evidence_ref": "keep-evidence", "action": "keep-title",
                               "changed_at": "keep-title"},
                 "relink": {"reason": "relink-reason", "evidence_ref": "relink-evidence", "action": "relink-title",
                            "changed_at": "relink-title"}}
REPLAY_FIELDS = {"reason": "reason", "evidence_ref": "evidence_ref", "changed_at": "replay-title"}


def effect_upstream(effect_: RemoteEffect) -> dict:
    """The execution that authored the effect's command and that execution's receipt (None for an effect
    authored without one, e.g. an intentional new remote call's successor)."""
    execution_pk = effect_.command.source_execution_id
    if execution_pk is None:
        return {"source_execution": None, "source_receipt": None}
    execution_ = Execution.objects.only("pk", "projection_id", "command_id", "state").get(pk=execution_pk)
    return {"source_execution": execution_, "source_receipt": browse.execution_chain(execution_)["receipt_id"]}


def effect_page(request, effect_: RemoteEffect, kept: Kept | None = None):
    """The effect page; with `kept`, the refused form as it was typed."""
    may_decide = request.user.has_perm("effects.reconcile_effect")
    permits = list(effect_.permits.order_by("pk")) if hasattr(effect_, "permits") else []
    return render(request, "governance/effect.html", {
        "recovery": effect_recovery_outlook(effect_) if effect_.state == "uncertain" else None, "effect": effect_, "attempts": list(effect_.attempts.order_by("ordinal")), "permits": permits,
        "audit": audit_trail(effect_), "nav": "effects",
        "decisions": RECONCILE_DECISIONS if effect_.state == "uncertain" else (), "may_decide": may_decide,
        "command": effect_.command, "retry": schedule_view(effect_, timezone.now()),
        "reason": reason(effect_.quarantine_reason) if effect_.quarantine_reason else None,
        "links": effect_links(effect_pk=effect_.pk), **effect_upstream(effect_),
        **link_context(effect_, request.user), **remote_call_context(effect_, request.user), **kept_context(kept)},
        status=kept.status if kept else 200)


def execution_page(request, execution_: Execution, kept: Kept | None = None):
    """The execution page: evidence and remediation, its chain both ways; with `kept`, the refused replay form."""
    chain = browse.execution_chain(execution_)
    return render(request, "governance/execution.html", {
        "execution": execution_, "result": chain["result"], "chain": chain,
        "reason": REASONS.get(execution_.quarantine_reason),
        "attempts": list(execution_.attempts.order_by("pk")) if hasattr(execution_, "attempts") else [],
        "commands": effects_of_execution(execution_pk=execution_.pk), "audit": audit_trail(execution_),
        "nav": "executions", **execution_context(execution_, request.user), **kept_context(kept)},
        status=kept.status if kept else 200)


@screen
def event(request, pk: int):
    """One event: its receipt (upstream), its projection, lane and executions (downstream)."""
    try:
        event_ = browse.event_get(pk)
    except Event.DoesNotExist:
        raise Http404(f"no event #{pk}") from None
    return render(request, "governance/event.html", {"event": event_, **browse.event_chain(event_),
                                                     "nav": "receipts"})


@screen
def link(request, pk: int):
    """One RemoteLink: the effect that made it, and the effects whose updates addressed its remote identity."""
    try:
        link_, addressed = link_get(link_pk=pk)
    except RemoteLink.DoesNotExist:
        raise Http404(f"no RemoteLink #{pk}") from None
    return render(request, "governance/link.html", {"link": link_, "addressed": addressed, "nav": "effects"})


def execution_or_404(pk: int) -> Execution:
    return get_object_or_404(Execution.objects.select_related("projection", "account", "lane"), pk=pk)
