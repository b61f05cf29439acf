"""One dual approval for a SET of relinks (issue 38 item 5, D-494, superseding D-493), on real PostgreSQL with a
real HTTP receiver: the board's REMOTE_LINK_CONFLICT group requests one approval for the selected set; the request
stores each member with the digest the requester saw and its digest binds exactly that set; two approvers other
than the requester approve it with the same rules as a single relink; applying it decides each member by the
relink service under the set's approval, one transaction and one audit row each, a member that changed since it
was approved refused alone (APPROVAL_MEMBER_CHANGED); re-applying decides nothing twice."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.db import IntegrityError, ProgrammingError, connection, transaction

from connector.actors import Actor
from connector.errors import ApprovalMemberChanged, ApprovalMissing, ApprovalRefused
from connector.models import AuditRecord, DualApprovalRequest, DualApprovalSetMember
from connector.services import approvals
from effects.errors import ReconcileRefused
from effects.models import RemoteEffect, RemoteLink, RemoteLinkResolution
from effects.services import identity
from governance import bulk
from tests.concurrency import run_concurrently
from tests.dbroles import as_admin
from tests.effects.test_remote_identity import dispatch, push
from tests.governance.test_remediation_screens import post
from tests.governance.test_screens import client_for

RECORDS = ("r1", "r2", "r3")


def _person(name: str, *groups: str) -> User:
    user = User.objects.create_user(name)
    for group in groups:
        user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


@pytest.fixture
def conflicts(push_world, receiver):
    """Three records created and linked, then an update of each the provider answers with another identity: three
    effects `remote_confirmed` with REMOTE_LINK_CONFLICT, each with the slot's old link in the way."""
    acme = push_world.accounts[0]
    for record in RECORDS:
        push(acme, record, 1)
        assert dispatch(acme).state == "finalized"
    for record in RECORDS:
        push(acme, record, 2)
    receiver.modes = ["new_identity"] * len(RECORDS)
    effects = [dispatch(acme) for _ in RECORDS]
    assert {(e.state, e.quarantine_reason) for e in effects} == {("remote_confirmed", "REMOTE_LINK_CONFLICT")}
    return acme, effects


@pytest.fixture
def deciders(people):
    """The requester holds both roles (so only the four-eyes rule stops them approving), and two approvers."""
    return {"requester": _person("rita-both", "operator", "approver"), "b": people["approver"],
            "c": _person("carl-approver", "approver"), "operator": people["operator"]}


def _request(effects, user, reason="The CRM merged duplicates", evidence_ref="CRM audit T-5"):
    return identity.effect_relink_set_request(items=[(e.pk, e.changed_at) for e in effects], reason=reason,
                                              evidence_ref=evidence_ref, actor=Actor.for_user(user))


def _give(request, user, digest=None):
    return approvals.approval_give(request_pk=request.pk, digest_seen=digest or bytes(request.subject_digest),
                                   actor=Actor.for_user(user))


def _items(effects):
    return [(e.pk, RemoteEffect.objects.get(pk=e.pk).changed_at.isoformat()) for e in effects]


