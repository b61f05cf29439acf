"""Issue 38 item 2: every page is a path to the fact. The chain Receipt -> Event -> Projection -> Execution ->
ApplicationResult -> OutboundCommand -> RemoteEffect -> RemoteLink is linked both ways on the operator screens,
and receipts, lanes, executions and effects have lists outside the Django admin, filtered by account, state,
reason code and age, one keyset page at a time, linked from the navigation."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from bench.history_data import generate_history
from connector.demo import build_world
from connector.models import ApplicationResult, Execution, OrderingLane, Receipt
from effects.models import RemoteEffect, RemoteLink
from tests import dbroles
from tests.effects.test_remote_identity import dispatch, push


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def hrefs(html: str) -> set[str]:
    return set(re.findall(r'href="([^"#]+)', html))


def rows(html: str) -> list[str]:
    """The text of each body row of the page's (first) list table."""
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [re.sub(r"<[^>]+>", " ", r) for r in body.split("</tr>") if "<td" in r]


@pytest.fixture
def chain(push_world, receiver):
    """One record pushed twice: the create finalizes and links it; the update is addressed at the link."""
    acme = push_world.accounts[0]
    push(acme, "ch-1", 1)
    created = dispatch(acme)
    push(acme, "ch-1", 2)
    updated = dispatch(acme)
    assert (created.state, updated.state) == ("finalized", "finalized")
    execution = Execution.objects.select_related("projection__event").get(pk=created.command.source_execution_id)
    return {"account": acme, "created": created, "updated": updated, "execution": execution,
            "event": execution.projection.event, "receipt": execution.projection.event.receipt,
            "link": RemoteLink.objects.get(effect=created)}


def test_the_chain_is_linked_both_ways(people, chain):
    """From the receipt down to the RemoteLink and back up, each page links the next and the previous fact, and
    every link resolves. Proves: issue 38 item 2 (dead ends: receipt -> events, RemoteEffect <-> RemoteLink)."""
    client = signed_in(people["auditor"])
    receipt, event, execution = chain["receipt"], chain["event"], chain["execution"]
    created, updated, link = chain["created"], chain["updated"], chain["link"]
    urls = {"receipt": f"/receipts/{receipt.pk}/", "event": f"/events/{event.pk}/",
            "execution": f"/queue/execution/{execution.pk}/", "effect": f"/queue/effect/{created.pk}/",
            "link": f"/links/{link.pk}/", "update": f"/queue/effect/{updated.pk}/"}
    html = {name: page(client, url) for name, url in urls.items()}
    down = [("receipt", "event"), ("receipt", "execution"), ("event", "execution"), ("execution", "effect"),
            ("effect", "link"), ("update", "link")]
    up = [("event", "receipt"), ("execution", "event"), ("execution", "receipt"), ("effect", "execution"),
          ("effect", "receipt"), ("link", "effect"), ("link", "update")]
    for source, target in down + up:
        assert urls[target] in hrefs(html[source]), f"the {source} page does not link the {target}"
    result = ApplicationResult.objects.get(command_id=execution.command_id)
    assert f"ApplicationResult #{result.pk}" in html["execution"]
    assert f"#{created.command.pk} {created.command}" in html["execution"]  # the OutboundCommand it authored
    assert f"<code>{link.owner_slot}</code> → <code>{link.remote_identity}</code>" in html["effect"]
    assert f"Projection #{execution.projection_id}" in html["receipt"]
    for name, text in html.items():  # every link on every page resolves
        for href in hrefs(text):
            if href.startswith("/") and not href.startswith(("/admin/", "/accounts/")):
                assert client.get(href).status_code == 200, (name, href)


def test_a_lane_links_its_executions_and_each_execution_its_lane(people, db):
    """The lane page lists its newest executions and links the execution list narrowed to the lane; that list
    shows only the lane's executions. Proves: issue 38 item 2 (a lane links its executions)."""
    world = build_world("cl-")
    with dbroles.as_admin():  # bulk SQL seeding; the pages are read as the application role
        generate_history(account=world.accounts[0], epoch=world.active_epoch, start=0, count=30)
    lane = OrderingLane.objects.get(partition="hist-r1")
    other = OrderingLane.objects.get(partition="hist-r2")
    mine = list(Execution.objects.filter(lane=lane).order_by("pk").values_list("pk", flat=True))
    assert mine
    client = signed_in(people["auditor"])
    html = page(client, f"/queue/lane/{lane.pk}/")
    assert f"/executions/?lane={lane.pk}" in html
    assert {f"/queue/execution/{pk}/" for pk in mine} <= hrefs(html)
    listed = page(client, f"/executions/?lane={lane.pk}")
    assert {f"/queue/execution/{pk}/" for pk in mine} <= hrefs(listed)
    assert not {f"/queue/execution/{pk}/" for pk in Execution.objects.filter(lane=other).values_list("pk", flat=True)
                } & hrefs(listed)
    assert f"/queue/lane/{lane.pk}/" in hrefs(page(client, f"/queue/execution/{mine[0]}/"))


