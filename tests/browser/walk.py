"""The walk of every operator screen as every demo role (issue 38 item 7), shared by the browser test
(tests/browser/test_every_screen.py, part of `make test`) and `make screenshots` (the same test with SCREENSHOT_DIR
set, which writes one PNG per screen into docs/operator-guide/).

The world is the demo world of `manage.py demo_load` (its people, one per role, with one password) plus, built
through the services, one of each object kind a screen shows: a receipt whose record was pushed and linked, a
RemoteLink conflict requested as a relink set, an uncertain effect waiting in the queue, a strict lane halted by its gap deadline, a pending platform-attested
certification, the REST delivery demo, an activation decision's dual-approval request, a successor activation and a
service cutover opened from V1.

Each role gets one browser context; the crawl starts at the navigation's screens and follows every governance link
(one page per URL shape: ids become N, the query is dropped). On every page: the answer is 200 (or an intended
refusal page), no table row is empty, no sub-resource answers 4xx/5xx, axe-core finds no serious or critical
violation, and every same-origin link on the page answers below 400 (each distinct URL asked once per role)."""
from __future__ import annotations

import io
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock
from urllib.parse import urldefrag, urlsplit

PASSWORD = "demo-walk-password-1"
# The demo people (connector/management/commands/demo_load.py), one per role; `operator` is the superuser that
# `make run` prints. The first role listed that sees a screen is the one its screenshot shows.
PEOPLE = {"oscar": "operator", "alma": "approver", "cid": "certifier", "ann": "auditor", "operator": "superuser"}
# A signed-in user without a role (an account an administrator made but gave no group): every screen answers 403
# with the refusal page (templates/403.html), never a bare error.
NO_ROLE = "walk-no-role"
START = ["/", "/queue/", "/attestations/", "/board/", "/receipts/", "/lanes/", "/executions/", "/effects/",
         "/cutover/"]
# Followed as screens: the governance pages. Asked for their status only: the admin, the API, static files, /metrics.
NOT_SCREENS = re.compile(r"^/(static/|admin/|api/|accounts/|metrics|healthz|readyz)")
NOT_ASKED = re.compile(r"^/(accounts/logout/|admin/logout/)")
# The screens the demo world must reach; a kind that disappears from every link fails the walk.
REQUIRED_SHAPES = {"/", "/queue/", "/attestations/", "/board/", "/receipts/", "/lanes/", "/executions/",
                   "/effects/", "/cutover/", "/receipts/N/", "/events/N/", "/queue/execution/N/", "/queue/effect/N/",
                   "/links/N/", "/queue/lane/N/", "/attestations/certification/N/", "/attestations/approval/N/",
                   "/cutover/succession/N/", "/queue/delivery/N/", "/cutover/attempt/N/"}
SERIOUS = ("serious", "critical")

EMPTY_ROWS_JS = """() => [...document.querySelectorAll('tr')].filter(tr => {
  const cells = [...tr.cells];
  return cells.length === 0 || cells.every(c => !c.textContent.trim()
      && !c.querySelector('input,select,button,textarea,img,svg,a'));
}).map(tr => tr.outerHTML.slice(0, 160))"""
# The page's structure without its text or form values: two pages of one structure get one axe-core run (the
# same screen seen by two roles with the same actions differs only in text, e.g. the signed-in name).
STRUCTURE_JS = """() => [...document.querySelectorAll('*')].map(e => [e.tagName, e.className, e.id,
  e.getAttribute('type'), e.getAttribute('role'), e.getAttribute('for'), e.getAttribute('style'),
  ...[...e.attributes].filter(a => a.name.startsWith('aria-')).map(a => a.name + '=' + a.value)].join(' ')).join('|')"""
LINKS_JS = "() => [...document.querySelectorAll('a[href]')].map(a => a.href)"


def shape(path: str) -> str:
    return re.sub(r"^/cutover/attempt/[^/]+/", "/cutover/attempt/N/", re.sub(r"/\d+/", "/N/", urlsplit(path).path))


def slug(shape_: str) -> str:
    """The screenshot's name: `/` is the overview, `/receipts/` the list, `/receipts/N/` one receipt's page."""
    if shape_ == "/":
        return "overview"
    name = re.sub(r"[^a-z0-9]+", "-", shape_.replace("/N/", "/")).strip("-")
    return f"{name}-page" if shape_.endswith("/N/") else name


