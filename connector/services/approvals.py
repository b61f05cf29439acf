"""Dual approval of cutover subjects (readiness certificates, restore points, activation decisions).

The owning app registers, per kind, a resolver `(subject_key) -> (digest, summary)` that recomputes the subject's
current digest from the durable facts (connector.hooks-style registration, so connector never imports cutover).
Requesting approval of a changed subject voids the live request and its approvals. An approval records who, when
and the digest they saw; it is refused unless that digest is the subject's current one, the approver is not the
requester, has not approved this request before, and is independent of the requester and of the other approver
(no person controlled two of their accounts within the identity cooling period, D-180). The second distinct approval moves the request to `approved`.
A request carries the requester's reason and evidence reference (D-461). An approver other than the requester may
refuse a pending request with a reason instead (`approval_refuse`): the request ends `refused` and can never be
approved; a new request of the subject starts again from zero (D-460).
The owning app may also register, per kind, what the guarded step did with an approved request
(`subject_outcome`), so a request whose step ran reads as finished, not as a changed subject (D-462).
`approval_require` is what the guarded step calls: it passes only for an approved request of exactly the digest
the step is about to act on.

A set kind (D-494, `register_set`) is one request for many members of a member kind (many relinks). The members
are given to `approval_request` and stored with the request (`DualApprovalSetMember`: each member's key and the
digest the requester saw); the set's subject key names its members (`set_key`) and its digest is the digest over
the (member key, member digest) pairs, so `approval_give` and `approval_refuse` bind exactly that set, with the
same rules as any request: a member that changed before the second approval changes the set's digest and the
approval is refused. Once approved, the guarded step applies each member on its own: `approval_require_member`
passes only while that member's current digest is still the one stored, so a member that changed meanwhile is
refused alone (APPROVAL_MEMBER_CHANGED) while the others, changing as they are applied, go ahead.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable

from django.db import IntegrityError, transaction

from connector.actors import Actor
from connector.errors import (ApprovalMemberChanged, ApprovalMissing, ApprovalReasonMissing, ApprovalRefused,
                              PermissionRefused, TransitionRefused)
from connector.models import ApprovalKind, ApprovalState, DualApproval, DualApprovalRequest, DualApprovalSetMember
from connector.models.approvals import APPROVAL_LIVE
from connector.receipts import canonical_json
from connector.services.audit import audit_record
from connector.services.identity import approver_require_independent

PERMISSION = "connector.give_dual_approval"
REQUIRED_APPROVALS = 2
Resolver = Callable[[str], tuple[bytes, str]]
Outcome = Callable[[DualApprovalRequest], "str | None"]
_RESOLVERS: dict[str, Resolver] = {}
_OUTCOMES: dict[str, Outcome] = {}
_SETS: dict[str, str] = {}  # set kind -> the kind of its members (D-494)
SET_PROTOCOL = "nexuscrm.connector.approval-set.v1"
SET_LIMIT = 500  # members of one set: the bulk page's one action (D-491)


def register_subject(kind: str, resolver: Resolver, outcome: Outcome | None = None) -> None:
    """`resolver(subject_key) -> (digest, summary)`; `outcome(request) -> words or None`: what the guarded step
    did with this approved request (None: it has not run)."""
    if kind not in ApprovalKind.values:
        raise ValueError(f"{kind!r} is not an approval kind")
    _RESOLVERS[kind] = resolver
    if outcome is not None:
        _OUTCOMES[kind] = outcome


def register_set(kind: str, member_kind: str, outcome: Outcome | None = None) -> None:
    """Make `kind` a set subject whose members are subjects of `member_kind` (which has its own resolver): a
    request of `kind` stores its members and each member's digest (D-494)."""
    if kind not in ApprovalKind.values or member_kind not in ApprovalKind.values or kind == member_kind:
        raise ValueError(f"{kind!r} of {member_kind!r} is not a set of approval kinds")
    _SETS[kind] = member_kind
    if outcome is not None:
        _OUTCOMES[kind] = outcome


def set_key(members: list[str]) -> str:
    """The subject key of the set of these member keys (whatever their order): the same members, the same key, so
    one set has at most one live request; another selection is another set."""
    names = "\n".join(sorted(set(members))).encode()
    return f"set:{len(set(members))}:{hashlib.sha256(names).hexdigest()[:40]}"


def set_digest(kind: str, pairs: list[tuple[str, bytes]]) -> bytes:
    """The digest of a set: over its (member key, member digest) pairs, by member key."""
    return hashlib.sha256(canonical_json({"protocol": SET_PROTOCOL, "kind": kind, "members": [
        [key, bytes(digest).hex()] for key, digest in sorted(pairs)]})).digest()


def _set_summary(kind: str, summaries: list[str], shown: int = 3) -> str:
    """The set in words: how many members, the first few in full (each member's own summary is stored with it)."""
    more = f"; and {len(summaries) - shown} more (each listed with its digest)" if len(summaries) > shown else ""
    return (f"{len(summaries)} {ApprovalKind(_SETS[kind]).label}s, one approval for the set: "
            + "; ".join(summaries[:shown]) + more)