def test_one_request_stores_the_set_and_its_digest_binds_exactly_those_member_digests(conflicts, deciders):
    """The set request is ONE DualApprovalRequest of kind remote_identity_change_set whose stored members are the
    three effects' relink subjects with the digests read at the request, and whose digest is the digest over those
    (member, digest) pairs; one audit row for the request and one per effect. The membership is append-only for
    the application role and for the administrator. Asking again for the same set returns the live request; a
    stale member refuses the whole request (nothing is written). Proves: issue 38 item 5"""
    acme, effects = conflicts
    request = _request(effects, deciders["requester"])
    assert DualApprovalRequest.objects.count() == 1 and request.kind == "remote_identity_change_set"
    members = list(request.members.order_by("ordinal"))
    assert [m.member_key for m in members] == [f"effect:{e.pk}" for e in effects]
    for member, effect in zip(members, effects, strict=True):
        digest, summary = identity.relink_subject(f"effect:{effect.pk}")
        assert (bytes(member.member_digest), member.summary) == (digest, summary)
    pairs = [(m.member_key, bytes(m.member_digest)) for m in members]
    assert bytes(request.subject_digest) == approvals.set_digest(request.kind, pairs)
    assert approvals.subject_current(request.kind, request.subject_key)[0] == bytes(request.subject_digest)
    assert AuditRecord.objects.filter(action="dual_approval_request").count() == 1
    assert sorted(AuditRecord.objects.filter(action="effect_relink_request").values_list("entity_id", flat=True)) \
        == sorted(str(e.pk) for e in effects)
    assert _request(list(reversed(effects)), deciders["requester"]).pk == request.pk  # same set, same request
    for sql in ("UPDATE connector_dualapprovalsetmember SET summary = 'x' WHERE id = %s",
                "DELETE FROM connector_dualapprovalsetmember WHERE id = %s"):
        with pytest.raises(ProgrammingError, match="permission denied"), transaction.atomic(), \
                connection.cursor() as cursor:
            cursor.execute(sql, [members[0].pk])
        with pytest.raises(IntegrityError) as info, as_admin(), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [members[0].pk])
        assert info.value.__cause__.diag.constraint_name == "connector_dualapprovalsetmember_append_only"
    stale = [(effects[0].pk, effects[0].changed_at), (effects[1].pk, effects[1].changed_at.replace(year=2000))]
    with pytest.raises(ReconcileRefused, match="changed since the page was shown"):
        identity.effect_relink_set_request(items=stale, reason="r", evidence_ref="e",
                                           actor=Actor.for_user(deciders["requester"]))
    assert DualApprovalRequest.objects.count() == 1 and DualApprovalSetMember.objects.count() == 3


def test_two_approvers_other_than_the_requester_approve_the_set_and_a_changed_member_voids_the_digest(
        conflicts, deciders):
    """Four eyes, exactly as for one relink: the requester cannot approve their own set (even holding the
    approver role), one approver approves once, the second distinct approver makes it approved. A member that
    changes before the second approval changes the set's digest: that approval is refused, and a new request of
    the set voids the old one. Proves: issue 38 item 5"""
    acme, effects = conflicts
    request = _request(effects, deciders["requester"])
    with pytest.raises(ApprovalRefused, match="requester cannot approve"):
        _give(request, deciders["requester"])
    assert _give(request, deciders["b"]).state == "pending"
    with pytest.raises(ApprovalRefused, match="already approved"):
        _give(request, deciders["b"])
    # another slot is linked to the identity the second effect proved: its relink would now retire that link too
    RemoteLink.objects.create(account_id=acme.pk, owner_slot="r9", remote_identity=effects[1].remote_id,
                              effect=effects[0])
    with pytest.raises(ApprovalRefused, match="subject changed"):
        _give(request, deciders["c"])
    assert DualApprovalRequest.objects.get(pk=request.pk).state == "pending"
    again = _request(effects, deciders["requester"])
    assert again.pk != request.pk and DualApprovalRequest.objects.get(pk=request.pk).state == "voided"
    _give(again, deciders["b"])
    assert _give(again, deciders["c"]).state == "approved"