@dataclass
class Walk:
    problems: list[str] = field(default_factory=list)
    pages: dict[str, set[str]] = field(default_factory=dict)  # role -> shapes visited
    links_checked: int = 0
    axe_runs: int = 0
    axe_structures: set[int] = field(default_factory=set)
    impacts: dict[str, int] = field(default_factory=dict)  # every violation seen, by impact (serious ones fail)
    shots: dict[str, str] = field(default_factory=dict)  # screen slug -> role shown
    seconds: dict[str, float] = field(default_factory=lambda: {"pages": 0.0, "axe": 0.0, "links": 0.0})


def build_world(receiver) -> None:
    """The demo world plus one of each object kind, all through the services (see the module docstring)."""
    from datetime import UTC, datetime, timedelta

    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.utils import timezone

    from connector.actors import Actor
    from connector.demo import build_world as demo_world
    from connector.models import OrderingLane
    from connector.services import admission, approvals, execution, materialize
    from cutover.services import succession, v1_shutdown
    from effects.services import worker
    from effects.services.delivery import setup
    from tests.connector.inbound_helpers import drain
    from tests.cutover.succession_helpers import build_succession_world
    from tests.cutover.v1_world import build_v1_world
    from tests.effects.helpers import author

    call_command("demo_load", password=PASSWORD, stdout=io.StringIO())
    User.objects.create_user(NO_ROLE, password=PASSWORD)
    with mock.patch.dict(os.environ, {"DEMO_RECEIVER_PORT": str(urlsplit(receiver.url).port)}):
        call_command("delivery_demo", stdout=io.StringIO(), stderr=io.StringIO())
    system = Actor.system("walk")

    def deliver(channel: str, key: str, *events: dict) -> None:
        body = json.dumps({"events": list(events)}).encode()
        receipt = admission.receipt_admit(account_key="acme-eu", channel=channel, transport_key=key, body=body,
                                          actor=system).receipt
        materialize.receipt_materialize(receipt_pk=receipt.pk)

    def event(record: str, sequence: int) -> dict:
        return {"id": f"{record}-{sequence}", "type": "record.updated", "record_id": record, "sequence": sequence,
                "occurred_at": "2026-12-02T17:00:00Z", "data": {"name": f"v{sequence}", "email": "a@example.com"}}

    # A record created at the CRM and then updated at its linked identity: finalized effects and a RemoteLink.
    deliver("records.webhook", "walk-1", event("cust-42", 1))
    drain()
    while worker.effect_dispatch_once(holder_name="walk") is not None:
        pass
    deliver("records.webhook", "walk-2", event("cust-42", 2))
    drain()
    while worker.effect_dispatch_once(holder_name="walk") is not None:
        pass
    # A RemoteLink conflict (the provider answers an update with another identity), requested as a relink set
    # (D-494): the board's bulk form, the bulk page and the set's approval page with its members.
    from effects.models import RemoteEffect
    from effects.services import identity

    deliver("records.webhook", "walk-2b", event("cust-42", 3))
    drain()
    receiver.modes = ["new_identity"]
    while worker.effect_dispatch_once(holder_name="walk") is not None:
        pass
    conflicted = RemoteEffect.objects.get(quarantine_reason=identity.CONFLICT)
    identity.effect_relink_set_request(items=[(conflicted.pk, conflicted.changed_at)],
                                       reason="The CRM merged the duplicate record", evidence_ref="CRM audit T-77",
                                       actor=Actor.for_user(User.objects.get(username="oscar")))
    # A strict-sequence gap past its deadline: the lane halts with GAP_DEADLINE (board and queue).
    deliver("records.sequenced", "walk-3", event("acct-9", 1))
    deliver("records.sequenced", "walk-4", event("acct-9", 3))
    drain()
    gap = OrderingLane.objects.get(route="records.sequenced", partition="acct-9")
    with mock.patch("django.utils.timezone.now", return_value=timezone.now() + timedelta(seconds=31)):
        execution.lane_gap_deadline(lane_pk=gap.pk)
    # An uncertain effect in the queue: a world without the idempotency contract, the receiver answers 500.
    world = demo_world("u-", push=True)
    author(world.accounts[0])
    receiver.default_mode = "apply_5xx"
    worker.effect_dispatch_once(holder_name="walk-u", account_id=world.accounts[0].pk)
    receiver.default_mode = "ok"
    # A pending platform-attested certification (attestations), from the delivery test world.
    from tests.effects.delivery.world import build as delivery_world

    bound = delivery_world("http://127.0.0.1:9")
    setup.certification_request(
        actor=Actor.for_user(User.objects.get(username="cid")), binding=bound.binding,
        assurance_mode="platform_attested", handshake={"principal_id": "svc-crm-writer", "account_id": "acct-42"},
        evidence_ref="handshake:walk", valid_until=datetime.now(UTC) + timedelta(days=30))
    # An activation decision waiting for two approvers, and a successor activation on the console.
    approvals.approval_request(kind="activation_decision", subject_key="epoch-2",
                               actor=Actor.for_user(User.objects.get(username="alma")),
                               reason="Rehearsal passed; the successor is verified", evidence_ref="CHG-2041")
    successor = build_succession_world("ws-")
    succession.barrier_set_acquire(predecessor_epoch_id=successor.epoch.epoch_id,
                                   successor_epoch_id=successor.successor.epoch_id, holder="console", actor=system)
    # A service cutover opened from V1 (the console's attempts and the attempt's page).
    v1 = build_v1_world("wc-")
    v1_shutdown.cutover_open(attempt_key="walk-attempt", configuration_generation_id=v1.configuration.generation_id,
                             candidate_epoch_id=v1.epoch.epoch_id, actor=system)


