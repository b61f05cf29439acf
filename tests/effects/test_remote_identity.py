"""Remote identity on real PostgreSQL with a real HTTP receiver: an update addresses the owner slot's linked
identity (the RemoteLink is the identity authority, never a pushed field), a provider that proves another
identity fails closed into the approval queue, and the conflict is resolved only by appending evidence: keep the
link, or relink with two approvers of exactly that change (D-190, D-191)."""
from __future__ import annotations

import itertools
import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.db import IntegrityError, transaction

from connector.actors import Actor
from connector.errors import ApprovalMissing, ApprovalRefused, PermissionRefused
from connector.services import approvals
from connector.services.admission import receipt_admit
from connector.services.materialize import receipt_materialize
from effects.errors import ReconcileRefused
from effects.models import OutboundCommand, RemoteEffect, RemoteLink, RemoteLinkResolution
from effects.services import identity, worker
from governance import selectors
from tests.connector.inbound_helpers import drain
from tests.dbroles import assert_append_only

_keys = itertools.count(1)


def push(account, record: str, sequence: int, **data) -> None:
    """One webhook delivery for `record` at `sequence`, run through Runtime (which authors the push)."""
    body = json.dumps({"events": [{"id": f"ev-{record}-{sequence}", "type": "record.updated", "record_id": record,
                                   "sequence": sequence, "occurred_at": "2026-01-01T00:00:00Z",
                                   "data": {"name": f"v{sequence}", "email": f"{record}@example.com", **data}}]})
    admission = receipt_admit(account_key=account.account_key, channel="records.webhook",
                              transport_key=f"ri-{next(_keys)}", body=body.encode(), actor=Actor.system("test"))
    receipt_materialize(receipt_pk=admission.receipt.pk)
    assert [e.state for e in drain()] == ["completed"]


def dispatch(account) -> RemoteEffect:
    effect = worker.effect_dispatch_once(holder_name="h-identity", account_id=account.pk)
    assert effect is not None, "nothing to dispatch"
    return RemoteEffect.objects.select_related("command").get(pk=effect.pk)


def person(name: str, *groups: str) -> User:
    user = User.objects.create_user(name, password="pw")
    for group in groups:
        user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


@pytest.fixture
def people(db):
    return {"operator": person("oscar-operator", "operator"), "approver": person("alma-approver", "approver"),
            "auditor": person("ann-auditor", "auditor")}


@pytest.fixture
def acme(push_world):
    return push_world.accounts[0]


@pytest.fixture
def conflict(acme, receiver):
    """Record r1 created and linked, then an update the provider answers with another identity."""
    push(acme, "r1", 1)
    created = dispatch(acme)
    push(acme, "r1", 2)
    receiver.modes = ["new_identity"]
    effect = dispatch(acme)
    assert (effect.state, effect.quarantine_reason) == ("remote_confirmed", "REMOTE_LINK_CONFLICT")
    return created, effect


@pytest.mark.django_db
def test_every_update_of_a_linked_record_addresses_its_remote_identity_and_finalizes(acme, receiver):
    """Five pushes of one record: the first creates it (POST to the create path) and links the slot; the next
    four are sent to the linked identity through the callout's update variant (PATCH .../by-id/<id>), the
    provider answers that same identity, and every effect finalizes; one active RemoteLink remains.
    Proves: CV2-10-045, CV2-10-052, CV2-15-022"""
    for sequence in range(1, 6):
        push(acme, "r1", sequence)
        assert dispatch(acme).state == "finalized"
    link = RemoteLink.objects.get()
    assert (link.owner_slot, link.state) == ("r1", "active")
    assert [(r["method"], r["path"]) for r in receiver.requests] == (
        [("POST", "/v1/records/r1")] + [("PATCH", f"/v1/records/by-id/{link.remote_identity}")] * 4)
    effects = list(RemoteEffect.objects.select_related("command").order_by("pk"))
    assert [e.state for e in effects] == ["finalized"] * 5
    assert [e.command.target_link_id for e in effects] == [None] + [link.pk] * 4
    assert {e.command.owner_slot for e in effects} == {"r1"}
    assert selectors.queue() == []


def author_update(acme, record: str, fields: dict, command_id: str):
    """Runtime's authoring step for one record, in an application transaction holding the serving guard."""
    from connector.demo import PUSH, ROUTE_DEFINITION
    from connector.services.guard import lock_serving
    from effects.services.runtime_bridge import author_for_runtime

    with transaction.atomic():
        ctx = lock_serving(account_id=acme.pk)
        (pk,) = author_for_runtime([dict(ctx=ctx, account_key=acme.account_key,
                                         route_definition={**ROUTE_DEFINITION, **PUSH}, command_id=command_id,
                                         record_key=record, fields=fields, suppress_external_effects=False,
                                         execution_id=None)])
        return OutboundCommand.objects.get(pk=pk)


