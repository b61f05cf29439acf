"""The replay REST API with a typed V1 predecessor ref (decision D-331): admitted and echoed as read-only
evidence, refused with its stable codes, and documented in the OpenAPI schema the way the V2 form is."""
from __future__ import annotations

import base64
import hashlib
import json

import pytest
from django.test import Client
from django.urls import reverse

from connector.models import AccountServingGate, Event, Execution, ReplayRequest, V1PredecessorRef
from connector.services.replay_v1 import V1_REF_PROTOCOL
from connector.services.tombstones import tombstones_import
from tests.connector.inbound_helpers import ACTOR
from tests.connector.test_api_admission import ACCOUNT, CHANNEL, event
from tests.connector.test_api_replay_and_reads import _schema, basic, replay, user_with

V1_BYTES = json.dumps(event("v1-e-5", "r-5", 1, name="Grace")).encode()
RESULT = hashlib.sha256(b"v1 result of work item 5").hexdigest()


@pytest.fixture
def operator(world):
    tombstones_import(rows=[{"account": ACCOUNT, "channel": CHANNEL, "transport_key": "v1-k-5",
                             "payload_digest": hashlib.sha256(V1_BYTES).digest(),
                             "predecessor_ref": "v1:workitem:5"}], actor=ACTOR)
    return user_with("add_replayrequest", "view_replayrequest", "view_receipt")


def v1_body(world, request_id: str = "rr-v1", **ref_change) -> dict:
    ref = {"protocol_version": V1_REF_PROTOCOL, "receipt_channel": CHANNEL, "receipt_transport_key": "v1-k-5",
           "event_id": "v1:event:5", "work_item_id": "v1:workitem:5", "original_epoch": "v1:generation:g-41",
           "payload_digest": hashlib.sha256(V1_BYTES).hexdigest(), "result_digest": RESULT,
           "payload": base64.b64encode(V1_BYTES).decode(), **ref_change}
    return {"request_id": request_id,
            "target_epoch": {"id": world.active_epoch.epoch_id, "digest": bytes(world.active_epoch.digest).hex()},
            "v1_predecessor": ref, "reason": "re-apply V1 item 5", "principal": "user:approver-1",
            "mode": "suppress_external_effects"}


@pytest.mark.django_db
def test_a_v1_predecessor_replay_over_http_is_admitted_and_echoed_as_evidence(
        world, operator, django_capture_on_commit_callbacks):
    """POST .../replays with `v1_predecessor` admits the replay (201), runs it under the account's serving V2
    epoch and echoes the V1 ref as evidence (no bytes); GET .../replays/{id} answers the same evidence; the same
    body again is `duplicate`. Proves: CV2-09-002, CV2-09-014"""
    with django_capture_on_commit_callbacks(execute=True):
        response = replay(v1_body(world), basic(operator))
    assert response.status_code == 201, response.content
    data = response.json()
    expected = {k: v for k, v in v1_body(world)["v1_predecessor"].items() if k != "payload"}
    assert data["v1_predecessor"] == expected
    request = ReplayRequest.objects.get(request_id="rr-v1")
    assert request.v1_predecessor == V1PredecessorRef.objects.get() and request.predecessor_event_id is None
    serving = AccountServingGate.objects.get(account__account_key=ACCOUNT).epoch_id
    replayed = Event.objects.get(replay_request=request)
    assert {request.target_epoch_id, replayed.epoch_id,
            *Execution.objects.filter(projection__event=replayed).values_list("epoch_id", flat=True)} == {serving}
    assert [e["disposition"] for e in data["events"]] == ["execution"]
    url = reverse("connector-api:replay-request-detail", kwargs={"account": ACCOUNT, "request_id": "rr-v1"})
    detail = Client().get(url, **basic(operator))
    assert detail.status_code == 200 and detail.json()["v1_predecessor"] == expected
    again = replay(v1_body(world), basic(operator))
    assert (again.status_code, again.json()["admission"]) == (200, "duplicate")


@pytest.mark.django_db
@pytest.mark.parametrize("case, change, code", [
    ("unknown-tombstone", {"receipt_transport_key": "v1-k-6"}, "REPLAY_V1_PREDECESSOR_UNKNOWN"),
    ("v2-epoch", {"original_epoch": "epoch-1"}, "REPLAY_PREDECESSOR_INVALID"),
    ("bytes", {"payload": base64.b64encode(b"{}").decode()}, "REPLAY_PREDECESSOR_INVALID"),
    ("both-forms", None, "REPLAY_PREDECESSOR_INVALID"),
])
def test_a_bad_v1_predecessor_over_http_is_422_and_writes_nothing(world, operator, case, change, code):
    """A V1 ref matching no tombstone is 422 REPLAY_V1_PREDECESSOR_UNKNOWN; a malformed one (an original epoch
    that is not a V1 identity, bytes that are not the authorized ones) or a body naming both predecessor forms is
    422 REPLAY_PREDECESSOR_INVALID; nothing is written. Proves: CV2-09-002"""
    data = v1_body(world, **(change or {}))
    if change is None:
        data["predecessor"] = {"event_id": 1, "payload_digest": "00" * 32}
    response = replay(data, basic(operator))
    assert (response.status_code, response.json()["code"]) == (422, code)
    assert not ReplayRequest.objects.exists() and not V1PredecessorRef.objects.exists()


@pytest.mark.django_db
def test_the_openapi_schema_documents_the_v1_predecessor_form(tmp_path):
    """The replay operation's input offers `v1_predecessor` beside `predecessor`, with every ref field, and its
    output and the detail's carry the V1PredecessorRef evidence. Proves: CV2-09-002"""
    schema = _schema(tmp_path)["components"]["schemas"]
    assert {"predecessor", "v1_predecessor"} <= set(schema["ReplayRequestAdmitInput"]["properties"])
    fields = {"protocol_version", "receipt_channel", "receipt_transport_key", "event_id", "work_item_id",
              "original_epoch", "payload_digest", "result_digest"}
    assert set(schema["V1PredecessorRef"]["properties"]) == fields
    for name in ("ReplayRequestAdmission", "ReplayRequestDetail"):
        assert "v1_predecessor" in schema[name]["properties"]
