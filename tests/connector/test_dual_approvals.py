"""Dual approval of cutover subjects: two distinct people, neither the requester, each approving the exact digest
they saw; one person approves once; a changed subject voids earlier approvals; the guarded step passes only for an
approved request of exactly its digest. Rules hold in the service and, where they are facts, in PostgreSQL."""
from __future__ import annotations

import itertools

import pytest
from django.contrib.auth.models import Group, User
from django.db import IntegrityError, ProgrammingError, connection, transaction
from django_fsm import TransitionNotAllowed

from connector.actors import Actor
from connector.errors import ApprovalMissing, ApprovalRefused, PermissionRefused
from connector.models import ApprovalState, DualApproval, DualApprovalRequest
from connector.services import approvals, serving
from tests.concurrency import run_concurrently
from tests.cutover.succession_helpers import ACTOR, build_succession_world
from tests import dbroles

KIND = "activation_decision"
SEED = {("pending", "approved"), ("pending", "voided"), ("approved", "voided"), ("pending", "refused")}
STATES = ["pending", "approved", "voided", "refused"]
WHY = {"reason": "cutover rehearsal passed", "evidence_ref": "CHG-1"}


def _people():
    def make(name, group="approver"):
        user = User.objects.create_user(name)
        if group:
            user.groups.add(Group.objects.get(name=group))
        return Actor.for_user(User.objects.get(pk=user.pk))
    return make("req"), make("a1"), make("a2"), make("aud", "auditor")


@pytest.fixture
def subject(db):
    world = build_succession_world("da-")
    return world, world.successor.epoch_id


def test_two_distinct_approvers_other_than_the_requester_approve(subject):
    """Proves: the issue's dual-approval rules (requester excluded, one approval per person, second distinct approver
    approves) for the activation decision of a verified epoch."""
    world, key = subject
    req, a1, a2, aud = _people()
    row = approvals.approval_request(kind=KIND, subject_key=key, actor=req, **WHY)
    digest = bytes(row.subject_digest)
    with pytest.raises(ApprovalRefused, match="requester"):
        approvals.approval_give(request_pk=row.pk, digest_seen=digest, actor=req)
    with pytest.raises(PermissionRefused):
        approvals.approval_give(request_pk=row.pk, digest_seen=digest, actor=aud)
    with pytest.raises(ApprovalMissing):
        approvals.approval_require(kind=KIND, subject_key=key, digest=digest)
    assert approvals.approval_give(request_pk=row.pk, digest_seen=digest, actor=a1).state == "pending"
    with pytest.raises(ApprovalRefused, match="already approved"):
        approvals.approval_give(request_pk=row.pk, digest_seen=digest, actor=a1)
    assert approvals.approval_give(request_pk=row.pk, digest_seen=digest, actor=a2).state == "approved"
    assert approvals.approval_require(kind=KIND, subject_key=key, digest=digest).pk == row.pk
    with pytest.raises(ApprovalMissing):
        approvals.approval_require(kind=KIND, subject_key=key, digest=b"\x01" * 32)
    assert [a.approver.username for a in row.approvals.order_by("pk")] == ["a1", "a2"]
    assert approvals.approval_request(kind=KIND, subject_key=key, actor=a1, **WHY).pk == row.pk  # same digest: same row


def test_a_changed_subject_voids_earlier_approvals(subject):
    """An approval of a digest that is no longer the subject's is refused; a request for the changed subject voids
    the live request (and so its approvals), and approvals start again from zero. Proves: void-on-digest-change."""
    world, key = subject
    req, a1, a2, _ = _people()
    row = approvals.approval_request(kind=KIND, subject_key=key, actor=req, **WHY)
    old = bytes(row.subject_digest)
    approvals.approval_give(request_pk=row.pk, digest_seen=old, actor=a1)
    serving.epoch_reject(epoch_pk=world.successor.pk, reason="replaced by a corrected candidate", actor=ACTOR)
    with pytest.raises(ApprovalRefused, match="subject changed"):
        approvals.approval_give(request_pk=row.pk, digest_seen=old, actor=a2)
    assert DualApprovalRequest.objects.get(pk=row.pk).state == "pending"
    fresh = approvals.approval_request(kind=KIND, subject_key=key, actor=req, **WHY)
    assert fresh.pk != row.pk and bytes(fresh.subject_digest) != old and fresh.approvals.count() == 0
    voided = DualApprovalRequest.objects.get(pk=row.pk)
    assert voided.state == "voided" and "subject changed" in voided.void_reason
    with pytest.raises(ApprovalRefused):
        approvals.approval_give(request_pk=row.pk, digest_seen=old, actor=a2)