def _same_origin(base: str, url: str) -> str | None:
    url = urldefrag(url)[0]
    if not url.startswith(base):
        return None
    return url[len(base):] or "/"


def _check_page(page, axe, walk: Walk, role: str, path: str, status: int, failed: list) -> None:
    where = f"{role} {path}"
    if status >= 400:
        intended = status in (403, 429) and page.locator("main h1").count() > 0 and (
            "Refused" in page.locator("main h1").first.inner_text()
            or "Too many" in page.locator("main h1").first.inner_text())
        if not intended:
            walk.problems.append(f"{where}: HTTP {status}")
    for url, code in failed:
        walk.problems.append(f"{where}: sub-resource {url} answered {code}")
    for row in page.evaluate(EMPTY_ROWS_JS):
        walk.problems.append(f"{where}: empty table row {row}")
    structure = hash(page.evaluate(STRUCTURE_JS))
    if structure in walk.axe_structures:
        return
    walk.axe_structures.add(structure)
    started = time.monotonic()
    result = axe.run(page)
    walk.seconds["axe"] += time.monotonic() - started
    walk.axe_runs += 1
    for violation in result.response["violations"]:
        walk.impacts[violation["impact"]] = walk.impacts.get(violation["impact"], 0) + 1
        if violation["impact"] in SERIOUS:
            targets = [node["target"] for node in violation["nodes"]][:3]
            walk.problems.append(f"{where}: axe {violation['impact']} {violation['id']} "
                                 f"({violation['help']}) at {targets}")


def _visit(page, base: str, path: str, failed: list) -> int:
    failed.clear()
    response = page.goto(base + path)
    page.wait_for_load_state("load")
    return response.status if response is not None else 0


def _shoot(page, walk: Walk, shots: Path | None, name: str, role: str) -> None:
    if shots is None or name in walk.shots:
        return
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / f"screen-{name}.png"), full_page=True)
    walk.shots[name] = role


def _new_context(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900}, device_scale_factor=1)
    context.set_default_timeout(60_000)
    return context


