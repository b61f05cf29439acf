"""Approvers decide with the facts in front of them (issue 38): the delivery page's five axes, the approval page's
subject, before/after, requester's reason and evidence, a refusal that needs a reason and ends the request, a
finished relink that reads as finished, every request kind filed where the attestations screen says, and the
cutover console's request form with a reason and evidence and words for who may act."""
from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User

from tests.governance.test_remediation_screens import conflict, post  # noqa: F401  (fixture)
from tests.governance.test_screens import client_for, delivery_world  # noqa: F401  (fixture)


def _approver(name):
    user = User.objects.create_user(name)
    user.groups.add(Group.objects.get(name="approver"))
    return User.objects.get(pk=user.pk)


def test_the_delivery_page_shows_the_five_axes(people, delivery_world):  # noqa: F811
    """The "Five axes" table has its five names and, under them, five values (the values row was empty: the view
    handed the template a zip iterator, and the second loop over it found nothing). Proves: issue 38 item 1"""
    from effects.delivery.contract import contract
    from effects.services.delivery import runner

    world, _ = delivery_world
    parent = world.plan()
    runner.drive_parent(parent.pk)
    op = parent.children.first()
    op = type(op).objects.get(pk=op.pk)
    page = client_for(people["auditor"]).get(f"/queue/delivery/{op.pk}/").content.decode()
    axes = page.split("<h2>Five axes</h2>", 1)[1].split("</table>", 1)[0]
    assert "<tr></tr>" not in axes
    values = re.findall(r'<td><span class="state" title="[^"]*"><span class="badge">([^<]*)</span> [^<]+</span></td>',
                        axes)
    assert values == [str(v) for v in contract().tuples[op.state]] and len(values) == 5


@pytest.fixture
def relink_request(people, conflict):
    """A RemoteLink conflict whose relink the operator asked two approvers for, with a reason and evidence."""
    from connector.actors import Actor
    from effects.services import identity

    request = identity.effect_relink_request(effect_pk=conflict.pk, reason="The CRM merged the duplicate record",
                                             evidence_ref="CRM audit log T-77",
                                             actor=Actor.for_user(people["operator"]),
                                             expected_changed_at=conflict.changed_at)
    return conflict, request


def _approve(client, pk, digest):
    return post(client, f"/attestations/approval/{pk}/", digest=digest)


def _refuse(client, pk, digest, reason):
    return post(client, f"/attestations/approval/{pk}/", digest=digest, action="refuse", reason=reason)


def test_the_approval_page_shows_what_is_approved(people, relink_request):
    """An approver sees, before deciding, the change in words, a link to the effect, the requester with reason and
    evidence reference, the before/after of the identity change, the digest short with the full value, and both
    actions. Proves: issue 38 item 1"""
    effect, request = relink_request
    digest = bytes(request.subject_digest).hex()
    page = client_for(_approver("abe")).get(f"/attestations/approval/{request.pk}/").content.decode()
    assert "The CRM merged the duplicate record" in page and "CRM audit log T-77" in page
    assert people["operator"].username in page
    assert f'href="/queue/effect/{effect.pk}/"' in page
    before_after = page.split("<h2>Before and after</h2>", 1)[1].split("</table>", 1)[0]
    old = effect.links.model.objects.get(state="active")
    assert old.remote_identity in before_after and effect.remote_id in before_after and "finalized" in before_after
    assert f'title="{digest}">{digest[:12]}…</code>' in page and f'data-copy="{digest}"' in page  # D-484
    assert "Approve</button>" in page and "Refuse</button>" in page and 'name="reason"' in page


def test_a_refusal_needs_a_reason_is_audited_and_ends_the_request(people, relink_request):
    """A refusal without a reason is refused on the page with nothing written; with a reason the request ends
    `refused` with one audit row, reads as finished, and can no longer be approved (nor refused again); the
    requester is offered neither action and a forged refusal is refused. Proves: issue 38 item 1"""
    from connector.models import AuditRecord, DualApprovalRequest

    effect, request = relink_request
    digest = bytes(request.subject_digest).hex()
    requester = client_for(people["operator"])
    assert _refuse(requester, request.pk, digest, "mine").status_code == 403  # the operator is no approver
    alma, abe = client_for(people["approver"]), client_for(_approver("abe"))
    _approve(alma, request.pk, digest)
    blank = _refuse(abe, request.pk, digest, "   ")
    assert blank.status_code == 400 and "APPROVAL_REASON_MISSING" in blank.content.decode()
    assert DualApprovalRequest.objects.get(pk=request.pk).state == "pending"
    assert not AuditRecord.objects.filter(action="dual_approval_refuse").exists()
    done = _refuse(abe, request.pk, digest, "The merge ticket names another record").content.decode()
    assert "Refused: request" in done
    row = DualApprovalRequest.objects.get(pk=request.pk)
    assert (row.state, row.refused_by.username, row.refusal_reason) == (
        "refused", "abe", "The merge ticket names another record")
    audit = AuditRecord.objects.get(action="dual_approval_refuse")
    assert (audit.entity_id, audit.to_state, audit.reason) == (str(row.pk), "refused",
                                                               "The merge ticket names another record")
    ada = client_for(_approver("ada"))
    page = ada.get(f"/attestations/approval/{row.pk}/").content.decode()
    assert "Finished: refused by abe" in page and "The merge ticket names another record" in page
    assert "Approve</button>" not in page and "Refuse</button>" not in page
    assert 'role="alert"' not in page and "The subject changed since" not in page
    late = _approve(ada, row.pk, digest).content.decode()
    assert "APPROVAL_REFUSED" in late and "the request is refused" in late
    assert DualApprovalRequest.objects.get(pk=row.pk).state == "refused" and row.approvals.count() == 1
    assert "APPROVAL_REFUSED" in _refuse(alma, row.pk, digest, "again").content.decode()
    effect_page = requester.get(f"/queue/effect/{effect.pk}/").content.decode()
    assert f"request #{row.pk}</a>, was refused by abe: The merge ticket names another record" in effect_page
    assert "Request dual approval of the relink" in effect_page  # what comes next: a new request


