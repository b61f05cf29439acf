"""The operator's ways out, tried over HTTP against the real server processes of `make run` (web, Celery worker,
beat and the demo CRM receiver, started from scripts/run.py's own commands), with signed deliveries and a real
browser (Playwright on Debian's Chromium) on the operator screens:

- one record updated five times reaches the CRM as one create and four updates of the same remote identity: five
  finalized effects, one active RemoteLink; then the CRM merges the record (a real identity change), the next
  update's effect fails closed into the approval queue, and an operator resolves it on the screen with evidence
  and two approvers: the effect finalizes and the slot is relinked;
- a strict-sequence gap halts the partition at its deadline; a resume before the missing event is refused; the
  late event arrives and an operator resumes the lane: 5, 6, 7 apply once each, in order, and the board's times
  come from the halt.

Screenshots go to test-artifacts/screens/ (the operator guide uses copies)."""
from __future__ import annotations

import json
import time

import httpx
import pytest
from django.contrib.auth.models import Group, User

from connector.models import CredentialGeneration, Execution, GapDecision, OrderingLane, Projection
from connector.secrets import secret_backend
from connector.services.signatures import sign
from effects.models import RemoteEffect, RemoteLink, RemoteLinkResolution
from governance import selectors
from tests.support import scaled, wait_for

PASSWORD = "correct horse battery"
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "journal"])


def person(name: str, *groups: str) -> User:
    user = User.objects.create_user(name, password=PASSWORD)
    for group in groups:
        user.groups.add(Group.objects.get(name=group))
    return user


def signed(product, account: str, channel: str, key: str, events: list[dict]) -> httpx.Response:
    body = json.dumps({"events": events}).encode()
    secret = secret_backend().read(CredentialGeneration.objects.get(
        generation_id=f"{account}.webhook-signing.g1").secret_version_ref)
    response = httpx.post(f"{product['url']}/api/v2/accounts/{account}/channels/{channel}/receipts", content=body,
                          headers={"Idempotency-Key": key, "Content-Type": "application/json",
                                   "Connector-Signature": sign(secret, int(time.time()), body)}, timeout=scaled(30))
    assert response.status_code == 201, response.text
    return response


def update(record: str, sequence: int, name: str) -> dict:
    return {"id": f"{record}-{sequence}", "type": "record.updated", "record_id": record, "sequence": sequence,
            "occurred_at": "2026-12-02T17:00:00Z", "data": {"name": name, "email": f"{record}@example.com"}}


def login(browser, base: str, username: str):
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.goto(f"{base}/queue/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/queue/")
    return context, page


def crm_state(product) -> dict:
    return httpx.get(f"{product['crm']}/_demo/state", timeout=scaled(10)).json()