@pytest.fixture
def history(db):
    """Two accounts: 120 retained receipts of the first (a year old), 3 fresh ones of the second."""
    from bench.metrics_plans import recent_work

    world = build_world("lh-")
    first, second = world.accounts[0], world.accounts[1]
    with dbroles.as_admin():  # bulk SQL seeding; the pages are read as the application role
        generate_history(account=first, epoch=world.active_epoch, start=0, count=120)
    recent_work(second, n=3)
    return first, second


def test_the_lists_filter_and_page(people, history):
    """Each list is in the navigation; it shows its rows newest first with their links, narrows by account,
    state, reason code and age, and pages by keyset (50 a page, then the older ones, none twice, none lost).
    Proves: issue 38 item 2 (lists with filters and pagination)."""
    first, second = history
    client = signed_in(people["auditor"])
    nav = page(client, "/")
    for url in ("/receipts/", "/lanes/", "/executions/", "/effects/"):
        assert f'href="{url}"' in nav

    newest = page(client, "/receipts/")
    assert len(rows(newest)) == 50 and "Older →" in newest
    shown = [int(pk) for pk in re.findall(r'href="/receipts/(\d+)/"', newest)]
    assert shown == sorted(Receipt.objects.values_list("pk", flat=True), reverse=True)[:50]
    seen, url = [], "/receipts/"
    while url:
        html = page(client, url)
        seen += [int(pk) for pk in re.findall(r'href="/receipts/(\d+)/"', html)]
        found = re.search(r'href="([^"]+)" rel="next"', html)
        url = found.group(1).replace("&amp;", "&") if found else ""
    assert seen == sorted(Receipt.objects.values_list("pk", flat=True), reverse=True)  # 123: 50 + 50 + 23

    theirs = page(client, f"/receipts/?account={second.pk}")
    assert len(rows(theirs)) == 3 and all(second.account_key in r for r in rows(theirs))
    waiting = page(client, "/receipts/?state=waiting")  # the fresh ones are not materialized yet
    assert len(rows(waiting)) == 3 and all("waiting" in r for r in rows(waiting))
    assert len(rows(page(client, "/receipts/?state=materialized&older_than=1440"))) == 50
    assert "No receipt matches" in page(client, f"/receipts/?account={second.pk}&older_than=1440")
    assert "No receipt matches" in page(client, "/receipts/?reason=EVENT_KEY_CONFLICT")

    completed = page(client, "/executions/?state=completed")
    assert len(rows(completed)) == 50 and all("completed" in r for r in rows(completed))
    assert "No execution matches" in page(client, "/executions/?state=quarantined")
    assert "No execution matches" in page(client, "/executions/?reason=RESULT_FAILED")
    assert "No execution matches" in page(client, "/executions/?older_than=5&account=" + str(second.pk))

    lanes = page(client, f"/lanes/?account={first.pk}&state=open")
    assert len(rows(lanes)) == 50 and all("open" in r for r in rows(lanes))
    assert "No lane matches" in page(client, "/lanes/?state=halted")

    bad = client.get("/receipts/?account=x&older_than=3&reason=lower case")
    assert bad.status_code == 200 and "Ignored (not a valid value)" in bad.content.decode()


def test_the_effect_list_filters_by_state_and_reason(people, chain, receiver):
    """The effect list narrows by state and by reason code: a RemoteLink conflict appears under its code and state,
    the finalized pushes under theirs. Proves: issue 38 item 2 (effects by state and reason)."""
    acme = chain["account"]
    push(acme, "ch-1", 3)
    receiver.modes = ["new_identity"]
    conflict = dispatch(acme)
    assert (conflict.state, conflict.quarantine_reason) == ("remote_confirmed", "REMOTE_LINK_CONFLICT")
    client = signed_in(people["auditor"])
    coded = page(client, "/effects/?reason=REMOTE_LINK_CONFLICT")
    assert hrefs(coded) >= {f"/queue/effect/{conflict.pk}/"} and len(rows(coded)) == 1
    finalized = page(client, "/effects/?state=finalized")
    assert {f"/queue/effect/{chain['created'].pk}/", f"/queue/effect/{chain['updated'].pk}/"} <= hrefs(finalized)
    assert f"/queue/effect/{conflict.pk}/" not in hrefs(finalized)
    assert len(rows(page(client, f"/effects/?account={acme.pk}"))) == RemoteEffect.objects.filter(account=acme).count()