def walk_role(browser, base: str, role: str, walk: Walk, shots: Path | None, extra: list[str] = ()) -> None:
    from axe_playwright_python.sync_playwright import Axe

    axe = Axe()
    context = _new_context(browser)
    page = context.new_page()
    failed: list = []
    page.on("response", lambda r: failed.append((r.url, r.status)) if r.status >= 400 and r.request.resource_type
            != "document" else None)
    page.goto(f"{base}/accounts/login/?next=/")
    page.get_by_label("Username").fill(role)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/")
    refused = role == NO_ROLE
    seen: set[str] = set()
    asked: dict[str, int] = {}
    queue = [*START, *extra]
    walk.pages[role] = set()
    while queue:
        path = queue.pop(0)
        if shape(path) in seen:
            continue
        seen.add(shape(path))
        started = time.monotonic()
        status = _visit(page, base, path, failed)
        walk.seconds["pages"] += time.monotonic() - started
        asked[urldefrag(path)[0]] = status
        walk.pages[role].add(shape(path))
        _check_page(page, axe, walk, role, path, status, failed)
        if refused and status != 403:
            walk.problems.append(f"{role} {path}: HTTP {status}, not the refusal page")
        if status == 403:
            _shoot(page, walk, shots, "refused", role)
        if status == 200:
            _shoot(page, walk, shots, slug(shape(path)), role)
        for href in page.evaluate(LINKS_JS):
            local = _same_origin(base, href)
            if local is None:
                if href.startswith(("http:", "https:")):
                    walk.problems.append(f"{role} {path}: link leaves the product: {href}")
                continue
            if NOT_ASKED.match(local):
                continue
            if not NOT_SCREENS.match(local) and shape(local) not in seen:
                queue.append(local)
            if local not in asked:
                started = time.monotonic()
                answer = context.request.get(base + local, max_redirects=0)
                walk.seconds["links"] += time.monotonic() - started
                asked[local] = answer.status
                walk.links_checked += 1
                if answer.status >= 400:
                    walk.problems.append(f"{role} {path}: link {local} answered {answer.status}")
    context.close()


def walk_anonymous(browser, base: str, walk: Walk, shots: Path | None) -> None:
    """The public pages: sign-in, a refused sign-in (the name kept), and the lockout page after five wrong
    passwords of one (throwaway) user name."""
    from axe_playwright_python.sync_playwright import Axe

    axe = Axe()
    context = _new_context(browser)
    page = context.new_page()
    failed: list = []
    page.on("response", lambda r: failed.append((r.url, r.status)) if r.status >= 400 and r.request.resource_type
            != "document" else None)
    status = _visit(page, base, "/accounts/login/", failed)
    _check_page(page, axe, walk, "anonymous", "/accounts/login/", status, failed)
    _shoot(page, walk, shots, "sign-in", "anonymous")
    answers = []
    page.on("response", lambda r: answers.append(r.status) if r.request.resource_type == "document" else None)
    for attempt in range(6):
        page.get_by_label("Username").fill("walk-locked")
        page.get_by_label("Password").fill(f"wrong-{attempt}")
        failed.clear()
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_load_state("load")
        if attempt == 0:
            _check_page(page, axe, walk, "anonymous", "/accounts/login/ (refused)", answers[-1], failed)
            _shoot(page, walk, shots, "sign-in-refused", "anonymous")
        if page.locator("#id_username").count() == 0:
            break
    walk.pages["anonymous"] = {"/accounts/login/"}
    if "Too many failed sign-ins" not in page.inner_text("main"):
        walk.problems.append(f"anonymous: no lockout page after {len(answers)} wrong passwords ({answers})")
    else:
        _check_page(page, axe, walk, "anonymous", "/accounts/login/ (locked)", answers[-1], failed)
        _shoot(page, walk, shots, "sign-in-locked", "anonymous")
    context.close()


def deep_pages() -> list[str]:
    """Pages of kinds the crawl's first instance of a shape may not link: a RemoteLink (from a finalized effect),
    a delivery operation (the queue lists only those that wait for a person), a relink set's approval page and
    its bulk page (D-494)."""
    from connector.models import DualApprovalRequest
    from effects.models import DeliveryOperation, RemoteLink

    link = RemoteLink.objects.order_by("pk").first()
    operation = DeliveryOperation.objects.order_by("pk").first()
    relink_set = DualApprovalRequest.objects.get(kind="remote_identity_change_set")
    return [f"/links/{link.pk}/", f"/queue/delivery/{operation.pk}/", f"/attestations/approval/{relink_set.pk}/",
            "/bulk/?code=REMOTE_LINK_CONFLICT"]
