"""Replay over HTTP says what it did: each replayed event's disposition (superseded at or below the high-water N,
or an execution of the replay's generation), readable again later; an operator (a role, not a superuser) may
replay; and a replay of a failed execution runs with external effects suppressed, so the receiver sees nothing
of it (D-194, D-195)."""
from __future__ import annotations

import base64
import json
from unittest import mock

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from connector.models import ApplicationResult, CrmRecord, Event, Execution, OrderingLane
from connector.services import runtime
from effects.models import RemoteEffect
from effects.services import worker
from tests.connector.inbound_helpers import drain
from tests.connector.test_api_admission import admit, body, event
from tests.connector.test_api_replay_and_reads import replay, replay_body
from tests.effects.conftest import receiver  # noqa: F401  (fixture)

PASSWORD = "pw-replay-1"


def basic(user) -> dict:
    return {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(f"{user.username}:{PASSWORD}".encode()).decode()}


@pytest.fixture
def oscar(db):
    """A person in the operator role: no superuser, no direct permission."""
    user = User.objects.create_user("oscar", password=PASSWORD)
    user.groups.add(Group.objects.get(name="operator"))
    assert not user.is_superuser and not user.user_permissions.exists()
    return user


def read(account: str, request_id: str, auth: dict):
    return Client().get(reverse("connector-api:replay-request-detail",
                                kwargs={"account": account, "request_id": request_id}), **auth)


@pytest.mark.django_db
def test_replay_of_an_applied_position_answers_superseded_at_the_high_water(world, oscar):
    """Positions 1 and 2 of r-1 were applied (high-water 2). Replaying 1 or 2 is superseded at or below the
    high-water without calling Runtime (CV2-09-015), and the answer says so with the high-water; the same
    disposition is read back at the request's URL. The operator role may replay and read.
    Proves: CV2-09-015, CV2-06-016, CV2-13-001"""
    account = world.accounts[0].account_key
    admit(Client(), body(event("e-1", "r-1", 1), event("e-2", "r-1", 2)), "k-1", account=account)
    from connector.services.sweeper import inbound_sweep

    inbound_sweep(grace_seconds=0)
    drain()
    assert OrderingLane.objects.get(partition="r-1").high_water == 2
    results = ApplicationResult.objects.count()
    for key, request_id in (("e-1", "rr-1"), ("e-2", "rr-2")):
        answer = replay(replay_body(world, Event.objects.get(source_event_key=key), request_id=request_id),
                        basic(oscar), account=account)
        assert answer.status_code == 201, answer.content
        entry, = answer.json()["events"]
        assert (entry["disposition"], entry["high_water"], entry["execution"]) == ("superseded", "2", None)
        assert entry["detail"] == "superseded at or below the lane high-water 2; Runtime was not called"
        assert read(account, request_id, basic(oscar)).json()["events"] == answer.json()["events"]
    drain()
    assert ApplicationResult.objects.count() == results


@pytest.mark.django_db
def test_the_replay_read_is_scoped_and_needs_the_view_permission(world, oscar):
    """Unknown or non-canonical request IDs are NOT_FOUND; a user without `connector.view_replayrequest` is
    PERMISSION_DENIED. Proves: CV2-09-012"""
    outsider = User.objects.create_user("nobody", password=PASSWORD)
    account = world.accounts[0].account_key
    assert read(account, "rr-missing", basic(oscar)).status_code == 404
    for odd in ("nul\x00id", " padded", "x" * 300):  # never canonical: no such request, and no 5xx
        response = read(account, odd, basic(oscar))
        assert (response.status_code, response.json()["code"]) == (404, "NOT_FOUND")
    assert read(account, "rr-missing", basic(outsider)).status_code == 403


@pytest.mark.django_db
def test_replay_of_a_failed_execution_runs_with_no_receiver_side_effect(receiver, oscar):
    """A push world: r-1 at 1 is applied and pushed (the receiver creates it). Runtime fails 2: its execution is
    quarantined RESULT_FAILED and halts the partition. An operator replays 2 over HTTP: the answer is an
    execution of the replay's generation; it runs and applies the CRM change, but authors no outbound command
    (external effects suppressed), so the receiver sees nothing of it. The partition resumed: 3 then applies and
    is pushed as an update of the linked record. Proves: CV2-09-017, CV2-09-018, CV2-09-029, CV2-06-014"""
    from connector.demo import build_world

    world = build_world("rp-", push=True)
    account = world.accounts[0].account_key
    client = Client()
    from connector.services.sweeper import inbound_sweep

    def deliver(*events, key):
        assert admit(client, body(*events), key, account=account).status_code == 201
        inbound_sweep(grace_seconds=0)
        drain()
        while worker.effect_dispatch_once(holder_name="h-replay", account_id=world.accounts[0].pk):
            pass

    deliver(event("e-1", "r-1", 1, name="v1"), key="k-1")
    assert len(receiver.requests) == 1
    with mock.patch.object(runtime, "_apply_record", return_value="failed"):
        deliver(event("e-2", "r-1", 2, name="v2"), key="k-2")
    failed = Execution.objects.get(quarantine_reason="RESULT_FAILED")
    assert OrderingLane.objects.get(partition="r-1").halt_reason == "RESULT_FAILED"

    answer = replay(replay_body(world, Event.objects.get(source_event_key="e-2"), request_id="fix-2"),
                    basic(oscar), account=account)
    assert answer.status_code == 201, answer.content
    entry, = answer.json()["events"]
    assert entry["disposition"] == "execution" and entry["execution"]["suppress_external_effects"] is True
    drain()
    rerun = Execution.objects.get(pk=entry["execution"]["id"])
    assert rerun.state == "completed" and rerun.pk != failed.pk
    assert CrmRecord.objects.get(record_key="r-1").fields["display_name"] == "v2"
    assert RemoteEffect.objects.count() == 1 and len(receiver.requests) == 1
    assert read(account, "fix-2", basic(oscar)).json()["events"][0]["execution"]["state"] == "completed"

    deliver(event("e-3", "r-1", 3, name="v3"), key="k-3")
    assert [r["method"] for r in receiver.requests] == ["POST", "PATCH"]
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {"finalized"}
    assert json.loads(receiver.requests[-1]["body"])["display_name"] == "v3"
