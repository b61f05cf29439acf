"""Server-side rules of the operator screens: login everywhere, roles map to the permissions services check, a
user without the permission sees no action and a forged POST gets 403, decisions go through the services, a stale
page is refused, and dual approval needs two distinct people approving the digest they saw."""
from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from connector.actors import Actor
from tests.effects.delivery.receiver import DeliveryReceiver
from effects.models import RemoteEffect
from effects.services import worker
from effects.services.dispatch import RECONCILE_DECISIONS
from effects.services.delivery import runner, setup
from governance.reasons import REASONS, reason
from governance.roles import ROLES
from tests.effects.helpers import author

PAGES = ["/", "/queue/", "/attestations/", "/board/", "/cutover/"]


def client_for(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def _csrf(client, url) -> str:
    client.get(url)
    return client.cookies["csrftoken"].value


def test_login_is_required_everywhere(people):
    anonymous = Client()
    for url in PAGES + ["/queue/effect/1/", "/queue/delivery/1/", "/attestations/certification/1/"]:
        response = anonymous.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url
    assert client_for(people["nobody"]).get("/").status_code == 403  # signed in, but no role


def test_roles_are_groups_with_exactly_their_permissions(people):
    for name, extra in ROLES.items():
        perms = {f"{p.content_type.app_label}.{p.codename}" for p in Group.objects.get(name=name).permissions.all()}
        assert "governance.view_governance" in perms and set(extra) <= perms
        # No role may create or delete facts through the admin; `connector.add_replayrequest` is the replay
        # authorization the replay service checks (the admin never adds a ReplayRequest: read-only FactAdmin).
        assert not any(p.split(".")[1].startswith(("add_", "delete_")) for p in perms - {"connector.add_replayrequest"})
    assert not people["auditor"].has_perm("effects.reconcile_effect")
    assert people["operator"].has_perm("effects.reconcile_effect")
    assert not people["operator"].has_perm("effects.approve_certification")
    assert people["certifier"].has_perm("effects.approve_certification")
    for url in PAGES:
        assert client_for(people["auditor"]).get(url).status_code == 200, url


@pytest.fixture
def uncertain(push_world, receiver):
    acme = push_world.accounts[0]
    command = author(acme)
    receiver.default_mode = "apply_5xx"
    effect = worker.effect_dispatch_once(holder_name="h-gov", account_id=acme.pk)
    assert effect.state == "uncertain"
    return RemoteEffect.objects.get(pk=effect.pk)


def test_operator_resolves_an_uncertain_effect_and_it_leaves_the_queue(people, uncertain):
    op = client_for(people["operator"])
    url = f"/queue/effect/{uncertain.pk}/"
    assert f"Effect #{uncertain.pk}" in op.get("/queue/").content.decode()
    page = op.get(url).content.decode()
    # The operator is offered exactly the service's decisions, on the evidence (one attempt of the frozen three).
    assert "Apply resolution" in page
    offered = re.findall(r'<option value="([a-z_]+)">', page)
    assert offered == list(RECONCILE_DECISIONS) == ["remote_confirmed", "no_effect", "idempotent_repeat", "quarantine"]
    assert "<td>1 of 3</td>" in page
    token = _csrf(op, url)
    response = op.post(url, {"csrfmiddlewaretoken": token, "decision": "no_effect", "reason": "provider says no",
                             "evidence_ref": "TICKET-1", "changed_at": uncertain.changed_at.isoformat()})
    assert response.status_code == 302 and response["Location"] == "/queue/"
    uncertain = type(uncertain).objects.get(pk=uncertain.pk)
    # One attempt was sent and the frozen policy allows three: proven no effect re-prepares the effect (not the
    # terminal `no_effect`, which only an exhausted policy reaches: tests/effects/test_retry_and_reconcile.py).
    assert uncertain.state == "prepared"
    assert f'href="/queue/effect/{uncertain.pk}/"' not in op.get("/queue/").content.decode()


def test_auditor_sees_no_action_and_a_forged_post_is_403(people, uncertain):
    auditor = client_for(people["auditor"])
    url = f"/queue/effect/{uncertain.pk}/"
    page = auditor.get(url).content.decode()
    assert "Apply resolution" not in page and "not decide" in page
    token = _csrf(auditor, url)
    response = auditor.post(url, {"csrfmiddlewaretoken": token, "decision": "no_effect", "reason": "x",
                                  "evidence_ref": "y", "changed_at": uncertain.changed_at.isoformat()})
    assert response.status_code == 403
    uncertain = type(uncertain).objects.get(pk=uncertain.pk)
    assert uncertain.state == "uncertain"


def test_post_without_csrf_token_is_refused(people, uncertain):
    op = client_for(people["operator"])
    response = op.post(f"/queue/effect/{uncertain.pk}/", {"decision": "no_effect", "reason": "x",
                                                          "evidence_ref": "y"})
    assert response.status_code == 403
    uncertain = type(uncertain).objects.get(pk=uncertain.pk)
    assert uncertain.state == "uncertain"


def test_a_stale_page_is_refused_never_applied_to_the_new_state(people, uncertain):
    op = client_for(people["operator"])
    url = f"/queue/effect/{uncertain.pk}/"
    token = _csrf(op, url)
    shown = (uncertain.changed_at - timedelta(seconds=5)).isoformat()  # the page was rendered before a change
    response = op.post(url, {"csrfmiddlewaretoken": token, "decision": "no_effect", "reason": "r",
                             "evidence_ref": "e", "changed_at": shown}, follow=True)
    assert "changed since the page was shown" in response.content.decode()
    uncertain = type(uncertain).objects.get(pk=uncertain.pk)
    assert uncertain.state == "uncertain"


def test_a_decision_without_reason_or_evidence_changes_nothing(people, uncertain):
    op = client_for(people["operator"])
    url = f"/queue/effect/{uncertain.pk}/"
    token = _csrf(op, url)
    response = op.post(url, {"csrfmiddlewaretoken": token, "decision": "no_effect", "reason": "",
                             "evidence_ref": "", "changed_at": uncertain.changed_at.isoformat()}, follow=True)
    assert response.status_code == 400
    page = response.content.decode()
    assert "FORM_INVALID" in page and "reason" in page and "evidence_ref" in page
    uncertain = type(uncertain).objects.get(pk=uncertain.pk)
    assert uncertain.state == "uncertain"


@pytest.fixture
def delivery_world(db):
    from tests.effects.delivery.world import build

    receiver = DeliveryReceiver(kind="sync_batch", default="count_missing").start()
    try:
        yield build(receiver.url), receiver
    finally:
        receiver.stop()


def test_delivery_reconciliation_through_the_screen_with_stale_revision_refused(people, delivery_world):
    world, _ = delivery_world
    parent = world.plan()
    runner.drive_parent(parent.pk)
    op = parent.children.first()
    op = type(op).objects.get(pk=op.pk)
    assert op.state == "final_unknown_success_ack"
    client = client_for(people["operator"])
    url = f"/queue/delivery/{op.pk}/"
    assert f"Delivery #{op.pk}" in client.get("/queue/").content.decode()
    token = _csrf(client, url)
    stale = client.post(url, {"csrfmiddlewaretoken": token, "target": "reconciling_unknown_success_ack",
                              "reconciliation_id": "REC-1", "reason": "checking", "revision": op.revision - 1},
                        follow=True)
    assert "moved since the page was shown" in stale.content.decode()
    client.post(url, {"csrfmiddlewaretoken": token, "target": "reconciling_unknown_success_ack",
                      "reconciliation_id": "REC-1", "reason": "checking", "revision": op.revision})
    op = type(op).objects.get(pk=op.pk)
    assert op.state == "reconciling_unknown_success_ack"
    client.post(url, {"csrfmiddlewaretoken": token, "target": "final_full_eligible", "reconciliation_id": "REC-1",
                      "reason": "receiver export shows both rows",
                      "proof": '{"applied_count": %d, "source": "receiver export"}' % op.record_count,
                      "revision": op.revision})
    op = type(op).objects.get(pk=op.pk)
    assert op.state in ("final_full_eligible", "final_full_promoted") and op.acknowledgement == "SUCCEEDED"
    assert op.reconciliations.get(to_state=op.state if op.state == "final_full_eligible"
                                  else "final_full_eligible").approved_by == people["operator"]


def _platform_request(world, requester):
    return setup.certification_request(
        actor=Actor.for_user(requester), binding=world.binding, assurance_mode="platform_attested",
        handshake={"principal_id": "svc-crm-writer", "account_id": "acct-42"}, evidence_ref="handshake:p",
        valid_until=datetime.now(UTC) + timedelta(days=30))


def test_dual_approval_two_distinct_people_neither_the_requester(people, delivery_world):
    world, _ = delivery_world
    cert = _platform_request(world, people["certifier"])
    url = f"/attestations/certification/{cert.pk}/"
    requester = client_for(people["certifier"])
    assert "You requested this attestation" in requester.get(url).content.decode()
    token = _csrf(requester, url)
    digest = setup.certification_subject_digest(cert).hex()
    assert requester.post(url, {"csrfmiddlewaretoken": token, "digest": digest}, follow=True).status_code == 200
    cert = type(cert).objects.get(pk=cert.pk)
    assert cert.state == "pending_approval" and cert.approvals.count() == 0
    first = client_for(people["certifier2"])
    token = _csrf(first, url)
    first.post(url, {"csrfmiddlewaretoken": token, "digest": digest})
    again = client_for(people["certifier2"])  # a second browser session of the same person
    page = again.get(url).content.decode()
    assert "already approved" in page and ">Approve<" not in page
    token = _csrf(again, url)
    again.post(url, {"csrfmiddlewaretoken": token, "digest": digest})
    cert = type(cert).objects.get(pk=cert.pk)
    assert cert.state == "pending_approval" and cert.approvals.count() == 1
    people["approver"].groups.add(Group.objects.get(name="certifier"))
    third = client_for(people["approver"])
    token = _csrf(third, url)
    third.post(url, {"csrfmiddlewaretoken": token, "digest": digest})
    cert = type(cert).objects.get(pk=cert.pk)
    assert cert.state == "certified" and cert.approvals.count() == 2
    assert client_for(people["operator"]).post(url, {"digest": digest}).status_code == 403


def test_a_changed_subject_voids_earlier_approvals(people, delivery_world):
    """Approvals are of a digest: an approval given for the old subject does not count for a new request, and
    approving with a digest that is no longer the subject's is refused."""
    world, _ = delivery_world
    old = _platform_request(world, people["certifier"])
    digest = setup.certification_subject_digest(old)
    setup.certification_approve(actor=Actor.for_user(people["certifier2"]), certification=old, digest_seen=digest)
    new = _platform_request(world, people["certifier"])  # the subject changes: new evidence, new window
    old = type(old).objects.get(pk=old.pk)
    assert old.state == "expired" and new.state == "pending_approval" and new.approvals.count() == 0
    client = client_for(people["certifier2"])
    url = f"/attestations/certification/{new.pk}/"
    token = _csrf(client, url)
    response = client.post(url, {"csrfmiddlewaretoken": token, "digest": digest.hex()}, follow=True)
    assert "the subject changed" in response.content.decode()
    assert new.approvals.count() == 0


def test_board_groups_by_closed_reason_with_owner_deadline_and_evidence(people, uncertain):
    page = client_for(people["auditor"]).get("/board/").content.decode()
    assert "EFFECT_UNCERTAIN" in page and REASONS["EFFECT_UNCERTAIN"].owner in page and "open the rows" in page


def test_every_reason_the_product_writes_is_mapped():
    from effects.delivery.contract import contract

    written = {"EFFECT_UNCERTAIN", "OPERATOR_QUARANTINE", "CREDENTIAL_MATERIAL_MISSING", "REMOTE_LINK_CONFLICT",
               "DEPENDENCY_EXPIRED", "DEPENDENCY_REJECTED", "RESULT_FAILED", "RESULT_REJECTED", "GAP_DEADLINE",
               "EVENT_KEY_CONFLICT", "GATE_HALTED", "CREDENTIAL_REVOKED", "DELIVERY_GATE_BLOCKED",
               *contract().errors}
    assert {code for code in written if reason(code).code == "UNMAPPED"} == set()
    assert reason("SOMETHING_NEW").code == "UNMAPPED" and reason("SOMETHING_NEW").deadline == timedelta(0)


def test_a_quarantined_execution_is_queued_with_its_owner_remediation_and_no_action(people):
    """A quarantined execution waits for its owner's remediation: it is in the queue and on the board with its
    reason, and its page shows the evidence and the remediation but offers no transition (it stays immutable)."""
    from connector.models import Execution
    from connector.services import dependencies
    from tests.connector.test_dependencies import PACK, send
    from tests.connector.inbound_helpers import build_inbound_world
    from connector.models import ExecutionDependency

    world = build_inbound_world("gq-", [PACK])
    child, = send(world, "child-1", "rec-child", parent="parent-1")
    dependencies.dependency_resolve(dependency_pk=ExecutionDependency.objects.get().pk,
                                    reject_evidence="parent deleted at source")
    assert Execution.objects.get(pk=child).state == "quarantined"
    client = client_for(people["operator"])
    assert f'href="/queue/execution/{child}/"' in client.get("/queue/").content.decode()
    page = client.get(f"/queue/execution/{child}/").content.decode()
    assert "DEPENDENCY_REJECTED" in page and REASONS["DEPENDENCY_REJECTED"].owner in page
    assert "<form method=\"post\" class=\"decide\"" not in page
    assert "DEPENDENCY_REJECTED" in client_for(people["auditor"]).get("/board/").content.decode()