@pytest.mark.django_db
def test_a_pushed_field_never_selects_the_remote_identity(acme, receiver):
    """Fields named like identities (`remote_id`, `id`) are pushed as data only: a record without a link is
    created at the create path, and a linked record is updated at its RemoteLink's identity, never at a field's
    value. Proves: CV2-10-059"""
    fields = {"remote_id": "evil-1", "id": "evil-2", "display_name": "Eve"}
    create = author_update(acme, "r7", fields, "cmd-a")
    assert (create.method, create.path, create.target_link_id) == ("POST", "/v1/records/r7", None)
    assert dispatch(acme).state == "finalized"
    link = RemoteLink.objects.get(owner_slot="r7")
    update = author_update(acme, "r7", fields, "cmd-b")
    assert (update.method, update.path, update.target_link_id) == (
        "PATCH", f"/v1/records/by-id/{link.remote_identity}", link.pk)
    assert json.loads(bytes(update.request_body))["remote_id"] == "evil-1"  # still pushed, as a field
    assert dispatch(acme).state == "finalized"
    assert receiver.requests[-1]["path"] == f"/v1/records/by-id/{link.remote_identity}"


@pytest.mark.django_db
def test_another_identity_fails_closed_and_waits_in_the_queue_with_its_evidence(conflict, people):
    """The provider answers an update with another identity: nothing is linked, the effect stays
    `remote_confirmed` (nonterminal) with REMOTE_LINK_CONFLICT, the sweep never retries it, and it is in the
    approval queue with its owner, deadline, action and evidence. Proves: CV2-10-059, CV2-13-001"""
    created, effect = conflict
    assert list(RemoteLink.objects.values_list("remote_identity", "state")) == [(created.remote_id, "active")]
    assert worker.effects_sweep()["finalized"] == 0
    item, = [i for i in selectors.queue() if i.kind == "effect"]
    assert (item.pk, item.code, item.state) == (effect.pk, "REMOTE_LINK_CONFLICT", "remote_confirmed")
    assert item.reason.owner == "integration on-call" and item.remedy.kind == "resolve_link"
    assert item.since == effect.changed_at and item.decide_url == f"/queue/effect/{effect.pk}/"


@pytest.mark.django_db
def test_keep_link_appends_evidence_and_finalizes_without_a_new_link(conflict, people):
    """`keep_link` with evidence finalizes the effect and leaves the links as they are; a stale page, a missing
    evidence or a user without the permission changes nothing. Proves: CV2-13-002, CV2-13-004, CV2-10-027"""
    created, effect = conflict
    operator = Actor.for_user(people["operator"])
    with pytest.raises(ReconcileRefused, match="changed since the page was shown"):
        identity.effect_link_keep(effect_pk=effect.pk, evidence="provider console", actor=operator,
                                  expected_changed_at=effect.changed_at - timedelta(seconds=1))
    with pytest.raises(ReconcileRefused, match="evidence"):
        identity.effect_link_keep(effect_pk=effect.pk, evidence=" ", actor=operator,
                                  expected_changed_at=effect.changed_at)
    with pytest.raises(PermissionRefused):
        identity.effect_link_keep(effect_pk=effect.pk, evidence="x", actor=Actor.for_user(people["auditor"]),
                                  expected_changed_at=effect.changed_at)
    assert RemoteEffect.objects.get(pk=effect.pk).state == "remote_confirmed"
    done = identity.effect_link_keep(effect_pk=effect.pk, evidence="CRM shows v2 on the linked record [TICKET-7]",
                                     actor=operator, expected_changed_at=effect.changed_at)
    assert done.state == "finalized"
    resolution = RemoteLinkResolution.objects.get(effect=effect)
    assert (resolution.decision, resolution.kept_link.remote_identity, resolution.proven_identity) == (
        "keep_link", created.remote_id, effect.remote_id)
    assert list(RemoteLink.objects.values_list("remote_identity", "state")) == [(created.remote_id, "active")]
    assert selectors.queue() == []
    with pytest.raises(ReconcileRefused):  # a terminal fact is never reopened
        identity.effect_link_keep(effect_pk=effect.pk, evidence="again", actor=operator,
                                  expected_changed_at=done.changed_at)


