"""An approver decides with the facts in front of them, in a real browser (Playwright on Debian's Chromium against
the live server): the requester asks from the cutover console with a reason and an evidence reference, an approver
reads them on the approval page with the subject's link and its before/after, tries to refuse without a reason
(refused beside the field, nothing written), refuses with one, and the page then reads as finished."""
from __future__ import annotations

from django.contrib.auth.models import Group, User

PASSWORD = "correct horse battery"


def _user(name: str, *groups: str) -> User:
    user = User.objects.create_user(name, password=PASSWORD)
    for group in groups:
        user.groups.add(Group.objects.get(name=group))
    return user


def _login(browser, live_server, username: str):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(f"{live_server.url}/cutover/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{live_server.url}/cutover/")
    return context, page


def test_an_approver_reads_the_request_and_refuses_it_with_a_reason(browser, live_server, shot):
    """Proves: issue 38 item 1"""
    from connector.models import AuditRecord, DualApprovalRequest
    from tests.cutover.succession_helpers import build_succession_world

    world = build_succession_world("bd-")
    epoch = world.successor.epoch_id
    for name in ("alma", "abe"):
        _user(name, "approver")
    _user("oscar", "operator")
    context, page = _login(browser, live_server, "oscar")
    table = page.locator("table", has=page.get_by_text(epoch)).first.inner_text()
    assert "need the approver role" in table and "An approver requests dual approval" in table
    context.close()

    context, page = _login(browser, live_server, "alma")
    page.get_by_label("Reason for requesting").first.fill("Rehearsal passed; the successor is verified")
    page.get_by_label("Evidence reference").first.fill("CHG-2041")
    page.get_by_role("button", name="Request dual approval").first.click()
    page.wait_for_url("**/attestations/approval/*/")
    url = page.url
    context.close()

    context, page = _login(browser, live_server, "abe")
    page.goto(url)
    main = page.inner_text("main")
    assert "Rehearsal passed; the successor is verified" in main and "CHG-2041" in main and "alma" in main
    assert "Before and after" in main and f"ServingEpoch {epoch}" in main
    assert page.get_by_role("link", name=f"Cutover console: epoch {epoch}").count() == 1
    shot(page, "24-approval-context")
    page.get_by_role("button", name="Refuse").click()
    page.wait_for_selector("text=APPROVAL_REASON_MISSING")
    assert DualApprovalRequest.objects.get(subject_key=epoch).state == "pending"
    page.get_by_label("Reason for refusing").fill("The gate set misses the new account")
    page.get_by_role("button", name="Refuse").click()
    page.wait_for_selector("text=Finished: refused by abe")
    assert page.get_by_role("button", name="Approve").count() == 0
    assert page.get_by_role("button", name="Refuse").count() == 0
    shot(page, "25-approval-refused")
    context.close()
    row = DualApprovalRequest.objects.get(subject_key=epoch)
    assert (row.state, row.refusal_reason) == ("refused", "The gate set misses the new account")
    assert AuditRecord.objects.filter(action="dual_approval_refuse", entity_id=str(row.pk)).count() == 1
