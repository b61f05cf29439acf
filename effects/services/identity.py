"""Remote identity: which remote identity an outbound update addresses, and the operator's way out of a RemoteLink
conflict (CV2-10-045, CV2-10-052, CV2-10-059, CV2-13-002, CV2-15-022; decisions D-190, D-191).

- An update addresses the linked identity. When Runtime authors a push for a local record (the owner slot) that
  already has an active RemoteLink, the command is built from the callout's `update` variant with that link's
  remote identity (`callout_address`). The RemoteLink is the only identity authority: pushed fields never select
  the identity, and a record without a link is created.
- A conflict still fails closed. If the provider proves another identity than the slot's link (or one already
  linked to another slot), finalization refuses, the effect stays `remote_confirmed` marked REMOTE_LINK_CONFLICT
  and waits in the approval queue. Its resolution appends authoritative evidence and never relabels anything:
  `keep_link` (the existing links stay the authority; the effect finalizes without a new link) or `relink` (the
  provider's identity really changed: the conflicting links are retired and the slot is linked to the proven
  identity), the latter only with an approved dual approval of exactly that identity change.
- Many conflicts under one approval (D-494): `effect_relink_set_request` asks two approvers for a set of relinks
  at once (one request of kind `remote_identity_change_set`, its members the effects' relink subjects with the
  digests the requester saw); `effect_relink_apply` with `approval_pk` then applies one member under that set's
  approval, only while the member's digest is still the approved one.
"""
from __future__ import annotations

import hashlib

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from connector import stage_metrics
from connector.actors import Actor
from connector.errors import PermissionRefused, TransitionRefused
from connector.selectors.rows import ApprovalKind, DualApprovalRequest
from connector.receipts import canonical_json
from connector.services import approvals
from connector.services.audit import audit_record
from effects import locks
from effects.choices import EffectState, LinkState
from effects.errors import ReconcileRefused
from effects.models import RemoteEffect, RemoteLink, RemoteLinkResolution

CONFLICT = "REMOTE_LINK_CONFLICT"
KEEP, RELINK = "keep_link", "relink"
LINK_DECISIONS = (KEEP, RELINK)
APPROVAL_KIND = ApprovalKind.REMOTE_IDENTITY_CHANGE
SET_KIND = ApprovalKind.REMOTE_IDENTITY_CHANGE_SET
PERMISSION = "effects.reconcile_effect"
SUBJECT_PROTOCOL = "nexuscrm.connector.remote-identity-change.v1"


# -- which identity a push addresses -----------------------------------------------------------------------------

def active_link(*, account_id: int, owner_slot: str) -> RemoteLink | None:
    """The slot's active RemoteLink (at most one: `effects_link_one_active_per_slot`)."""
    return RemoteLink.objects.filter(account_id=account_id, owner_slot=owner_slot, state=LinkState.ACTIVE).first()


def callout_address(callout_def: dict, path_params: dict, link: RemoteLink | None) -> tuple[dict, dict]:
    """The callout definition and path parameters a push uses: the frozen `update` variant addressed at the
    linked remote identity (`{remote_id}`) when the slot has an active link and the callout declares one, else the
    create definition unchanged. Only the link supplies `remote_id`; a pushed field of that name cannot."""
    update = callout_def.get("update")
    if link is None or not isinstance(update, dict):
        return callout_def, path_params
    return ({**callout_def, "method": update["method"], "path_template": update["path_template"]},
            {**path_params, "remote_id": link.remote_identity})


def effect_slot(effect: RemoteEffect) -> str:
    """The owner slot an effect writes: frozen on its command; commands authored before D-190 name none, and
    their slot is the last segment of the create path they were sent to."""
    command = effect.command
    return command.owner_slot or command.path.rstrip("/").rsplit("/", 1)[-1]


def conflicting_links(effect: RemoteEffect, slot: str) -> list[RemoteLink]:
    """The active links that disagree with linking `slot` to the effect's proven identity."""
    links = RemoteLink.objects.filter(Q(owner_slot=slot) | Q(remote_identity=effect.remote_id),
                                      account_id=effect.account_id, state=LinkState.ACTIVE).order_by("pk")
    return [link for link in links if (link.owner_slot, link.remote_identity) != (slot, effect.remote_id)]


# -- one push of a slot at a time (D-441) ---------------------------------------------------------------------------

OPEN_STATES = ("prepared", "dispatching", "uncertain", "remote_confirmed")  # effects_effect_slot_open's states


