"""The cutover console for a successor activation: every phase in order with its receipts, what blocks the next
phase, and the allowed actions run through the same services as `manage.py succession`; a stale page and a user
without the permission are refused and change nothing."""
from __future__ import annotations

import re

import pytest

from connector.models import AccountServingGate, ServingEpoch
from cutover.models import OrderingHandoff, ServingPublicationBarrierSet
from cutover.services import succession
from tests.connector.inbound_helpers import drain
from tests.cutover.succession_helpers import ACTOR, build_succession_world, send
from tests.governance.test_screens import _csrf, client_for


@pytest.fixture
def acquiring(db):
    world = build_succession_world("gc-")
    send(world, "evt-1", 1)
    send(world, "evt-2", 2, record="rec-2", account=world.accounts[1])
    drain()
    row = succession.barrier_set_acquire(predecessor_epoch_id=world.epoch.epoch_id,
                                         successor_epoch_id=world.successor.epoch_id, holder="console", actor=ACTOR)
    return world, row


def _post(client, url, row, action, **extra):
    token = _csrf(client, url)
    data = {"csrfmiddlewaretoken": token, "action": action, "state": row.state, "fence": str(row.fence), **extra}
    return client.post(url, data, follow=True)


def _statuses(html: str) -> list[str]:
    return re.findall(r'class="phase phase-(\w+)"', html)


def test_console_walks_every_phase_through_the_services(acquiring, people):
    """An approver runs the whole successor activation from the console: hold, drain, halt, handoffs, activate
    (which reads back and releases). Each phase shows its receipts; the overview links the activation.
    Proves: CV2-11-023, CV2-11-027 (console path over the same services)."""
    world, row = acquiring
    client = client_for(people["approver"])
    assert f"/cutover/succession/{row.pk}/" in client.get("/cutover/").content.decode()
    url = f"/cutover/succession/{row.pk}/"
    page = client.get(url).content.decode()
    assert _statuses(page) == ["current", "pending", "pending", "pending", "pending", "pending"]
    assert "owner receipts digest" in page and world.successor.epoch_id in page
    for action in ("hold", "drain", "halt", "handoffs", "activate"):
        row = ServingPublicationBarrierSet.objects.get(pk=row.pk)
        response = _post(client, url, row, action)
        assert response.status_code == 200, action
        assert "msg error" not in response.content.decode(), (action, response.content.decode()[:3000])
    row = ServingPublicationBarrierSet.objects.get(pk=row.pk)
    assert row.state == "released"
    assert ServingEpoch.objects.get(pk=world.successor.pk).state == "active"
    assert set(AccountServingGate.objects.filter(account__in=world.accounts).values_list("mode", flat=True)) \
        == {"v2_serving"}
    assert OrderingHandoff.objects.filter(barrier_set=row).count() == 2
    page = client.get(url).content.decode()
    assert _statuses(page) == ["done"] * 6 and "Every phase is done" in page


def test_stale_page_is_refused_and_changes_nothing(acquiring, people):
    """The console sends the barrier-set state and fence it showed; after the command moved the set, the old page's
    action is refused with an explanation. Proves: CV2-11-036 (fenced coordinator actions)."""
    world, row = acquiring
    client = client_for(people["approver"])
    url = f"/cutover/succession/{row.pk}/"
    stale = ServingPublicationBarrierSet.objects.get(pk=row.pk)
    succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=ACTOR)  # the command moved it
    before = ServingPublicationBarrierSet.objects.get(pk=row.pk)
    response = _post(client, url, stale, "release", reason="stale page")
    body = response.content.decode()
    assert "Refused: the page showed barrier set" in body and "Nothing was applied" in body
    after = ServingPublicationBarrierSet.objects.get(pk=row.pk)
    assert (after.state, after.fence) == (before.state, before.fence) == ("held", before.fence)


