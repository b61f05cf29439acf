"""Server-side rules of the remediation screens: every new form carries the state the page showed and a stale POST
is refused by the service; a user without the permission sees no form and a forged POST is 403 and changes
nothing; a resolution without evidence changes nothing (D-197)."""
from __future__ import annotations

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
    return client


def post(client, url, **data):
    client.get("/queue/")  # any screen sets the CSRF cookie (the sign-out form)
    return client.post(url, {"csrfmiddlewaretoken": client.cookies["csrftoken"].value, **data}, follow=True)


@pytest.fixture
def conflict(push_world, receiver):
    acme = push_world.accounts[0]
    push(acme, "r1", 1)
    dispatch(acme)
    push(acme, "r1", 2)
    receiver.modes = ["new_identity"]
    return dispatch(acme)


def test_link_conflict_forms_need_the_permission_evidence_and_the_shown_state(people, conflict):
    url, action = f"/queue/effect/{conflict.pk}/", f"/queue/effect/{conflict.pk}/link/"
    auditor = client_for(people["auditor"])
    page = auditor.get(url).content.decode()
    assert "RemoteLink conflict" in page and "Keep the link and finalize" not in page
    shown = conflict.changed_at.isoformat()
    assert post(auditor, action, action="keep_link", reason="r", evidence_ref="e", changed_at=shown
                ).status_code == 403
    operator = client_for(people["operator"])
    assert "Keep the link and finalize" in operator.get(url).content.decode()
    stale = post(operator, action, action="keep_link", reason="r", evidence_ref="e",
                 changed_at=(conflict.changed_at - timedelta(seconds=1)).isoformat())
    assert "changed since the page was shown" in stale.content.decode()
    missing = post(operator, action, action="keep_link", reason="r", evidence_ref="", changed_at=shown)
    assert "Enter an evidence reference" in missing.content.decode()  # beside the field, input kept (issue 38)
    unknown = post(operator, action, action="relabel", reason="r", evidence_ref="e", changed_at=shown)
    assert "Refused" in unknown.content.decode()
    assert RemoteEffect.objects.get(pk=conflict.pk).state == "remote_confirmed"
    assert not RemoteLinkResolution.objects.exists()
    done = post(operator, action, action="keep_link", reason="CRM shows v2", evidence_ref="T-1", changed_at=shown)
    assert "the link was kept" in done.content.decode()
    assert RemoteEffect.objects.get(pk=conflict.pk).state == "finalized"


def test_relink_through_the_screen_waits_for_two_approvers(people, conflict):
    action = f"/queue/effect/{conflict.pk}/link/"
    operator = client_for(people["operator"])
    shown = conflict.changed_at.isoformat()
    early = post(operator, action, action="relink_apply", reason="r", evidence_ref="e", changed_at=shown)
    assert "APPROVAL_MISSING" in early.content.decode()
    asked = post(operator, action, action="relink_request", reason="merged", evidence_ref="T-2", changed_at=shown)
    assert "Dual approval requested" in asked.content.decode()
    assert "Waiting for approvals" in asked.content.decode()
    assert RemoteEffect.objects.get(pk=conflict.pk).state == "remote_confirmed"


@pytest.fixture
def gap_lane(db):
    from tests.connector.test_lane_remediation import SEQUENCED, send
    from tests.conformance.packs import PACK_B
    from tests.connector.inbound_helpers import build_inbound_world, drain, lane

    world = build_inbound_world("gs-", [PACK_B])
    for seq in (1, 3):
        send(world, seq)
    drain()
    with later(31):
        sweeper.inbound_sweep(grace_seconds=0)
    send(world, 2)
    return lane(SEQUENCED, "mem-1")


def test_lane_resume_form_needs_the_permission_and_the_shown_fence(people, gap_lane):
    url = f"/queue/lane/{gap_lane.pk}/"
    auditor = client_for(people["auditor"])
    assert "Resume the partition</button>" not in auditor.get(url).content.decode()
    assert post(auditor, url, mode="missing_arrived", reason="r", evidence_ref="e", fence=gap_lane.fence
                ).status_code == 403
    operator = client_for(people["operator"])
    stale = post(operator, url, mode="missing_arrived", reason="r", evidence_ref="e", fence=gap_lane.fence - 1)
    assert "FENCE_STALE" in stale.content.decode()
    malformed = post(operator, url, mode="missing_arrived", reason="r", evidence_ref="e", fence="eleven")
    assert "FENCE_STALE" in malformed.content.decode()
    assert OrderingLane.objects.get(pk=gap_lane.pk).state == "halted" and not LaneResumption.objects.exists()
    done = post(operator, url, mode="missing_arrived", reason="2 arrived", evidence_ref="T-3", fence=gap_lane.fence)
    assert "resumed (missing_arrived)" in done.content.decode()
    assert OrderingLane.objects.get(pk=gap_lane.pk).state == "open"


@pytest.fixture
def failed_execution(db):
    from tests.conformance.packs import PACK_B
    from tests.connector.inbound_helpers import build_inbound_world, drain
    from tests.connector.test_lane_remediation import send

    world = build_inbound_world("fs-", [PACK_B])
    with mock.patch.object(runtime, "_apply_record", return_value="failed"):
        send(world, 1)
        drain()
    return Execution.objects.get(quarantine_reason="RESULT_FAILED")


def test_replay_form_needs_the_permission_and_the_shown_state(people, failed_execution):
    url, action = f"/queue/execution/{failed_execution.pk}/", f"/queue/execution/{failed_execution.pk}/replay/"
    auditor = client_for(people["auditor"])
    page = auditor.get(url).content.decode()
    assert "A replay runs:" in page and "Replay this execution" not in page
    shown = failed_execution.changed_at.isoformat()
    assert post(auditor, action, reason="r", evidence_ref="e", changed_at=shown).status_code == 403
    operator = client_for(people["operator"])
    assert "Replay this execution" in operator.get(url).content.decode()
    stale = post(operator, action, reason="r", evidence_ref="e",
                 changed_at=(failed_execution.changed_at - timedelta(seconds=1)).isoformat())
    assert "FENCE_STALE" in stale.content.decode() and not ReplayRequest.objects.exists()
    done = post(operator, action, reason="runtime fixed", evidence_ref="T-4", changed_at=shown)
    text = done.content.decode()
    assert "execution-" in text and "runs as execution" in text and "Remedied" in text
    assert ReplayRequest.objects.get().principal == "user:oscar-operator"
    assert f'href="/queue/execution/{failed_execution.pk}/"' not in operator.get("/queue/").content.decode()