def slot_head_sql(effect: str) -> str:
    """The claim's condition that the effect aliased `effect` heads its owner slot: no earlier effect (smaller pk:
    authored before it) of the same account and slot is still open (prepared, dispatching, uncertain or
    remote_confirmed). The one implementation every claim path embeds (`dispatch.claim_scan`, the batched claims of
    `dispatch_batch`, the sweep's claimable count), answered from the partial index `effects_effect_slot_open`.
    An effect without a slot is never held. Terminal states never reopen, so a statement that saw the earlier
    effects terminal cannot be contradicted later: two claimers never send two pushes of one slot at once."""
    states = ", ".join(f"'{state}'" for state in OPEN_STATES)
    # No OR: an effect without a slot finds no earlier one (`<> ''`), and the account equality stays a plain join
    # to the outer effect (routable by account, docs/scale-out.md).
    return (f"NOT EXISTS (SELECT 1 FROM effects_remoteeffect earlier"
            f" WHERE earlier.account_id = {effect}.account_id AND earlier.owner_slot = {effect}.owner_slot"
            f" AND earlier.owner_slot <> '' AND earlier.id < {effect}.id AND earlier.state IN ({states}))")


def slot_heads(queryset):
    """`queryset` (of RemoteEffect, its own table unaliased) restricted to effects that head their slot."""
    return queryset.extra(where=[slot_head_sql(queryset.model._meta.db_table)])


# -- the subject two approvers see --------------------------------------------------------------------------------

def relink_subject_key(effect_pk: int) -> str:
    return f"effect:{effect_pk}"


def relink_subject(subject_key: str) -> tuple[bytes, str]:
    """Digest and summary of the identity change a relink would make, recomputed from the durable facts: the
    effect (state, conflict mark, proven identity, last change) and every active link it would retire. Any change
    to them gives another digest, so approvals of the old one count for nothing."""
    kind, _, raw = subject_key.partition(":")
    effect = RemoteEffect.objects.select_related("command").filter(pk=int(raw) if raw.isdigit() else 0).first()
    if kind != "effect" or effect is None:
        raise TransitionRefused(f"no remote effect named by {subject_key!r}")
    slot = effect_slot(effect)
    links = conflicting_links(effect, slot)
    facts = {"protocol": SUBJECT_PROTOCOL, "effect": effect.pk, "state": effect.state,
             "reason": effect.quarantine_reason, "remote_id": effect.remote_id, "slot": slot,
             "changed_at": effect.changed_at.isoformat(),
             "retire": [[link.pk, link.owner_slot, link.remote_identity] for link in links]}
    retiring = ", ".join(f"#{link.pk} {link.owner_slot} -> {link.remote_identity}" for link in links) or "none"
    summary = (f"Effect #{effect.pk} ({effect.state}): link owner slot {slot!r} to the proven remote identity "
               f"{effect.remote_id!r}; retire the conflicting active links: {retiring}")
    return hashlib.sha256(canonical_json(facts)).digest(), summary


def relink_outcome(request: DualApprovalRequest) -> str | None:
    """What became of an approved relink request: the resolution that used it (or the other resolution that
    ended the conflict without it), or None while the conflict is still open. Read-only (`subject_outcome`)."""
    kind, _, raw = request.subject_key.partition(":")
    resolution = RemoteLinkResolution.objects.filter(effect_id=int(raw) if kind == "effect" and raw.isdigit()
                                                     else 0).first()
    if resolution is None:
        return None
    when = f"{resolution.created_at:%Y-%m-%d %H:%M:%S}"
    if resolution.approval_id == request.pk:
        retired = ", ".join(f"#{pk}" for pk in resolution.retired_links) or "none"
        return (f"Applied by {resolution.decided_by} at {when}: owner slot {resolution.owner_slot!r} is linked to "
                f"{resolution.proven_identity!r} (link #{resolution.new_link_id}; retired links {retired}); "
                f"effect #{resolution.effect_id} finalized.")
    return (f"Not used: {resolution.decided_by} resolved effect #{resolution.effect_id}'s conflict with "
            f"{resolution.decision} at {when}; nothing this approval covers was applied.")


def relink_set_key(effect_pks) -> str:
    """The subject key of the set of relinks of these effects (`approvals.set_key` of their subject keys)."""
    return approvals.set_key([relink_subject_key(pk) for pk in effect_pks])


def member_effect_pk(member_key: str) -> int | None:
    kind, _, raw = member_key.partition(":")
    return int(raw) if kind == "effect" and raw.isdigit() else None


