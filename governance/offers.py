"""What the remediation forms offer on the effect and execution pages (issue 16): a RemoteLink conflict with its
dual-approval request, an intentional new remote call, a replay with its outlook. Read-only; the POSTs are
governance.remediation's. Its own module so the pages (governance.chain) and the views that refuse a form on them
(governance.remediation) both use it without importing each other."""
from __future__ import annotations

from connector.selectors.lanes import execution_remedy, replay_outlook
from connector.selectors.replay import remediation_request_id, replay_dispositions
from connector.selectors.rows import DualApprovalRequest, Execution, ReplayRequest
from connector.services import replay
from effects.selectors import RemoteEffect
from effects.services import identity, intents


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
    in_sets = list(DualApprovalRequest.objects.filter(kind=identity.SET_KIND, state__in=("pending", "approved"),
                                                      members__member_key=identity.relink_subject_key(effect.pk))
                   .order_by("pk"))
    return {"conflict": {
        "refused": refused, "in_sets": in_sets, "slot": slot, "link": identity.active_link(account_id=effect.account_id, owner_slot=slot),
        "addressed": effect.command.target_link, "in_the_way": identity.conflicting_links(effect, slot),
        "summary": summary, "approval": approval,
        "approved": approval is not None and approval.state == "approved" and bytes(approval.subject_digest) == digest,
        "may_resolve": user.has_perm(identity.PERMISSION)}}


def remote_call_context(effect: RemoteEffect, user) -> dict:
    """The effect page's offer of an intentional new remote call: only on a proven terminal `no_effect` effect
    (the one state from which the admission can mint a successor); the admission itself decides."""
    if effect.state != "no_effect":
        return {"remote_call": None}
    return {"remote_call": {"may_authorize": user.has_perm(intents.PERMISSION)}}


def execution_context(execution: Execution, user) -> dict:
    """The replay outlook (whether a replay runs now, and why) and the replay already made of it, if any."""
    made = (ReplayRequest.objects.select_related("receipt", "target_epoch")
            .filter(account_id=execution.account_id, request_id=remediation_request_id(execution.pk)).first())
    return {"outlook": replay_outlook(execution), "replay": made, "remedied": execution_remedy(execution),
            "replay_events": replay_dispositions(made) if made else [],
            "may_replay": (user.has_perm(replay.REMEDIATION_PERMISSION) and execution.state == "quarantined"
                           and made is None)}
