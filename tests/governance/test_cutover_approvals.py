"""Dual approval of cutover subjects in the browser-facing views: who may request and approve, the requester and
a repeat approver get no button and are refused, a forged POST without the permission is 403, and a page showing a
digest the subject no longer has is refused and counts for nothing."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from connector.models import DualApproval, DualApprovalRequest
from connector.services import serving
from tests.cutover.succession_helpers import ACTOR, build_succession_world
from tests.governance.test_screens import _csrf, client_for


@pytest.fixture
def verified(db):
    return build_succession_world("ga-")


def _approver(name):
    user = User.objects.create_user(name)
    user.groups.add(Group.objects.get(name="approver"))
    return User.objects.get(pk=user.pk)


def _request(client, epoch_id):
    token = _csrf(client, "/cutover/")
    return client.post("/attestations/request/", {"csrfmiddlewaretoken": token, "kind": "activation_decision",
                                                   "subject_key": epoch_id, "reason": "rehearsal passed",
                                                   "evidence_ref": "CHG-1"}, follow=True)


def _approve(client, pk, digest):
    url = f"/attestations/approval/{pk}/"
    return client.post(url, {"csrfmiddlewaretoken": _csrf(client, url), "digest": digest}, follow=True)


def test_dual_approval_of_an_activation_decision_in_the_screens(verified, people):
    """The console offers the request; the requester and a repeat approver see no Approve button and their POSTs
    are refused; a second distinct approver approves. Proves: the dual-approval rules through the screens."""
    world = verified
    requester = client_for(people["approver"])
    console = requester.get("/cutover/").content.decode()
    assert world.successor.epoch_id in console and "Request dual approval" in console
    _request(requester, world.successor.epoch_id)
    row = DualApprovalRequest.objects.get()
    digest = bytes(row.subject_digest).hex()
    url = f"/attestations/approval/{row.pk}/"
    page = requester.get(url).content.decode()
    assert "Approve</button>" not in page and "You requested this approval" in page
    assert "APPROVAL_REFUSED" in _approve(requester, row.pk, digest).content.decode()
    first, second = client_for(_approver("b1")), client_for(_approver("b2"))
    assert "Approve</button>" in first.get(url).content.decode()
    _approve(first, row.pk, digest)
    page = first.get(url).content.decode()
    assert "Approve</button>" not in page and "You already approved it" in page
    assert "APPROVAL_REFUSED" in _approve(first, row.pk, digest).content.decode()
    _approve(second, row.pk, digest)
    assert DualApprovalRequest.objects.get(pk=row.pk).state == "approved"
    assert sorted(DualApproval.objects.values_list("approver__username", flat=True)) == ["b1", "b2"]
    listing = requester.get("/attestations/").content.decode()
    assert f"/attestations/approval/{row.pk}/" in listing and world.successor.epoch_id in listing


def test_without_the_permission_no_action_and_forged_posts_are_403(verified, people):
    world = verified
    client_for(people["approver"])
    for who in ("auditor", "operator", "certifier"):
        client = client_for(people[who])
        assert "Request dual approval</button>" not in client.get("/cutover/").content.decode()
        assert _request(client, world.successor.epoch_id).status_code == 403
    assert not DualApprovalRequest.objects.exists()
    requester = client_for(people["approver"])
    _request(requester, world.successor.epoch_id)
    row = DualApprovalRequest.objects.get()
    for who in ("auditor", "operator", "certifier"):
        client = client_for(people[who])
        assert "Approve</button>" not in client.get(f"/attestations/approval/{row.pk}/").content.decode()
        assert _approve(client, row.pk, bytes(row.subject_digest).hex()).status_code == 403
    assert not DualApproval.objects.exists()


def test_a_page_of_a_changed_subject_is_refused(verified, people):
    """The subject changes after the page was shown (the epoch was rejected): the page warns, the approval is
    refused, nothing counts; requesting again voids the old request. Proves: void-on-digest-change."""
    world = verified
    _request(client_for(people["approver"]), world.successor.epoch_id)
    row = DualApprovalRequest.objects.get()
    digest = bytes(row.subject_digest).hex()
    approver = client_for(_approver("b3"))
    url = f"/attestations/approval/{row.pk}/"
    assert "Approve</button>" in approver.get(url).content.decode()
    serving.epoch_reject(epoch_pk=world.successor.pk, reason="corrected candidate", actor=ACTOR)
    body = _approve(approver, row.pk, digest).content.decode()
    assert "subject changed since it was shown" in body
    assert not DualApproval.objects.exists()
    page = approver.get(url).content.decode()
    assert "The subject changed since this request was made" in page and "Approve</button>" not in page
    _request(client_for(people["approver"]), world.successor.epoch_id)
    assert DualApprovalRequest.objects.get(pk=row.pk).state == "voided"