def test_an_approved_request_is_voided_by_a_change(subject):
    world, key = subject
    req, a1, a2, _ = _people()
    row = approvals.approval_request(kind=KIND, subject_key=key, actor=req, **WHY)
    for who in (a1, a2):
        approvals.approval_give(request_pk=row.pk, digest_seen=bytes(row.subject_digest), actor=who)
    serving.epoch_reject(epoch_pk=world.successor.pk, reason="withdrawn", actor=ACTOR)
    approvals.approval_request(kind=KIND, subject_key=key, actor=req, **WHY)
    assert DualApprovalRequest.objects.get(pk=row.pk).state == "voided"
    with pytest.raises(ApprovalMissing):
        approvals.approval_require(kind=KIND, subject_key=key, digest=bytes(row.subject_digest))


def test_postgres_refuses_self_approval_double_approval_and_edits(subject):
    """The database itself: the approver is never the requester (CHECK + composite FK to the request's requester),
    one approval per person (UNIQUE), approvals are append-only, one live request per subject."""
    world, key = subject
    req, a1, a2, _ = _people()
    row = approvals.approval_request(kind=KIND, subject_key=key, actor=req, **WHY)
    d = bytes(row.subject_digest)
    cases = [
        lambda: DualApproval.objects.create(request=row, approver=req.user, requester=req.user, digest_seen=d),
        lambda: DualApproval.objects.create(request=row, approver=a1.user, requester=a2.user, digest_seen=d),
        lambda: DualApprovalRequest.objects.create(kind=KIND, subject_key=key, subject_digest=d, summary="x",
                                                   requested_by=a1.user),
    ]
    for case in cases:
        with pytest.raises(IntegrityError), transaction.atomic():
            case()
    approvals.approval_give(request_pk=row.pk, digest_seen=d, actor=a1)
    with pytest.raises(IntegrityError), transaction.atomic():
        DualApproval.objects.create(request=row, approver=a1.user, requester=req.user, digest_seen=d)
    for sql in ("UPDATE connector_dualapproval SET digest_seen = %s", "DELETE FROM connector_dualapproval"):
        with pytest.raises(ProgrammingError, match="permission denied"), transaction.atomic(), \
                connection.cursor() as cursor:
            cursor.execute(sql, [b"\x00" * 32] if "%s" in sql else [])
        with dbroles.as_admin(), pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [b"\x00" * 32] if "%s" in sql else [])
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE connector_dualapprovalrequest SET subject_digest = %s", [b"\x00" * 32])


UPDATE_STATE = ("UPDATE connector_dualapprovalrequest SET state=%s, void_reason=%s, refused_by_id=%s, "
                "refusal_reason=%s WHERE id=%s")


def _columns(state: str, pk: int, refuser: int) -> list:
    """The columns a row in `state` carries (a voided row its reason, a refused row who refused and why)."""
    refused = state == "refused"
    return [state, "r" if state == "voided" else "", refuser if refused else None, "r" if refused else "", pk]


def test_every_unlisted_request_transition_is_refused(subject):
    """django-fsm and PostgreSQL both allow exactly pending -> approved | voided | refused and approved -> voided.
    Proves: issue 38 item 1"""
    world, key = subject
    req, a1, *_ = _people()
    row = approvals.approval_request(kind=KIND, subject_key=key, actor=req, **WHY)
    field = DualApprovalRequest._meta.get_field("state")
    kwargs = {"void": {"reason": "r"}, "refuse": {"by": a1.user, "reason": "r"}}
    assert {(t.source, t.target) for t in field.get_all_transitions(DualApprovalRequest)} == SEED
    assert field.protected
    for source, target in itertools.product(STATES, STATES):
        if source == target:
            continue
        reached = set()
        for t in field.get_all_transitions(DualApprovalRequest):
            instance = DualApprovalRequest(state=source)
            try:
                getattr(instance, t.name)(**kwargs.get(t.name, {}))
                reached.add(instance.state)
            except TransitionNotAllowed:
                pass
        assert (target in reached) == ((source, target) in SEED), (source, target)
        with connection.cursor() as cursor:
            dbroles.admin_on(cursor)
            cursor.execute("SET session_replication_role = replica")
            cursor.execute(UPDATE_STATE, _columns(source, row.pk, a1.user.pk))
            cursor.execute("SET session_replication_role = origin")
            dbroles.admin_off(cursor)
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(UPDATE_STATE, _columns(target, row.pk, a1.user.pk))
            ok = True
        except IntegrityError:
            ok = False
        assert ok == ((source, target) in SEED), (source, target)