@pytest.mark.django_db
def test_a_relink_needs_two_approvers_of_exactly_that_identity_change(conflict, people):
    """Relinking changes an identity: it needs an approved dual approval of the current subject (the effect and
    the links it retires), by two approvers other than the requester. Without it the apply is APPROVAL_MISSING;
    with it the old link is retired, the slot links to the proven identity, the resolution names the approval
    and the effect finalizes. Proves: CV2-13-002, CV2-15-022, CV2-10-044"""
    created, effect = conflict
    operator = Actor.for_user(people["operator"])
    with pytest.raises(ApprovalMissing):
        identity.effect_relink_apply(effect_pk=effect.pk, evidence="merged", actor=operator,
                                     expected_changed_at=effect.changed_at)
    request = identity.effect_relink_request(effect_pk=effect.pk, reason="CRM merged crm record",
                                             evidence_ref="T-9", actor=operator,
                                             expected_changed_at=effect.changed_at)
    assert request.kind == "remote_identity_change" and effect.remote_id in request.summary
    second = person("abe-approver", "approver")
    approvals.approval_give(request_pk=request.pk, digest_seen=bytes(request.subject_digest),
                            actor=Actor.for_user(people["approver"]))
    with pytest.raises(ApprovalMissing):  # one approval is not two
        identity.effect_relink_apply(effect_pk=effect.pk, evidence="merged", actor=operator,
                                     expected_changed_at=effect.changed_at)
    with pytest.raises(ApprovalRefused):
        approvals.approval_give(request_pk=request.pk, digest_seen=bytes(request.subject_digest),
                                actor=Actor.for_user(people["approver"]))
    approvals.approval_give(request_pk=request.pk, digest_seen=bytes(request.subject_digest),
                            actor=Actor.for_user(second))
    done = identity.effect_relink_apply(effect_pk=effect.pk, evidence="CRM merged the record [T-9]", actor=operator,
                                        expected_changed_at=effect.changed_at)
    assert done.state == "finalized"
    links = dict(RemoteLink.objects.values_list("remote_identity", "state"))
    assert links == {created.remote_id: "retired", effect.remote_id: "active"}
    resolution = RemoteLinkResolution.objects.get(effect=effect)
    assert (resolution.decision, resolution.approval_id, resolution.new_link.remote_identity) == (
        "relink", request.pk, effect.remote_id)
    assert resolution.retired_links == [created.links.get().pk]


@pytest.mark.django_db
def test_an_approval_of_a_changed_subject_does_not_count(conflict, people, acme, receiver):
    """Approvals are of a digest: once the links the relink would retire change (another conflict is resolved
    first, say), the approved digest is no longer the subject's and the apply is APPROVAL_MISSING."""
    created, effect = conflict
    operator = Actor.for_user(people["operator"])
    request = identity.effect_relink_request(effect_pk=effect.pk, reason="merged", evidence_ref="T-1",
                                             actor=operator, expected_changed_at=effect.changed_at)
    for approver in (people["approver"], person("abe-approver", "approver")):
        approvals.approval_give(request_pk=request.pk, digest_seen=bytes(request.subject_digest),
                                actor=Actor.for_user(approver))
    link = RemoteLink.objects.get(state="active")
    link.retire(at=link.created_at)  # the slot's link changed meanwhile (through its owner)
    link.save()
    with pytest.raises(ApprovalMissing):
        identity.effect_relink_apply(effect_pk=effect.pk, evidence="merged", actor=operator,
                                     expected_changed_at=effect.changed_at)
    assert RemoteEffect.objects.get(pk=effect.pk).state == "remote_confirmed"


@pytest.mark.django_db
def test_postgres_keeps_link_resolutions_append_only_and_a_relink_approved(conflict, people):
    """Around the services: a resolution row cannot be updated or deleted, and a relink row without an approval
    and a new link is refused by its CHECK. Proves: CV2-13-004"""
    created, effect = conflict
    identity.effect_link_keep(effect_pk=effect.pk, evidence="kept [T-2]", actor=Actor.for_user(people["operator"]),
                              expected_changed_at=effect.changed_at)
    resolution = RemoteLinkResolution.objects.get()
    assert_append_only("effects_remotelinkresolution", resolution.pk, "effects_remotelinkresolution_append_only")
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        RemoteLinkResolution.objects.create(effect=created, decision="relink", owner_slot="r1",
                                            proven_identity="x", evidence="no approval", decided_by="user:x")
    assert info.value.__cause__.diag.constraint_name == "effects_linkresolution_relink_is_approved"