def relinked_under(approval_pk: int, effect_pks) -> dict:
    """{effect pk: when} of those of `effect_pks` a relink applied under approval request #approval_pk. Read-only."""
    return dict(RemoteLinkResolution.objects.filter(approval_id=approval_pk, effect_id__in=list(effect_pks))
                .values_list("effect_id", "created_at"))


def relink_set_outcome(request: DualApprovalRequest) -> str | None:
    """What became of an approved set of relinks, once every member's conflict is resolved (None while one is still
    open): how many members this approval applied and how many were resolved otherwise. Read-only."""
    pks = [member_effect_pk(key) for key in request.members.values_list("member_key", flat=True)]
    resolutions = list(RemoteLinkResolution.objects.filter(effect_id__in=[pk for pk in pks if pk is not None]))
    if len(resolutions) < len(pks):
        return None
    used = [r for r in resolutions if r.approval_id == request.pk]
    last = max(r.created_at for r in resolutions)
    return (f"{len(used)} of {len(pks)} relinks applied under this approval (the last conflict ended at "
            f"{last:%Y-%m-%d %H:%M:%S}); {len(pks) - len(used)} resolved otherwise.")


# -- resolution --------------------------------------------------------------------------------------------------

def _conflicted(*, effect_pk: int, evidence: str, actor: Actor, expected_changed_at) -> RemoteEffect:
    """Lock the effect and check the preconditions every resolution shares (in the caller's transaction)."""
    if actor.user is not None and not actor.user.has_perm(PERMISSION):
        raise PermissionRefused(f"{actor} lacks the {PERMISSION} permission")
    if not evidence.strip():
        raise ReconcileRefused("a resolution needs authoritative evidence (a provider lookup, a ticket)")
    if expected_changed_at is None:
        raise ReconcileRefused("a resolution names the effect state it was decided on (its last change)")
    effect = locks.effect_for_update(effect_pk)
    if effect is None:
        raise ReconcileRefused(f"no effect #{effect_pk}")
    if effect.changed_at != expected_changed_at:
        raise ReconcileRefused(f"effect #{effect_pk} changed since the page was shown (now {effect.state}); "
                               "reload and decide again")
    if effect.state != EffectState.REMOTE_CONFIRMED or effect.quarantine_reason != CONFLICT:
        raise ReconcileRefused(f"effect #{effect_pk} is {effect.state} without a RemoteLink conflict; nothing to "
                               "resolve")
    return effect


def _finalize(effect: RemoteEffect, *, actor: Actor, action: str, evidence: str) -> RemoteEffect:
    effect.finalize()
    effect.save()
    stage_metrics.effect_finalized(callout=effect.command.callout, commanded_at=effect.command.created_at,
                                   finalized_at=effect.changed_at)
    audit_record(actor=actor, entity=effect, action=action, from_state=EffectState.REMOTE_CONFIRMED,
                 to_state=effect.state, reason=evidence[:500])
    return effect


@transaction.atomic
def effect_link_keep(*, effect_pk: int, evidence: str, actor: Actor, expected_changed_at) -> RemoteEffect:
    """Resolve a conflict by keeping the existing links as the identity authority: append the evidence (e.g. the
    provider shows the update landed on the linked record and answered an alias) and finalize the effect
    (`remote_confirmed -> finalized`) without writing a link. No identity changes, so one operator suffices.
    Locks: the effect, FOR UPDATE. Raises ReconcileRefused (stale page, no conflict, no evidence) or
    PermissionRefused."""
    effect = _conflicted(effect_pk=effect_pk, evidence=evidence, actor=actor, expected_changed_at=expected_changed_at)
    slot = effect_slot(effect)
    RemoteLinkResolution.objects.create(effect=effect, decision=KEEP, owner_slot=slot,
                                        proven_identity=effect.remote_id,
                                        kept_link=active_link(account_id=effect.account_id, owner_slot=slot),
                                        evidence=evidence, decided_by=str(actor))
    return _finalize(effect, actor=actor, action="effect_link_keep", evidence=evidence)