def _members_current(kind: str, members: list[str]) -> list[tuple[str, bytes, str]]:
    return [(key, *subject_current(_SETS[kind], key)) for key in members]


def set_members(subject_key: str, kind: str) -> list[str]:
    """The member keys of a set subject, in the set's order, from its stored membership (every request of one
    set key has the same members: the key is made of them)."""
    request = (DualApprovalRequest.objects.filter(kind=kind, subject_key=subject_key).order_by("-pk")
               .only("pk").first())
    if request is None:
        raise TransitionRefused(f"no set {subject_key!r} of {kind!r} was requested")
    return list(request.members.order_by("ordinal").values_list("member_key", flat=True))


def subject_outcome(request: DualApprovalRequest) -> str | None:
    """What the step this approved request guarded did with it, in words, or None (not approved, not run yet, or
    the kind registers no outcome). Read-only."""
    outcome = _OUTCOMES.get(request.kind)
    if request.state != ApprovalState.APPROVED or outcome is None:
        return None
    return outcome(request)


def subject_current(kind: str, subject_key: str) -> tuple[bytes, str]:
    """The subject's current digest and summary, recomputed from the durable facts (a set's: over its members'
    current digests)."""
    if kind in _SETS:
        current = _members_current(kind, set_members(subject_key, kind))
        return set_digest(kind, [(key, digest) for key, digest, _ in current]), _set_summary(
            kind, [summary for _, _, summary in current])
    try:
        resolver = _RESOLVERS[kind]
    except KeyError:
        raise TransitionRefused(f"no resolver is registered for approval kind {kind!r}") from None
    return resolver(subject_key)


def _person(actor: Actor) -> None:
    if actor.user is None:
        raise PermissionRefused("dual approval is given and requested by people, not system actors")


@transaction.atomic
def approval_request(*, kind: str, subject_key: str, actor: Actor, reason: str, evidence_ref: str,
                     members: list[str] | None = None) -> DualApprovalRequest:
    """Open (or return) the live request for the subject's current digest, with the requester's reason and evidence
    reference (both required: the approvers read them). A live request for another digest is voided first: the
    subject changed, so its approvals count for nothing. Returning the live request of the same digest keeps its
    original reason. A set kind (D-494) takes its `members` (member subject keys, in the order the set shows
    them; `subject_key` is `set_key(members)`) and stores each with the digest read now."""
    _person(actor)
    reason, evidence_ref = reason.strip(), evidence_ref.strip()
    if not reason or not evidence_ref:
        raise ApprovalReasonMissing("a dual-approval request needs the requester's reason and an evidence reference")
    current = None
    if kind in _SETS:
        if not members or len(set(members)) != len(members) or len(members) > SET_LIMIT:
            raise TransitionRefused(f"a set needs 1 to {SET_LIMIT} distinct members")
        if subject_key != set_key(members):
            raise TransitionRefused(f"{subject_key!r} does not name this set of members")
        current = _members_current(kind, members)
        digest = set_digest(kind, [(key, member_digest) for key, member_digest, _ in current])
        summary = _set_summary(kind, [member_summary for _, _, member_summary in current])
    elif members is not None:
        raise TransitionRefused(f"{kind!r} is not a set kind; it takes no members")
    else:
        digest, summary = subject_current(kind, subject_key)
    live = (DualApprovalRequest.objects.select_for_update()
            .filter(kind=kind, subject_key=subject_key, state__in=APPROVAL_LIVE).first())
    if live is not None:
        if bytes(live.subject_digest) == digest:
            return live
        from_state = live.state
        live.void(reason=f"subject changed: new digest {digest.hex()[:16]}…")
        live.save()
        audit_record(actor=actor, entity=live, action="dual_approval_void", from_state=from_state,
                     to_state=live.state, evidence_digest=digest, reason=live.void_reason)
    request = DualApprovalRequest.objects.create(kind=kind, subject_key=subject_key, subject_digest=digest,
                                                 summary=summary, requested_by=actor.user, reason=reason,
                                                 evidence_ref=evidence_ref[:500])
    if current is not None:
        DualApprovalSetMember.objects.bulk_create(
            DualApprovalSetMember(request=request, ordinal=i, member_key=key, member_digest=member_digest,
                                  summary=member_summary)
            for i, (key, member_digest, member_summary) in enumerate(current))
    audit_record(actor=actor, entity=request, action="dual_approval_request", to_state=request.state,
                 evidence_digest=digest, reason=f"{reason} [evidence: {evidence_ref}]"[:500])
    return request