def test_applying_the_set_applies_each_member_once_and_a_changed_member_is_refused_alone(conflicts, deciders):
    """An approved set is applied member by member by `effect_relink_apply` under the set's approval: a member
    whose digest changed since the approval is refused on its own with APPROVAL_MEMBER_CHANGED and keeps its
    conflict; the other two are relinked, each with one resolution naming the set's approval and one
    `effect_relink_apply` audit row. Applying again decides nothing twice (no new resolution, link or audit row),
    and the set's approval cannot relink an effect that is not its member. Proves: issue 38 item 5"""
    acme, effects = conflicts
    request = _request(effects, deciders["requester"])
    _give(request, deciders["b"])
    _give(request, deciders["c"])
    with pytest.raises(ApprovalMissing):  # a member of the set has no single approval of its own
        identity.effect_relink_apply(effect_pk=effects[0].pk, evidence="x", actor=Actor.for_user(deciders["operator"]),
                                     expected_changed_at=effects[0].changed_at)
    RemoteLink.objects.create(account_id=acme.pk, owner_slot="r9", remote_identity=effects[1].remote_id,
                              effect=effects[0])  # the second member changes after the approval
    outcomes = bulk.apply_relink_set(approval_pk=request.pk, items=_items(effects),
                                     actor=Actor.for_user(deciders["operator"]), reason="merged", evidence_ref="T-5")
    assert [(o.pk, o.done, o.code) for o in outcomes] == [
        (effects[0].pk, True, ""), (effects[1].pk, False, "APPROVAL_MEMBER_CHANGED"), (effects[2].pk, True, "")]
    states = {e.pk: (e.state, e.quarantine_reason) for e in RemoteEffect.objects.filter(pk__in=[e.pk for e in effects])}
    assert states[effects[1].pk] == ("remote_confirmed", "REMOTE_LINK_CONFLICT")
    assert states[effects[0].pk][0] == states[effects[2].pk][0] == "finalized"
    resolutions = list(RemoteLinkResolution.objects.order_by("effect_id"))
    assert [(r.effect_id, r.decision, r.approval_id) for r in resolutions] == [
        (effects[0].pk, "relink", request.pk), (effects[2].pk, "relink", request.pk)]
    applied = sorted(AuditRecord.objects.filter(action="effect_relink_apply").values_list("entity_id", flat=True))
    assert applied == sorted([str(effects[0].pk), str(effects[2].pk)])
    links = RemoteLink.objects.count()

    again = bulk.apply_relink_set(approval_pk=request.pk, items=_items(effects),
                                  actor=Actor.for_user(deciders["operator"]), reason="merged", evidence_ref="T-5")
    assert [(o.pk, o.done, o.code, "already applied" in o.detail) for o in again] == [
        (effects[0].pk, True, "", True), (effects[1].pk, False, "APPROVAL_MEMBER_CHANGED", False),
        (effects[2].pk, True, "", True)]
    assert RemoteLinkResolution.objects.count() == 2 and RemoteLink.objects.count() == links
    assert AuditRecord.objects.filter(action="effect_relink_apply").count() == 2
    with pytest.raises(ApprovalMemberChanged):
        identity.effect_relink_apply(effect_pk=effects[1].pk, evidence="x", actor=Actor.for_user(deciders["operator"]),
                                     expected_changed_at=effects[1].changed_at, approval_pk=request.pk)
    assert approvals.subject_outcome(DualApprovalRequest.objects.get(pk=request.pk)) is None  # one still open


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_two_operators_applying_one_set_at_once_relink_each_member_exactly_once(conflicts, deciders):
    """Two operators apply the same approved set at the same moment, each on their own connection: every member is
    relinked exactly once (one resolution naming the set, one `effect_relink_apply` audit row), by one of them;
    the other's outcome for it is "already applied" or RECONCILE_REFUSED (the effect moved under its lock), never
    a second relink, an error or a deadlock. Proves: issue 38 item 5"""
    acme, effects = conflicts
    request = _request(effects, deciders["requester"])
    _give(request, deciders["b"])
    _give(request, deciders["c"])
    actors = [Actor.for_user(deciders["operator"]), Actor.for_user(_person("otto-operator", "operator"))]
    items = _items(effects)
    results = run_concurrently(
        [lambda i=i: bulk.apply_relink_set(approval_pk=request.pk, items=items, actor=actors[i],
                                           reason=f"merged ({i})", evidence_ref="T-5") for i in (0, 1)],
        expect=(), before=connection.ensure_connection)
    for effect in effects:
        mine = [o for outcomes in results for o in outcomes if o.pk == effect.pk]
        relinked = [o for o in mine if o.done and "already applied" not in o.detail]
        others = [o for o in mine if o not in relinked]
        assert len(relinked) == 1 and len(others) == 1, mine
        assert (others[0].done and "already applied" in others[0].detail) or others[0].code == "RECONCILE_REFUSED"
    assert sorted(RemoteLinkResolution.objects.filter(approval=request).values_list("effect_id", flat=True)) == \
        sorted(e.pk for e in effects)
    audit = AuditRecord.objects.filter(action="effect_relink_apply")
    assert sorted(audit.values_list("entity_id", flat=True)) == sorted(str(e.pk) for e in effects)