@transaction.atomic
def effect_relink_request(*, effect_pk: int, reason: str, evidence_ref: str, actor: Actor, expected_changed_at
                          ) -> DualApprovalRequest:
    """Ask two approvers to approve relinking the effect's owner slot to its proven identity: opens (or returns)
    the dual-approval request for the current subject digest (`relink_subject`), carrying the requester's reason
    and evidence reference for the approvers to read. Changes no link or effect."""
    evidence = f"{reason.strip()} [evidence: {evidence_ref.strip()}]" if reason.strip() and evidence_ref.strip() else ""
    effect = _conflicted(effect_pk=effect_pk, evidence=evidence, actor=actor, expected_changed_at=expected_changed_at)
    request = approvals.approval_request(kind=APPROVAL_KIND, subject_key=relink_subject_key(effect.pk), actor=actor,
                                         reason=reason, evidence_ref=evidence_ref)
    audit_record(actor=actor, entity=effect, action="effect_relink_request", from_state=effect.state,
                 to_state=effect.state, evidence_digest=bytes(request.subject_digest), reason=evidence[:500])
    return request


@transaction.atomic
def effect_relink_set_request(*, items: list[tuple[int, object]], reason: str, evidence_ref: str, actor: Actor
                              ) -> DualApprovalRequest:
    """Ask two approvers to approve relinking a set of conflicted effects at once (D-494): each (effect pk, the
    change time the page showed) is checked as `effect_relink_request` checks one (lock, evidence, stale page,
    still a conflict), then one dual-approval request of the set opens (or the live one of the same set and digest
    returns), storing each member's digest as read now. Changes no link or effect; one audit row per effect.
    A refusal of any member refuses the whole request: the approvers see exactly the set the requester saw.
    Locks: the effects, FOR UPDATE, by ascending pk; then the set's live request."""
    evidence = f"{reason.strip()} [evidence: {evidence_ref.strip()}]" if reason.strip() and evidence_ref.strip() else ""
    if not items:
        raise ReconcileRefused("a set of relinks needs at least one effect")
    effects = [_conflicted(effect_pk=pk, evidence=evidence, actor=actor, expected_changed_at=shown)
               for pk, shown in sorted(items, key=lambda item: item[0])]
    members = [relink_subject_key(effect.pk) for effect in effects]
    request = approvals.approval_request(kind=SET_KIND, subject_key=approvals.set_key(members), actor=actor,
                                         reason=reason, evidence_ref=evidence_ref, members=members)
    for effect in effects:
        audit_record(actor=actor, entity=effect, action="effect_relink_request", from_state=effect.state,
                     to_state=effect.state, evidence_digest=bytes(request.subject_digest),
                     reason=f"set request #{request.pk}: {evidence}"[:500])
    return request


@transaction.atomic
def effect_relink_apply(*, effect_pk: int, evidence: str, actor: Actor, expected_changed_at,
                        approval_pk: int | None = None) -> RemoteEffect:
    """Apply an approved identity change: require an approved dual approval of exactly the current subject digest
    (with `approval_pk`: the approved set request #approval_pk lists this effect with exactly its current digest,
    `approvals.approval_require_member`, D-494), retire every conflicting active link (`active -> retired`), link the slot to the proven identity, append the
    resolution with its evidence and approval, and finalize the effect. The provider is never called.
    Locks: the effect, then the links (FOR UPDATE, ascending pk). Raises ApprovalMissing, ReconcileRefused or
    PermissionRefused."""
    effect = _conflicted(effect_pk=effect_pk, evidence=evidence, actor=actor, expected_changed_at=expected_changed_at)
    key = relink_subject_key(effect.pk)
    digest, _ = relink_subject(key)
    if approval_pk is None:
        request = approvals.approval_require(kind=APPROVAL_KIND, subject_key=key, digest=digest)
    else:
        request = approvals.approval_require_member(kind=SET_KIND, request_pk=approval_pk, member_key=key,
                                                    digest=digest)
    slot = effect_slot(effect)
    retired = []
    now = timezone.now()
    for link in locks.links_for_update([link.pk for link in conflicting_links(effect, slot)]):
        link.retire(at=now)
        link.save()
        audit_record(actor=actor, entity=link, action="link_retire", from_state=LinkState.ACTIVE,
                     to_state=link.state, evidence_digest=digest, reason=f"relink of effect #{effect.pk}")
        retired.append(link.pk)
    new = RemoteLink.objects.create(account_id=effect.account_id, owner_slot=slot, remote_identity=effect.remote_id,
                                    effect=effect)
    RemoteLinkResolution.objects.create(effect=effect, decision=RELINK, owner_slot=slot,
                                        proven_identity=effect.remote_id, new_link=new, retired_links=retired,
                                        approval=request, evidence=evidence, decided_by=str(actor))
    return _finalize(effect, actor=actor, action="effect_relink_apply", evidence=evidence)