@pytest.mark.django_db(transaction=True)
def test_concurrent_approvals_by_the_same_person_count_once():
    """Two sessions of the same approver approve at the same moment (separate connections): exactly one approval is
    recorded and the request stays pending; two different approvers racing approve it."""
    build_succession_world("dr-")
    key = "dr-epoch-2"
    req, a1, a2, _ = _people()
    row = approvals.approval_request(kind=KIND, subject_key=key, actor=req, **WHY)
    d = bytes(row.subject_digest)

    def race(actors):
        outcomes = run_concurrently(
            [lambda actor=actor: approvals.approval_give(request_pk=row.pk, digest_seen=d, actor=actor).state
             for actor in actors], expect=ApprovalRefused)
        return sorted(r.code if isinstance(r, ApprovalRefused) else r for r in outcomes)

    assert race([a1, a1]) == ["APPROVAL_REFUSED", "pending"]
    assert DualApproval.objects.filter(request=row).count() == 1
    assert race([a2]) == ["approved"]
    assert DualApprovalRequest.objects.get(pk=row.pk).state == ApprovalState.APPROVED


def test_a_refusal_needs_a_reason_ends_the_request_and_is_audited(subject):
    """An approver refuses a pending request with a reason: it ends `refused` (who and why on the row, one audit
    row), can no longer be approved or refused again, and `approval_require` never passes; the requester cannot
    refuse their own request, a refusal without a reason or the permission changes nothing, and a new request of
    the subject starts from zero approvals. Proves: issue 38 item 1"""
    from connector.errors import ApprovalReasonMissing
    from connector.models import AuditRecord

    world, key = subject
    req, a1, a2, aud = _people()
    with pytest.raises(ApprovalReasonMissing):
        approvals.approval_request(kind=KIND, subject_key=key, actor=req, reason=" ", evidence_ref="CHG-1")
    with pytest.raises(ApprovalReasonMissing):
        approvals.approval_request(kind=KIND, subject_key=key, actor=req, reason="why", evidence_ref="")
    assert not DualApprovalRequest.objects.exists()
    row = approvals.approval_request(kind=KIND, subject_key=key, actor=req, **WHY)
    assert (row.reason, row.evidence_ref) == (WHY["reason"], WHY["evidence_ref"])
    digest = bytes(row.subject_digest)
    approvals.approval_give(request_pk=row.pk, digest_seen=digest, actor=a1)
    with pytest.raises(ApprovalReasonMissing):
        approvals.approval_refuse(request_pk=row.pk, digest_seen=digest, reason="  ", actor=a2)
    with pytest.raises(PermissionRefused):
        approvals.approval_refuse(request_pk=row.pk, digest_seen=digest, reason="no", actor=aud)
    with pytest.raises(ApprovalRefused, match="requester"):
        approvals.approval_refuse(request_pk=row.pk, digest_seen=digest, reason="no", actor=req)
    with pytest.raises(ApprovalRefused, match="another request"):
        approvals.approval_refuse(request_pk=row.pk, digest_seen=b"\x01" * 32, reason="no", actor=a2)
    assert DualApprovalRequest.objects.get(pk=row.pk).state == "pending"
    assert not AuditRecord.objects.filter(action="dual_approval_refuse").exists()
    refused = approvals.approval_refuse(request_pk=row.pk, digest_seen=digest, reason="gate set is incomplete",
                                        actor=a2)
    row = DualApprovalRequest.objects.get(pk=row.pk)
    assert (refused.state, row.state, row.refused_by_id, row.refusal_reason) == (
        "refused", "refused", a2.user.pk, "gate set is incomplete")
    audit = AuditRecord.objects.get(action="dual_approval_refuse")
    assert (audit.entity_id, audit.actor_user_id, audit.from_state, audit.to_state, audit.reason) == (
        str(row.pk), a2.user.pk, "pending", "refused", "gate set is incomplete")
    with pytest.raises(ApprovalRefused, match="is refused"):
        approvals.approval_give(request_pk=row.pk, digest_seen=digest, actor=a2)
    with pytest.raises(ApprovalRefused, match="is refused"):
        approvals.approval_refuse(request_pk=row.pk, digest_seen=digest, reason="again", actor=a1)
    with pytest.raises(ApprovalMissing):
        approvals.approval_require(kind=KIND, subject_key=key, digest=digest)
    fresh = approvals.approval_request(kind=KIND, subject_key=key, actor=req, **WHY)
    assert fresh.pk != row.pk and fresh.state == "pending" and fresh.approvals.count() == 0
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:  # who and why, always
        cursor.execute("UPDATE connector_dualapprovalrequest SET state='refused' WHERE id=%s", [fresh.pk])