def test_updates_address_the_linked_identity_and_a_real_identity_change_is_resolved_on_the_screen(
        product, browser, shot):
    """Proves: CV2-10-045, CV2-10-052, CV2-10-059, CV2-15-022, CV2-13-001, CV2-13-002"""
    from connector.demo import build_world

    world = build_world("hx-", push=True, sequenced=True)
    account = world.accounts[0].account_key
    person("oscar", "operator")
    person("alma", "approver")
    person("abe", "approver")
    for sequence in range(1, 6):
        signed(product, account, "records.webhook", f"upd-{sequence}", [update("cust-42", sequence, f"v{sequence}")])
        wait_for(lambda: RemoteEffect.objects.filter(state="finalized").count() == sequence, 60,
                 f"update {sequence} to be finalized")
    crm = crm_state(product)
    record, = crm["records"]
    assert (record["external_key"], record["version"], record["fields"]["display_name"]) == ("cust-42", 5, "v5")
    assert [(r["method"], r["kind"]) for r in crm["requests"]] == [("POST", "created")] + [("PATCH", "updated")] * 4
    assert {r["id"] for r in crm["requests"]} == {record["id"]}
    link = RemoteLink.objects.get()
    assert (link.owner_slot, link.remote_identity, link.state) == ("cust-42", record["id"], "active")
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {"finalized"}

    merged = httpx.post(f"{product['crm']}/_demo/merge/{record['id']}", timeout=scaled(10)).json()["id"]
    signed(product, account, "records.webhook", "upd-6", [update("cust-42", 6, "v6")])
    effect = wait_for(lambda: RemoteEffect.objects.filter(quarantine_reason="REMOTE_LINK_CONFLICT").first(), 60,
                      "the identity conflict")
    assert (effect.state, effect.remote_id) == ("remote_confirmed", merged)

    context, page = login(browser, product["url"], "oscar")
    assert "REMOTE_LINK_CONFLICT" in page.inner_text("main")
    shot(page, "15-queue-link-conflict")
    page.get_by_role("link", name=f"Effect #{effect.pk}", exact=False).click()
    page.wait_for_selector("text=RemoteLink conflict")
    shot(page, "16-link-conflict")
    page.get_by_label("Reason for relinking").fill("The CRM merged the duplicate into a new record")
    page.get_by_label("Evidence reference for relinking").fill(f"CRM audit log: merge {record['id']} -> {merged}")
    page.get_by_role("button", name="Request dual approval of the relink").click()
    page.wait_for_selector("text=Dual approval requested")
    approval_url = page.get_by_role("link", name="request #", exact=False).first.get_attribute("href")
    for approver in ("alma", "abe"):
        ctx, other = login(browser, product["url"], approver)
        other.goto(product["url"] + approval_url)
        other.get_by_role("button", name="Approve").click()
        other.wait_for_selector("text=Approval recorded")
        if approver == "abe":
            shot(other, "17-relink-approved")
        ctx.close()
    page.goto(f"{product['url']}/queue/effect/{effect.pk}/")
    page.get_by_label("Reason for relinking").fill("Approved identity change after the CRM merge")
    page.get_by_label("Evidence reference for relinking").fill("TICKET-1602")
    page.get_by_role("button", name="Apply the approved relink").click()
    page.wait_for_url(f"{product['url']}/queue/")
    assert "the slot was relinked" in page.inner_text("main")
    shot(page, "18-queue-after-relink")
    context.close()

    assert RemoteEffect.objects.get(pk=effect.pk).state == "finalized"
    assert dict(RemoteLink.objects.values_list("remote_identity", "state")) == {record["id"]: "retired",
                                                                                 merged: "active"}
    resolution = RemoteLinkResolution.objects.get(effect=effect)
    assert resolution.decision == "relink" and resolution.approval.approvals.count() == 2
    signed(product, account, "records.webhook", "upd-7", [update("cust-42", 7, "v7")])
    wait_for(lambda: RemoteEffect.objects.filter(state="finalized").count() == 7, 60, "update 7 after the relink")
    last = crm_state(product)["requests"][-1]
    assert (last["method"], last["kind"], last["id"]) == ("PATCH", "updated", merged)
    assert selectors.queue() == []