def test_four_eyes_still_holds_on_the_approval_page(people, relink_request):
    """The requester cannot approve, one person approves once, the second approval needs a different approver:
    the rules are unchanged by the refusal action. Proves: issue 38 item 1"""
    from connector.models import DualApprovalRequest

    effect, request = relink_request
    digest = bytes(request.subject_digest).hex()
    operator_with_approval = people["operator"]
    operator_with_approval.groups.add(Group.objects.get(name="approver"))
    requester = client_for(User.objects.get(pk=operator_with_approval.pk))
    page = requester.get(f"/attestations/approval/{request.pk}/").content.decode()
    assert "Approve</button>" not in page and "Refuse</button>" not in page
    assert "APPROVAL_REFUSED" in _approve(requester, request.pk, digest).content.decode()
    assert "APPROVAL_REFUSED" in _refuse(requester, request.pk, digest, "withdrawn").content.decode()
    alma = client_for(people["approver"])
    _approve(alma, request.pk, digest)
    assert "already approved" in _approve(alma, request.pk, digest).content.decode()
    assert DualApprovalRequest.objects.get(pk=request.pk).state == "pending"
    _approve(client_for(_approver("abe")), request.pk, digest)
    assert DualApprovalRequest.objects.get(pk=request.pk).state == "approved"


def test_an_applied_relink_reads_as_finished(people, relink_request):
    """Once the relink is applied its subject (the effect, the links) changed, as the relink meant it to: the
    approval page says what was applied, shows the before/after as applied, and no longer warns that the approvals
    count for nothing. Proves: issue 38 item 1"""
    effect, request = relink_request
    digest = bytes(request.subject_digest).hex()
    _approve(client_for(people["approver"]), request.pk, digest)
    _approve(client_for(_approver("abe")), request.pk, digest)
    applied = post(client_for(people["operator"]), f"/queue/effect/{effect.pk}/link/", action="relink_apply",
                   reason="approved identity change", evidence_ref="T-78", changed_at=effect.changed_at.isoformat())
    assert "the slot was relinked" in applied.content.decode()
    page = client_for(people["auditor"]).get(f"/attestations/approval/{request.pk}/").content.decode()
    assert "The subject changed since this request was made" not in page and 'role="alert"' not in page
    assert "Finished. Applied by" in page and f"effect #{effect.pk} finalized" in page
    assert "As applied" in page and effect.remote_id in page.split("<h2>Before and after</h2>", 1)[1]


def test_every_request_kind_is_filed_where_the_screen_says(people, relink_request):
    """A pending relink request waits under "Waiting for approvers" (the top table no longer says nothing waits),
    and once decided it is filed under the relinks, not under the cutover subjects. Proves: issue 38 item 1"""
    effect, request = relink_request
    auditor = client_for(people["auditor"])
    link = f'href="/attestations/approval/{request.pk}/"'

    def section(page, title):
        return page.split(f"<h2>{title}</h2>", 1)[1].split("</table>", 1)[0]

    page = auditor.get("/attestations/").content.decode()
    assert link in section(page, "Waiting for approvers") and "Nothing waits" not in page
    assert link not in section(page, "Cutover subjects, decided")
    assert "1</div>attestations awaiting approvers" in auditor.get("/").content.decode().replace("\n", "")
    _refuse(client_for(people["approver"]), request.pk, bytes(request.subject_digest).hex(), "wrong record")
    page = auditor.get("/attestations/").content.decode()
    assert link in section(page, "Remote identity changes (relinks), decided")
    assert link not in section(page, "Waiting for approvers") and link not in section(page, "Cutover subjects, decided")
    assert "Nothing waits for approvers." in page