@transaction.atomic
def approval_give(*, request_pk: int, digest_seen: bytes, actor: Actor) -> DualApprovalRequest:
    _person(actor)
    if not actor.user.has_perm(PERMISSION):
        raise PermissionRefused(f"{actor} lacks {PERMISSION}")
    request = DualApprovalRequest.objects.select_for_update().get(pk=request_pk)
    if request.state != ApprovalState.PENDING:
        raise ApprovalRefused(f"the request is {request.state}; nothing to approve")
    current, _ = subject_current(request.kind, request.subject_key)
    if bytes(digest_seen) != bytes(request.subject_digest) or current != bytes(request.subject_digest):
        raise ApprovalRefused("the subject changed since it was shown: approvals of the old digest are void; "
                              "request approval of the current subject")
    if request.requested_by_id == actor.user.pk:
        raise ApprovalRefused("the requester cannot approve their own request")
    approver_require_independent(approver_id=actor.user.pk, requester_id=request.requested_by_id,
                                 other_approver_ids=list(request.approvals.filter(digest_seen=current)
                                                         .exclude(approver_id=actor.user.pk)
                                                         .values_list("approver_id", flat=True)))
    try:
        with transaction.atomic():
            DualApproval.objects.create(request=request, approver=actor.user, requester_id=request.requested_by_id,
                                        digest_seen=current)
    except IntegrityError as exc:
        raise ApprovalRefused(f"{actor} already approved this request") from exc
    audit_record(actor=actor, entity=request, action="dual_approval_give", from_state=request.state,
                 to_state=request.state, evidence_digest=current)
    if request.approvals.filter(digest_seen=current).count() >= REQUIRED_APPROVALS:
        request.approve()
        request.save()
        audit_record(actor=actor, entity=request, action="dual_approval_approved", from_state=ApprovalState.PENDING,
                     to_state=request.state, evidence_digest=current)
    return request


@transaction.atomic
def approval_refuse(*, request_pk: int, digest_seen: bytes, reason: str, actor: Actor) -> DualApprovalRequest:
    """Refuse a pending request (`pending -> refused`, terminal): an approver other than the requester, with a
    reason, about the request whose digest the page showed. Approvals it had count for nothing from then on; the
    requester may ask again (a new request, approvals from zero). No independence check: a refusal only stops.
    Locks: the request, FOR UPDATE. Raises ApprovalReasonMissing, ApprovalRefused or PermissionRefused."""
    _person(actor)
    if not actor.user.has_perm(PERMISSION):
        raise PermissionRefused(f"{actor} lacks {PERMISSION}")
    reason = reason.strip()
    if not reason:
        raise ApprovalReasonMissing("a refusal needs the refuser's reason")
    request = DualApprovalRequest.objects.select_for_update().get(pk=request_pk)
    if request.state != ApprovalState.PENDING:
        raise ApprovalRefused(f"the request is {request.state}; nothing to refuse")
    if bytes(digest_seen) != bytes(request.subject_digest):
        raise ApprovalRefused("the page showed another request's digest; reload and decide again")
    if request.requested_by_id == actor.user.pk:
        raise ApprovalRefused("the requester cannot refuse their own request: two other people decide it")
    request.refuse(by=actor.user, reason=reason)
    request.save()
    audit_record(actor=actor, entity=request, action="dual_approval_refuse", from_state=ApprovalState.PENDING,
                 to_state=request.state, evidence_digest=bytes(request.subject_digest), reason=reason[:500])
    return request


def approval_require(*, kind: str, subject_key: str, digest: bytes) -> DualApprovalRequest:
    """Pass only if an approved request exists for exactly this digest. Call it inside the guarded step's
    transaction: the request row stays locked until that transaction ends, so a concurrent void (a new request for a
    changed subject) either commits first and is seen, or waits for the step."""
    with transaction.atomic():
        request = (DualApprovalRequest.objects.select_for_update()
                   .filter(kind=kind, subject_key=subject_key, state=ApprovalState.APPROVED).first())
    if request is None or bytes(request.subject_digest) != bytes(digest):
        raise ApprovalMissing(f"{kind} {subject_key} has no dual approval of digest {bytes(digest).hex()[:16]}…")
    return request


def approval_require_member(*, kind: str, request_pk: int, member_key: str, digest: bytes) -> DualApprovalRequest:
    """Pass only if the set request `request_pk` of set kind `kind` is approved, lists `member_key`, and that
    member's stored digest (the one the requester saw and the approvers approved) is exactly `digest`, the member's
    current one. Call it inside the guarded step's transaction, as `approval_require` (the request row is locked
    FOR UPDATE until it ends). Raises ApprovalMissing (no such approved set, or not a member of it) or
    ApprovalMemberChanged (the member changed since it was approved)."""
    with transaction.atomic():
        request = (DualApprovalRequest.objects.select_for_update()
                   .filter(pk=request_pk, kind=kind, state=ApprovalState.APPROVED).first())
    if request is None or kind not in _SETS:
        raise ApprovalMissing(f"no approved {kind} request #{request_pk}")
    member = request.members.filter(member_key=member_key).first()
    if member is None:
        raise ApprovalMissing(f"{member_key} is not a member of the set approved by request #{request_pk}")
    if bytes(member.member_digest) != bytes(digest):
        raise ApprovalMemberChanged(
            f"{member_key} changed since the set was approved (approved digest {bytes(member.member_digest).hex()[:16]}"
            f"…, now {bytes(digest).hex()[:16]}…); it is not applied under request #{request_pk}")
    return request
