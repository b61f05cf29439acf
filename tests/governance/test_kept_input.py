"""Issue 38 item 3: a refused form keeps what was typed. The page comes back (not a redirect to an empty form) with
every typed value in its field, the problem beside the field it is about and a summary at the top linking each
problem to its field (the GOV.UK error summary and error message pattern); nothing was applied."""
from __future__ import annotations

import re
from datetime import timedelta
from unittest import mock

import pytest
from django.test import Client

from connector.models import Execution, LaneResumption, OrderingLane, ReplayRequest
from connector.services import runtime, sweeper
from effects.models import RemoteEffect, RemoteLinkResolution
from tests.connector.test_lane_remediation import later
from tests.effects.test_remote_identity import dispatch, push


def client_for(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/queue/")  # sets the CSRF cookie
    return client


def post(client, url, **data):
    return client.post(url, {"csrfmiddlewaretoken": client.cookies["csrftoken"].value, **data})


def summary(html: str) -> list[tuple[str, str]]:
    """(anchor, message) of each item of the error summary at the top of the page."""
    box = html.split('class="error-summary"', 1)[1].split("</div>", 1)[0]
    return re.findall(r'<li><a href="#([^"]+)">([^<]+)</a></li>', box)


def beside(html: str, anchor: str) -> str:
    """The error message shown beside the field with id `anchor`."""
    found = re.search(rf'<p id="{re.escape(anchor)}-error" class="field-error">(.*?)</p>', html, re.S)
    assert found, f"no error beside #{anchor}"
    return re.sub(r"<[^>]+>", "", found.group(1))


def textarea(html: str, field_id: str) -> str:
    return re.search(rf'<textarea[^>]*id="{field_id}"[^>]*>(.*?)</textarea>', html, re.S).group(1)


def value(html: str, field_id: str) -> str:
    return re.search(rf'<input[^>]*id="{field_id}"[^>]*value="([^"]*)"', html).group(1)


@pytest.fixture
def open_gap(db):
    """A sequenced lane halted at its gap deadline, position 2 still missing."""
    from tests.connector.inbound_helpers import build_inbound_world, drain, lane
    from tests.connector.test_lane_remediation import SEQUENCED, send
    from tests.conformance.packs import PACK_B

    world = build_inbound_world("kg-", [PACK_B])
    for seq in (1, 3):
        send(world, seq)
    drain()
    with later(31):
        sweeper.inbound_sweep(grace_seconds=0)
    halted = lane(SEQUENCED, "mem-1")
    assert halted.state == "halted"
    return halted


def test_a_lane_resume_refused_before_the_gap_closed_keeps_reason_and_evidence(people, open_gap):
    """`missing_arrived` before the missing position arrived is refused (LANE_GAP_OPEN): the lane page comes back
    with the mode still chosen, the reason and evidence as typed, the refusal beside the mode and in the summary.
    Proves: issue 38 item 3."""
    url = f"/queue/lane/{open_gap.pk}/"
    operator = client_for(people["operator"])
    response = post(operator, url, mode="missing_arrived", reason="Provider says it resent 2",
                    evidence_ref="TICKET-2", fence=open_gap.fence)
    html = response.content.decode()
    assert response.status_code == 409, response.status_code
    assert '<option value="missing_arrived" selected>' in html
    assert textarea(html, "reason") == "Provider says it resent 2" and value(html, "evidence_ref") == "TICKET-2"
    assert beside(html, "mode").startswith("Error: LANE_GAP_OPEN")
    assert [anchor for anchor, _ in summary(html)] == ["mode"] and "LANE_GAP_OPEN" in summary(html)[0][1]
    assert html.count("<title>Error: ") == 1
    assert OrderingLane.objects.get(pk=open_gap.pk).state == "halted" and not LaneResumption.objects.exists()


def test_a_lane_resume_without_evidence_says_so_beside_the_field_and_keeps_the_reason(people, open_gap):
    """A missing evidence reference: 400, the reason kept, the problem beside the evidence field. Proves: issue 38
    item 3."""
    operator = client_for(people["operator"])
    response = post(operator, f"/queue/lane/{open_gap.pk}/", mode="skip_with_evidence", reason="Skip it",
                    evidence_ref="  ", fence=open_gap.fence)
    html = response.content.decode()
    assert response.status_code == 400
    assert textarea(html, "reason") == "Skip it" and '<option value="skip_with_evidence" selected>' in html
    assert beside(html, "evidence_ref") == "Error: Enter an evidence reference."
    assert summary(html) == [("evidence_ref", "Enter an evidence reference.")]
    assert 'aria-describedby="evidence_ref-error"' in html
    assert OrderingLane.objects.get(pk=open_gap.pk).state == "halted"


@pytest.fixture
def conflict(push_world, receiver):
    acme = push_world.accounts[0]
    push(acme, "k1", 1)
    dispatch(acme)
    push(acme, "k1", 2)
    receiver.modes = ["new_identity"]
    return dispatch(acme)


def test_a_relink_apply_refused_keeps_the_relink_form(people, conflict):
    """Applying a relink no one approved is refused (APPROVAL_MISSING): the relink form keeps its reason and
    evidence, the keep-link form stays empty, the refusal is beside the relink form. Proves: issue 38 item 3."""
    operator = client_for(people["operator"])
    response = post(operator, f"/queue/effect/{conflict.pk}/link/", action="relink_apply", reason="CRM merged it",
                    evidence_ref="CRM-77", changed_at=conflict.changed_at.isoformat())
    html = response.content.decode()
    assert response.status_code == 409
    assert textarea(html, "relink-reason") == "CRM merged it" and value(html, "relink-evidence") == "CRM-77"
    assert textarea(html, "keep-reason") == "" and value(html, "keep-evidence") == ""
    assert beside(html, "relink-title").startswith("Error: APPROVAL_MISSING")
    assert summary(html)[0][0] == "relink-title"
    assert RemoteEffect.objects.get(pk=conflict.pk).state == "remote_confirmed"
    assert not RemoteLinkResolution.objects.exists()


@pytest.fixture
def uncertain(push_world, receiver):
    from effects.services import worker
    from tests.effects.helpers import author

    acme = push_world.accounts[0]
    author(acme)
    receiver.default_mode = "apply_5xx"
    effect = worker.effect_dispatch_once(holder_name="h-kept", account_id=acme.pk)
    assert effect.state == "uncertain"
    return RemoteEffect.objects.get(pk=effect.pk)


def test_an_effect_decision_refused_by_its_form_keeps_what_was_typed(people, uncertain):
    """A decision posted from a page that went stale (another state token) comes back with the decision chosen,
    the remote ID, reason and evidence as typed, the refusal in the summary. Proves: issue 38 item 3."""
    operator = client_for(people["operator"])
    stale = (uncertain.changed_at - timedelta(seconds=1)).isoformat()
    response = post(operator, f"/queue/effect/{uncertain.pk}/", decision="remote_confirmed", remote_id="crm-9",
                    reason="Provider shows it", evidence_ref="LOG-9", changed_at=stale)
    html = response.content.decode()
    assert response.status_code == 409
    assert '<option value="remote_confirmed" selected>' in html and value(html, "remote_id") == "crm-9"
    assert textarea(html, "reason") == "Provider shows it" and value(html, "evidence_ref") == "LOG-9"
    assert summary(html) == [("decision", summary(html)[0][1])] and "RECONCILE_REFUSED" in summary(html)[0][1]
    malformed = post(operator, f"/queue/effect/{uncertain.pk}/", decision="relabel", reason="typed",
                     evidence_ref="E-1", changed_at=uncertain.changed_at.isoformat())
    html = malformed.content.decode()
    assert malformed.status_code == 400 and textarea(html, "reason") == "typed"
    assert beside(html, "decision").startswith("Error: FORM_INVALID")
    assert RemoteEffect.objects.get(pk=uncertain.pk).state == "uncertain"


@pytest.fixture
def failed_execution(db):
    from tests.connector.inbound_helpers import build_inbound_world, drain
    from tests.connector.test_lane_remediation import send
    from tests.conformance.packs import PACK_B

    world = build_inbound_world("kf-", [PACK_B])
    with mock.patch.object(runtime, "_apply_record", return_value="failed"):
        send(world, 1)
        drain()
    return Execution.objects.get(quarantine_reason="RESULT_FAILED")


def test_a_refused_replay_keeps_reason_and_evidence(people, failed_execution):
    """A replay posted from a stale page is refused: the replay form keeps its reason and evidence. Proves: issue
    38 item 3."""
    operator = client_for(people["operator"])
    response = post(operator, f"/queue/execution/{failed_execution.pk}/replay/", reason="runtime fixed",
                    evidence_ref="DEPLOY-12",
                    changed_at=(failed_execution.changed_at - timedelta(seconds=1)).isoformat())
    html = response.content.decode()
    assert response.status_code == 409
    assert textarea(html, "reason") == "runtime fixed" and value(html, "evidence_ref") == "DEPLOY-12"
    assert beside(html, "reason").startswith("Error: FENCE_STALE")
    assert not ReplayRequest.objects.exists()


def test_a_wrong_sign_in_keeps_the_user_name_with_the_error_summary_and_never_the_password(people):
    """A wrong password: the form again with the user name kept, the summary at the top linking the password
    field, the message beside it; the typed password is not sent back. Proves: issue 38 item 3."""
    client = Client()
    response = client.post("/accounts/login/", {"username": "oscar-operator", "password": "not-it-42"})
    html = response.content.decode()
    assert response.status_code == 200
    assert value(html, "id_username") == "oscar-operator" and "not-it-42" not in html
    assert summary(html)[0][0] == "id_password" and beside(html, "id_password").startswith("Error: ")