def test_a_set_approval_relinks_only_its_members(conflicts, deciders):
    """An approved set of two relinks nothing else: the third effect, not a member, is refused APPROVAL_MISSING
    under the set's approval. Proves: issue 38 item 5"""
    acme, effects = conflicts
    request = _request(effects[:2], deciders["requester"])
    _give(request, deciders["b"])
    _give(request, deciders["c"])
    with pytest.raises(ApprovalMissing, match="not a member"):
        identity.effect_relink_apply(effect_pk=effects[2].pk, evidence="x", actor=Actor.for_user(deciders["operator"]),
                                     expected_changed_at=effects[2].changed_at, approval_pk=request.pk)
    assert not RemoteLinkResolution.objects.exists()


def test_the_board_requests_one_approval_for_the_set_and_the_page_shows_and_applies_it(conflicts, deciders):
    """Screens: the board's REMOTE_LINK_CONFLICT group offers the bulk form; the bulk page without a reason comes
    back as typed with nothing requested; with them it opens ONE request and lands on its page, which shows each
    member (effect link, before/after, short digest); the requester sees no Approve button; two approvers approve
    on the page; the operator applies the set there and the page reports each member's outcome, then reads as
    finished. Proves: issue 38 item 5"""
    acme, effects = conflicts
    requester = client_for(deciders["requester"])
    board = requester.get("/board/").content.decode()
    assert 'id="bulk-REMOTE_LINK_CONFLICT"' in board and "Request one dual approval to relink" in board
    ticks = [f"{e.pk}|{e.changed_at.isoformat()}" for e in effects]
    bulk_page = requester.get("/bulk/?code=REMOTE_LINK_CONFLICT").content.decode()
    assert all(f'value="{tick}"' in bulk_page for tick in ticks) and 'id="set-note"' in bulk_page
    missing = post(requester, "/bulk/", code="REMOTE_LINK_CONFLICT", item=ticks, reason="merged", evidence_ref="")
    assert missing.status_code == 400 and "Enter an evidence reference" in missing.content.decode()
    assert ">merged</textarea>" in missing.content.decode()  # the typing is kept
    assert not DualApprovalRequest.objects.exists()
    asked = post(requester, "/bulk/", code="REMOTE_LINK_CONFLICT", item=ticks, reason="CRM merged duplicates",
                 evidence_ref="CRM audit T-5")
    request = DualApprovalRequest.objects.get()
    page = asked.content.decode()
    assert asked.redirect_chain[-1][0] == f"/attestations/approval/{request.pk}/"
    assert "One dual approval requested for the set of 3 relinks" in page
    members = page.split('id="members"', 1)[1].split("</table>", 1)[0]
    for member, effect in zip(request.members.order_by("ordinal"), effects, strict=True):
        digest = bytes(member.member_digest).hex()
        assert f'href="/queue/effect/{effect.pk}/"' in members and effect.remote_id in members
        assert f'title="{digest}">{digest[:12]}…</code>' in members
    assert "Approve</button>" not in page and "Apply the relinks" not in page
    effect_page = requester.get(f"/queue/effect/{effects[0].pk}/").content.decode()
    assert f'<a href="/attestations/approval/{request.pk}/">request #{request.pk}</a> (pending' in effect_page
    digest = bytes(request.subject_digest).hex()
    for approver in ("b", "c"):
        post(client_for(deciders[approver]), f"/attestations/approval/{request.pk}/", digest=digest)
    assert DualApprovalRequest.objects.get(pk=request.pk).state == "approved"
    operator = client_for(deciders["operator"])
    approved = operator.get(f"/attestations/approval/{request.pk}/").content.decode()
    assert "Apply the relinks</button>" in approved and "The subject changed since" not in approved
    applied = post(operator, f"/attestations/approval/{request.pk}/", action="apply", item=[
        f"{pk}|{token}" for pk, token in _items(effects)], reason="merged", evidence_ref="T-5").content.decode()
    outcome = applied.split('id="outcomes"', 1)[1].split("</table>", 1)[0]
    assert outcome.count('class="done"') == 3 and "What happened: 3 done, 0 refused" in applied
    assert RemoteLinkResolution.objects.filter(approval=request).count() == 3
    finished = operator.get(f"/attestations/approval/{request.pk}/").content.decode()
    assert "Finished. 3 of 3 relinks applied under this approval" in finished
    assert "Apply the relinks</button>" not in finished