def test_a_gap_halts_at_the_deadline_and_an_operator_resumes_after_the_late_event(
        product, browser, shot, monkeypatch):
    """Proves: CV2-06-013, CV2-06-029, CV2-13-001, CV2-13-002, CV2-13-005"""
    from connector import demo

    monkeypatch.setattr(demo, "SEQUENCED_ROUTE_DEFINITION", {
        **demo.SEQUENCED_ROUTE_DEFINITION,
        "ordering": {**demo.SEQUENCED_ROUTE_DEFINITION["ordering"], "gap_deadline_seconds": 3}})
    world = demo.build_world("hg-", push=True, sequenced=True)
    account = world.accounts[0].account_key
    person("oscar", "operator")
    signed(product, account, "records.sequenced", "seq-a", [update("acct-9", s, f"v{s}") for s in (1, 2, 3, 4)])
    signed(product, account, "records.sequenced", "seq-b", [update("acct-9", 6, "v6")])
    signed(product, account, "records.sequenced", "seq-c", [update("acct-9", 7, "v7")])
    lane = wait_for(lambda: OrderingLane.objects.filter(partition="acct-9", state="halted").first(), 60,
                    "the gap deadline to halt the lane")
    assert (lane.halt_reason, lane.high_water) == ("GAP_DEADLINE", 4)
    decision = GapDecision.objects.get(lane=lane)
    item, = selectors.board()["GAP_DEADLINE"]
    assert item.since == decision.decided_at and item.since > lane.changed_at

    context, page = login(browser, product["url"], "oscar")
    page.goto(f"{product['url']}/board/")
    assert decision.decided_at.strftime("%Y-%m-%d %H:%M:%S") in page.inner_text("section:has(> #r-GAP_DEADLINE) table")
    shot(page, "19-board-gap")
    page.get_by_role("link", name=f"Lane #{lane.pk}", exact=False).first.click()
    page.wait_for_selector("text=Resume the partition")
    page.get_by_label("Remediation").select_option("missing_arrived")
    page.get_by_label("Reason").fill("Provider says it resent 5")
    page.get_by_label("Evidence reference").fill("TICKET-5")
    page.get_by_role("button", name="Resume the partition").click()
    page.wait_for_selector("text=LANE_GAP_OPEN")
    shot(page, "20-lane-resume-refused")
    assert OrderingLane.objects.get(pk=lane.pk).state == "halted"

    signed(product, account, "records.sequenced", "seq-d", [update("acct-9", 5, "v5")])
    wait_for(lambda: Projection.objects.filter(lane=lane, position=5, lane_status="pending").exists(), 60,
             "the late 5 to be materialized")
    time.sleep(6)  # a beat sweep or more passes: nothing moves on its own
    assert OrderingLane.objects.get(pk=lane.pk).state == "halted"
    page.goto(f"{product['url']}/queue/lane/{lane.pk}/")
    page.get_by_label("Remediation").select_option("missing_arrived")
    page.get_by_label("Reason").fill("Provider resent 5; it arrived")
    page.get_by_label("Evidence reference").fill("TICKET-5")
    page.get_by_role("button", name="Resume the partition").click()
    page.wait_for_selector("text=resumed (missing_arrived)")
    wait_for(lambda: OrderingLane.objects.get(pk=lane.pk).high_water == 7, 60, "5, 6, 7 to apply")
    page.reload()
    shot(page, "21-lane-resumed")
    context.close()
    done = list(Execution.objects.filter(lane=lane, state="completed").order_by("pk")
                .values_list("projection__position", flat=True))
    assert [int(p) for p in done] == [1, 2, 3, 4, 5, 6, 7]
    assert not Execution.objects.filter(lane=lane).exclude(state="completed").exists()


def test_an_operator_replays_a_failed_execution_on_its_page(browser, live_server, shot):
    """A Runtime failure quarantined an execution and halted its strict lane; the board says a replay runs; the
    operator replays it on the execution page, which answers the replay's disposition; the partition continues.
    Proves: CV2-13-003, CV2-09-017, CV2-06-014"""
    from unittest import mock

    from connector.services import runtime
    from tests.conformance.packs import PACK_B
    from tests.connector.inbound_helpers import build_inbound_world, drain
    from tests.connector.test_lane_remediation import send

    world = build_inbound_world("br-", [PACK_B])
    send(world, 1)
    drain()
    with mock.patch.object(runtime, "_apply_record", return_value="failed"):
        send(world, 2)
        drain()
    send(world, 3)
    failed = Execution.objects.get(quarantine_reason="RESULT_FAILED")
    person("oscar", "operator")
    context, page = login(browser, live_server.url, "oscar")
    page.goto(f"{live_server.url}/board/")
    assert "Replay runs" in page.inner_text("section:has(> #r-RESULT_FAILED) table")
    shot(page, "22-board-replay-runs")
    page.goto(f"{live_server.url}/queue/execution/{failed.pk}/")
    page.get_by_label("Reason").fill("Runtime's downstream is back")
    page.get_by_label("Evidence reference").fill("INC-2207")
    page.get_by_role("button", name="Replay this execution").click()
    page.wait_for_selector("text=Remedied:")
    shot(page, "23-execution-replayed")
    drain()
    assert [int(p) for p in Execution.objects.filter(state="completed").order_by("pk")
            .values_list("projection__position", flat=True)] == [1, 2, 3]
    context.close()