def test_an_approver_takes_over_a_crashed_coordinators_set_and_finishes_it(acquiring, people):
    """A coordinator held the barriers and halted the gates, then vanished. The console offers "Take over" while
    the set is open: the approver becomes its holder by one fenced step (same set and phase, fence + 1), the
    vanished coordinator's next act fails with FENCE_STALE, and the remaining phases finish from the console.
    Proves: issue 42 item 1"""
    from connector.errors import FenceStale
    from cutover.services import succession_phases

    world, row = acquiring
    row = succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, holder="console", actor=ACTOR)
    succession_phases.drain_all(barrier_set=row, holder="console", actor=ACTOR)
    succession_phases.halt_drained(barrier_set=row, holder="console", actor=ACTOR)
    crashed = ServingPublicationBarrierSet.objects.get(pk=row.pk)
    client = client_for(people["approver"])
    url = f"/cutover/succession/{row.pk}/"
    assert "Take over the barrier set from console" in client.get(url).content.decode()
    body = _post(client, url, crashed, "takeover").content.decode()
    holder = f"console:{people['approver'].username}"
    assert f"is held by {holder}" in body, body[:3000]
    taken = ServingPublicationBarrierSet.objects.get(pk=row.pk)
    assert (taken.holder, taken.state, taken.fence) == (holder, crashed.state, crashed.fence + 1)
    with pytest.raises(FenceStale):
        succession_phases.handoff_all(barrier_set=taken, holder="console", actor=ACTOR)
    for action in ("handoffs", "activate"):
        response = _post(client, url, ServingPublicationBarrierSet.objects.get(pk=row.pk), action)
        assert "msg error" not in response.content.decode(), (action, response.content.decode()[:3000])
    assert ServingPublicationBarrierSet.objects.get(pk=row.pk).state == "released"
    assert ServingEpoch.objects.get(pk=world.successor.pk).state == "active"


def test_an_action_outside_the_current_phase_is_refused(acquiring, people):
    """Activating before the gates halted and the lanes were handed off is not offered and a crafted POST is
    refused. Proves: CV2-11-024."""
    world, row = acquiring
    client = client_for(people["approver"])
    response = _post(client, f"/cutover/succession/{row.pk}/", row, "activate")
    assert "is not allowed in the current phase" in response.content.decode()
    assert ServingEpoch.objects.get(pk=world.successor.pk).state == "verified"


def test_without_the_permission_no_action_and_forged_post_is_403(acquiring, people):
    """Auditors and operators see the phases but no action; their forged POST is answered 403 and moves nothing."""
    world, row = acquiring
    url = f"/cutover/succession/{row.pk}/"
    for who in ("auditor", "operator"):
        client = client_for(people[who])
        page = client.get(url).content.decode()
        assert 'name="action"' not in page and "need the <code>cutover.coordinate_succession</code>" in page
        token = _csrf(client, url)
        response = client.post(url, {"csrfmiddlewaretoken": token, "action": "hold", "state": row.state,
                                      "fence": str(row.fence)})
        assert response.status_code == 403
    assert ServingPublicationBarrierSet.objects.get(pk=row.pk).state == "acquiring"


def test_drain_blockers_are_shown_while_a_permit_is_open(people, receiver):
    """A real granted DispatchPermit is continuation work of the predecessor: the drain stays `draining` with every
    gate `v2_serving` and the console names the open effect; the halt is not offered. Only after the permit's one
    call settled and its effect is terminal does the rerun drain complete, and the halt then halts every gate.
    Proves: CV2-11-005, CV2-13-007 (blocking evidence shown; nothing advances because time passed)."""
    from connector.services import serving
    from tests.effects.helpers import acquire, author, build_push_world
    from tests.effects.helpers import send as egress_send

    world = build_push_world()
    successor = serving.epoch_prepare_from_owners(epoch_id="p-epoch-2",
                                                  configuration_generation_id=world.configuration.generation_id,
                                                  actor=ACTOR)
    if successor.state == "prepared":
        successor = serving.epoch_verify(epoch_pk=successor.pk, actor=ACTOR)
    assert successor.state == "verified" and successor.pk != world.active_epoch.pk
    account = world.accounts[0]
    author(account)
    ready = acquire(account=account)  # a granted permit: the open-permit set of the gate is not empty
    row = succession.barrier_set_acquire(predecessor_epoch_id=world.active_epoch.epoch_id,
                                         successor_epoch_id=successor.epoch_id, holder="console", actor=ACTOR)
    client = client_for(people["approver"])
    url = f"/cutover/succession/{row.pk}/"
    _post(client, url, ServingPublicationBarrierSet.objects.get(pk=row.pk), "hold")
    body = _post(client, url, ServingPublicationBarrierSet.objects.get(pk=row.pk), "drain").content.decode()
    assert "is draining; still open: 1 nonterminal remote effects" in body
    page = client.get(url).content.decode()
    assert _statuses(page)[1:3] == ["current", "pending"] and 'value="halt"' not in page
    assert AccountServingGate.objects.get(account=account).mode == "v2_serving"
    egress_send(ready)  # the one call is made, the permit settles and the effect is finalized with it (D-531)
    body = _post(client, url, ServingPublicationBarrierSet.objects.get(pk=row.pk), "drain").content.decode()
    assert "is drained." in body, body[:3000]
    n = len(world.accounts)
    body = _post(client, url, ServingPublicationBarrierSet.objects.get(pk=row.pk), "halt").content.decode()
    assert f"{n} of {n} gates v2_halted." in body
