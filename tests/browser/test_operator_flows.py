"""An operator's day in a real browser: sign in, open an uncertain effect, read its evidence, approve a proven
no_effect resolution, see it leave the queue; dual approval across sessions; a stale page refused; a user
without the permission sees no action and a forged POST gets 403."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group, User

from connector.actors import Actor
from effects.models import ReceiverCertification, RemoteEffect
from effects.services import worker
from effects.services.delivery import setup
from tests.effects.helpers import author
from tests.effects.receiver import Receiver
from tests.support import whole_seconds

PASSWORD = "correct horse battery"


def _user(name: str, *groups: str) -> User:
    user = User.objects.create_user(name, password=PASSWORD)
    for group in groups:
        user.groups.add(Group.objects.get(name=group))
    return user


def _login(browser, live_server, username: str):
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.goto(f"{live_server.url}/queue/")
    assert "/accounts/login/" in page.url  # login required
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{live_server.url}/queue/")
    return context, page


@pytest.fixture
def uncertain_effect(settings):
    from connector.demo import build_world

    receiver = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR,
                          "EGRESS_BASE_URL": receiver.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(1)}
    try:
        world = build_world("b-", push=True)
        acme = world.accounts[0]
        author(acme)
        receiver.default_mode = "apply_5xx"
        effect = worker.effect_dispatch_once(holder_name="h-browser", account_id=acme.pk)
        assert effect.state == "uncertain"
        yield RemoteEffect.objects.get(pk=effect.pk)
    finally:
        receiver.stop()


def test_operator_resolves_an_uncertain_effect_and_it_leaves_the_queue(browser, live_server, uncertain_effect,
                                                                       shot):
    _user("oscar", "operator")
    context, page = _login(browser, live_server, "oscar")
    shot(page, "01-queue")
    page.get_by_role("link", name=f"Effect #{uncertain_effect.pk}", exact=False).click()
    page.wait_for_selector("text=Evidence: attempts")
    assert "500" in page.inner_text("table >> nth=1")  # the receiver's answer is in front of the operator
    shot(page, "02-effect-evidence")
    page.get_by_label("Resolution").select_option("no_effect")
    page.get_by_label("Reason").fill("Provider console shows no record for this key")
    page.get_by_label("Evidence reference").fill("TICKET-4711")
    page.get_by_role("button", name="Apply resolution").click()
    page.wait_for_url(f"{live_server.url}/queue/")
    assert "no_effect recorded" in page.inner_text("main")
    assert page.locator(f'a[href="/queue/effect/{uncertain_effect.pk}/"]').count() == 0
    shot(page, "03-queue-after")
    # One attempt sent of the frozen three: proven no effect re-prepares the effect for another attempt.
    assert RemoteEffect.objects.get(pk=uncertain_effect.pk).state == "prepared"
    for path, name in (("/", "04-overview"), ("/board/", "05-board"), ("/cutover/", "06-cutover")):
        page.goto(live_server.url + path)
        shot(page, name)
    context.close()


def test_a_stale_page_is_refused(browser, live_server, uncertain_effect):
    _user("oscar", "operator")
    _user("olga", "operator")
    first, page_a = _login(browser, live_server, "oscar")
    second, page_b = _login(browser, live_server, "olga")
    url = f"{live_server.url}/queue/effect/{uncertain_effect.pk}/"
    page_a.goto(url)
    page_b.goto(url)
    page_b.get_by_label("Resolution").select_option("quarantine")
    page_b.get_by_label("Reason").fill("holding for the provider")
    page_b.get_by_label("Evidence reference").fill("INC-1")
    page_b.get_by_role("button", name="Apply resolution").click()
    page_b.wait_for_url(f"{live_server.url}/queue/")
    page_a.get_by_label("Resolution").select_option("no_effect")
    page_a.get_by_label("Reason").fill("provider says nothing arrived")
    page_a.get_by_label("Evidence reference").fill("TICKET-1")
    page_a.get_by_role("button", name="Apply resolution").click()
    assert "changed since the page was shown" in page_a.inner_text("main")
    assert RemoteEffect.objects.get(pk=uncertain_effect.pk).state == "quarantined"
    first.close()
    second.close()


def test_without_the_permission_no_action_and_forged_post_is_403(browser, live_server, uncertain_effect, shot):
    _user("ann", "auditor")
    context, page = _login(browser, live_server, "ann")
    page.goto(f"{live_server.url}/queue/effect/{uncertain_effect.pk}/")
    assert page.get_by_role("button", name="Apply resolution").count() == 0
    assert "not decide" in page.inner_text("main")
    shot(page, "07-auditor-view")
    token = next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(f"{live_server.url}/queue/effect/{uncertain_effect.pk}/", form={
        "csrfmiddlewaretoken": token, "decision": "no_effect", "reason": "forged", "evidence_ref": "x",
        "changed_at": uncertain_effect.changed_at.isoformat()}, headers={"Referer": page.url})
    assert response.status == 403
    assert RemoteEffect.objects.get(pk=uncertain_effect.pk).state == "uncertain"
    context.close()


@pytest.fixture
def pending_attestation():
    from tests.effects.delivery.world import build

    world = build("http://127.0.0.1:9")
    requester = _user("cid", "certifier")
    cert = setup.certification_request(
        actor=Actor.for_user(requester), binding=world.binding, assurance_mode="platform_attested",
        handshake={"principal_id": "svc-crm-writer", "account_id": "acct-42"}, evidence_ref="handshake:browser",
        valid_until=datetime.now(UTC) + timedelta(days=30))
    return cert


def test_dual_approval_needs_a_different_second_approver(browser, live_server, pending_attestation, shot):
    _user("cora", "certifier")
    _user("carl", "certifier")
    url = f"{live_server.url}/attestations/certification/{pending_attestation.pk}/"
    first, page = _login(browser, live_server, "cora")
    page.goto(f"{live_server.url}/attestations/")
    shot(page, "08-attestations")
    page.goto(url)
    shot(page, "09-attestation")
    page.get_by_role("button", name="Approve").click()
    page.wait_for_url(f"{live_server.url}/attestations/")
    again, page2 = _login(browser, live_server, "cora")  # a second browser session of the same person
    page2.goto(url)
    assert page2.get_by_role("button", name="Approve").count() == 0
    assert "already approved" in page2.inner_text("main")
    assert ReceiverCertification.objects.get(pk=pending_attestation.pk).state == "pending_approval"
    other, page3 = _login(browser, live_server, "carl")
    page3.goto(url)
    page3.get_by_role("button", name="Approve").click()
    page3.wait_for_url(f"{live_server.url}/attestations/")
    assert ReceiverCertification.objects.get(pk=pending_attestation.pk).state == "certified"
    for context in (first, again, other):
        context.close()


def test_approver_runs_a_successor_activation_from_the_cutover_console(browser, live_server, shot):
    """The cutover console in a browser: the approver opens the successor activation, sees each phase with its
    receipts, and takes the offered action of each phase in turn until every phase is done."""
    from cutover.services import succession
    from tests.connector.inbound_helpers import drain
    from tests.cutover.succession_helpers import ACTOR, build_succession_world, send

    world = build_succession_world("bc-")
    send(world, "evt-1", 1)
    drain()
    row = succession.barrier_set_acquire(predecessor_epoch_id=world.epoch.epoch_id,
                                         successor_epoch_id=world.successor.epoch_id, holder="console", actor=ACTOR)
    _user("alma", "approver")
    context, page = _login(browser, live_server, "alma")
    page.goto(f"{live_server.url}/cutover/")
    shot(page, "10-cutover-console")
    page.get_by_role("link", name=f"#{row.pk}").click()
    page.wait_for_url(f"**/cutover/succession/{row.pk}/")
    shot(page, "11-succession-phases")
    for label in ("Reread the owners and hold the barriers", "Close new roots and drain", "Halt every gate",
                  "Freeze the remaining lanes", "Activate the successor"):
        page.get_by_role("button", name=label, exact=False).click()
        page.wait_for_load_state()
        assert page.locator(".msg.error").count() == 0, page.locator(".msg.error").inner_text()
    assert page.get_by_text("Every phase is done").is_visible()
    shot(page, "12-succession-done")
    context.close()


def test_activation_decision_needs_two_approvers_other_than_the_requester(browser, live_server, shot):
    """Dual approval of a cutover subject in the browser: the requester asks from the cutover console and gets no
    Approve button; a second session of the first approver cannot approve twice; a different approver completes it."""
    from connector.models import DualApprovalRequest
    from tests.cutover.succession_helpers import build_succession_world

    world = build_succession_world("ba-")
    for name in ("alma", "abe", "ada"):
        _user(name, "approver")
    context, page = _login(browser, live_server, "alma")
    page.goto(f"{live_server.url}/cutover/")
    page.get_by_label("Reason for requesting").first.fill("Rehearsal passed; the successor is verified")
    page.get_by_label("Evidence reference").first.fill("CHG-2041")
    page.get_by_role("button", name="Request dual approval").first.click()
    page.wait_for_url("**/attestations/approval/*/")
    assert page.get_by_role("button", name="Approve").count() == 0
    url = page.url
    context2, page2 = _login(browser, live_server, "abe")
    page2.goto(url)
    shot(page2, "13-cutover-approval")
    page2.get_by_role("button", name="Approve").click()
    page2.wait_for_load_state()
    context3, page3 = _login(browser, live_server, "abe")  # a second browser session of the same approver
    page3.goto(url)
    assert page3.get_by_role("button", name="Approve").count() == 0
    context4, page4 = _login(browser, live_server, "ada")
    page4.goto(url)
    page4.get_by_role("button", name="Approve").click()
    page4.wait_for_load_state()
    assert DualApprovalRequest.objects.get(subject_key=world.successor.epoch_id).state == "approved"
    shot(page4, "14-cutover-approved")
    for c in (context, context2, context3, context4):
        c.close()
