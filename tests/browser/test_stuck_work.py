"""Issue 21 in a real browser: an operator opens the overview, sees a receipt that has waited past its stage's
budget in the stuck-work table with the backlog pictures and their legends, follows its link, and reads on the
receipt's page why it has not materialized and what to check."""
from __future__ import annotations

import time

from django.contrib.auth.models import Group, User

from observability.services import stage_samples_record
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import admit, build_inbound_world, webhook_body, webhook_event

PASSWORD = "correct horse battery"


def test_an_operator_follows_stuck_work_to_the_receipt_and_reads_why(browser, live_server, settings, shot):
    settings.CONNECTOR = {**settings.CONNECTOR, "STAGE_BUDGETS_SECONDS": {
        **settings.CONNECTOR["STAGE_BUDGETS_SECONDS"], "materialization_due": 1}}
    world = build_inbound_world("bs-", [PACK_A])
    receipt = admit(world, "records.webhook", webhook_body(webhook_event("ev-1", "rec-1", 1)))
    stage_samples_record()
    time.sleep(2)  # past the 1 s budget; no worker runs in this test, so the receipt stays due
    stage_samples_record()
    user = User.objects.create_user("opal", password=PASSWORD)
    user.groups.add(Group.objects.get(name="operator"))

    context = browser.new_context(viewport={"width": 1366, "height": 1400})
    page = context.new_page()
    page.goto(f"{live_server.url}/accounts/login/?next=/")
    page.get_by_label("Username").fill("opal")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{live_server.url}/")
    stuck = page.locator("#stuck")
    assert f"receipt #{receipt.pk} (materialization due)" in stuck.inner_text()
    legend = page.locator("#throughput-legend").inner_text()
    assert all(name in legend for name in ("admitted", "materialized", "completed", "effects finalized"))
    assert page.locator("svg[aria-labelledby=backlog-title] polyline").count() >= 1
    shot(page, "08-overview-stuck-work")
    stuck.get_by_role("link", name=f"receipt #{receipt.pk}", exact=False).click()
    page.wait_for_url(f"{live_server.url}/receipts/{receipt.pk}/")
    assert page.locator("#receipt-state .badge").inner_text() == "waiting"  # its code, beside its words (D-483)
    why = page.locator("#receipt-why").inner_text()
    assert "past the 1 s budget" in why and "materialize workers" in why
    shot(page, "09-receipt-why")
    context.close()