def test_the_console_asks_for_a_reason_and_says_who_may_act(people):
    """The cutover console offers an approver a request form with a reason and an evidence reference (a request
    without them is refused beside the form, with what was typed kept, and nothing is written); a user without
    the role reads who may act and what comes next instead of "—". Proves: issue 38 item 1"""
    from connector.models import DualApprovalRequest
    from tests.cutover.succession_helpers import build_succession_world

    world = build_succession_world("gc-")
    epoch = world.successor.epoch_id
    alma = client_for(people["approver"])
    page = alma.get("/cutover/").content.decode()
    assert 'name="reason"' in page and 'name="evidence_ref"' in page and "Request dual approval</button>" in page
    refused = post(alma, "/attestations/request/", kind="activation_decision", subject_key=epoch,
                   reason="rehearsal passed", evidence_ref="")
    body = refused.content.decode()
    assert refused.status_code == 400 and "APPROVAL_REASON_MISSING" in body and ">rehearsal passed</textarea>" in body
    assert not DualApprovalRequest.objects.exists()
    post(alma, "/attestations/request/", kind="activation_decision", subject_key=epoch,
         reason="rehearsal passed", evidence_ref="CHG-2041")
    row = DualApprovalRequest.objects.get()
    assert (row.reason, row.evidence_ref, row.requested_by_id) == ("rehearsal passed", "CHG-2041",
                                                                   people["approver"].pk)
    oscar = client_for(people["operator"]).get("/cutover/").content.decode()
    table = oscar.split("<h2>Activation decisions awaiting dual approval</h2>", 1)[1].split("</table>", 1)[0]
    assert "Request dual approval</button>" not in table and "<td>—</td>" not in table
    assert "need the approver role" in table and people["approver"].username in table
    assert f"Waiting for approvers other than {people['approver'].username}: 0 of 2 given" in table


def test_the_attestation_page_shows_what_is_certified(people, delivery_world):  # noqa: F811
    """A receiver certification's approval page shows the identity it certifies in words, a link to the receiver
    binding, the requester with the evidence reference, the binding's certified identity before and after, and the
    digest short with the full value. Proves: issue 38 item 1"""
    from tests.governance.test_screens import _platform_request

    world, _ = delivery_world
    cert = _platform_request(world, people["certifier"])
    page = client_for(people["certifier2"]).get(f"/attestations/certification/{cert.pk}/").content.decode()
    assert f"/admin/effects/receiverbinding/{world.binding.pk}/change/" in page
    assert "handshake:p" in page and people["certifier"].username in page
    before_after = page.split("<h2>Before and after</h2>", 1)[1].split("</table>", 1)[0]
    assert "Certified remote identity" in before_after and "principal svc-crm-writer" in before_after
    digest = page.split('name="digest" value="', 1)[1].split('"', 1)[0]
    assert f'title="{digest}">{digest[:12]}…</code>' in page and f'data-copy="{digest}"' in page  # D-484


def test_a_certification_can_be_refused_with_a_reason(people, delivery_world):  # noqa: F811
    """A certifier refuses a pending platform attestation: without a reason nothing changes (the typed page comes
    back with the error); with one it ends `refused` with who and why and one audit row, reads as finished, cannot
    be approved afterwards, and is not expired by the recertification sweep; the requester is offered neither
    action. Proves: issue 38 item 1"""
    from connector.models import AuditRecord
    from effects.services.delivery import setup
    from tests.governance.test_screens import _platform_request

    world, _ = delivery_world
    cert = _platform_request(world, people["certifier"])
    url = f"/attestations/certification/{cert.pk}/"
    digest = setup.certification_subject_digest(cert).hex()
    requester = client_for(people["certifier"]).get(url).content.decode()
    assert "Approve</button>" not in requester and "Refuse</button>" not in requester
    cora = client_for(people["certifier2"])
    blank = post(cora, url, digest=digest, action="refuse", reason=" ")
    assert blank.status_code == 400 and "APPROVAL_REASON_MISSING" in blank.content.decode()
    assert type(cert).objects.get(pk=cert.pk).state == "pending_approval"
    done = post(cora, url, digest=digest, action="refuse", reason="The handshake names another principal")
    assert "Finished: refused by cora-certifier" in done.content.decode()
    cert = type(cert).objects.get(pk=cert.pk)
    assert (cert.state, cert.refused_by_id, cert.refusal_reason) == (
        "refused", people["certifier2"].pk, "The handshake names another principal")
    assert AuditRecord.objects.filter(action="delivery_certification_refuse", entity_id=str(cert.pk),
                                      to_state="refused").count() == 1
    people["approver"].groups.add(Group.objects.get(name="certifier"))
    late = post(client_for(User.objects.get(pk=people["approver"].pk)), url, digest=digest)
    assert "certification is refused" in late.content.decode()
    assert type(cert).objects.get(pk=cert.pk).state == "refused" and cert.approvals.count() == 0
    from datetime import timedelta

    setup.certification_expire_due(now=cert.valid_until + timedelta(seconds=1))
    assert type(cert).objects.get(pk=cert.pk).state == "refused"
