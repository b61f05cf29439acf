"""Replay admission and receipt reads over HTTP, the error catalog and the OpenAPI schema, on real PostgreSQL."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import re
from pathlib import Path

import pytest
import yaml
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from drf_spectacular.drainage import GENERATOR_STATS

from connector import tasks
from connector.api import views as api_views
from connector.api.exceptions import API_ERROR_CODES
from connector.choices import ComponentDisposition, ReceiptKind
from connector.models import (
    Event,
    Execution,
    MaterializationDue,
    Receipt,
    ReceiptComponent,
    ReplayRequest,
)
from connector.services import execution
from connector.services.materialize import receipt_materialize
from tests.connector.test_api_admission import ACCOUNT, OTHER, admit, body, counts, event, gate_halt

PASSWORD = "pw-for-tests-1"


@pytest.fixture(autouse=True)
def enqueued(monkeypatch):
    """Materialization enqueues are recorded instead of reaching the broker."""
    calls: list[int] = []
    monkeypatch.setattr(tasks, "materialization_wake",  # one wake-up per account and slot (D-269)
                        lambda account_id, slot=0: calls.append(account_id))
    return calls


def user_with(*codenames: str, username: str = "operator-1"):
    user = get_user_model().objects.create_user(username=username, password=PASSWORD)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="connector",
                                                         codename__in=codenames))
    return user


def basic(user, password: str = PASSWORD) -> dict:
    token = base64.b64encode(f"{user.username}:{password}".encode()).decode()
    return {"HTTP_AUTHORIZATION": f"Basic {token}"}


@pytest.fixture
def operator(world):
    return user_with("add_replayrequest", "view_receipt")


@pytest.fixture
def delivered(world):
    """One delivery of three events (two positions of record r-1, one of r-2), admitted and materialized."""
    response = admit(Client(), body(event("e-1", "r-1", 1), event("e-2", "r-1", 2), event("e-3", "r-2", 1)), "k-1")
    receipt = Receipt.objects.get(pk=response.json()["receipt"])
    out = receipt_materialize(receipt_pk=receipt.pk)
    return receipt, out


def replay_body(world, event_row: Event, request_id: str = "rr-1", **overrides) -> dict:
    component = ReceiptComponent.objects.get(event=event_row, disposition=ComponentDisposition.EVENT)
    data = {"request_id": request_id,
            "target_epoch": {"id": world.active_epoch.epoch_id, "digest": bytes(world.active_epoch.digest).hex()},
            "predecessor": {"event_id": event_row.pk,
                            "payload_digest": hashlib.sha256(bytes(component.payload)).hexdigest()},
            "reason": "customer asked for a re-sync", "principal": "user:approver-1",
            "mode": "suppress_external_effects"}
    data.update(overrides)
    return data


def replay(data: dict | bytes, auth: dict, *, account: str = ACCOUNT, content_type: str = "application/json",
           client: Client | None = None):
    url = reverse("connector-api:replay-request-admit", kwargs={"account": account})
    payload = data if isinstance(data, bytes) else json.dumps(data).encode()
    return (client or Client()).post(url, data=payload, content_type=content_type, **auth)


def replay_counts() -> dict[str, int]:
    return {**counts(), "requests": ReplayRequest.objects.count()}


def read(path: str, auth: dict, receipt_id: int, *, account: str = ACCOUNT, client: Client | None = None):
    name = "connector-api:receipt-detail" if path == "detail" else "connector-api:receipt-event-list"
    return (client or Client()).get(reverse(name, kwargs={"account": account, "receipt_id": receipt_id}), **auth)


# -- replay admission ----------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_replay_admits_request_and_inert_receipt_and_repeats_return_the_same_ids(
        world, operator, delivered, enqueued, django_capture_on_commit_callbacks):
    """A replay creates one immutable ReplayRequest and one replay Receipt copying the exact predecessor
    component bytes, bound to the target epoch; the API then materializes it and answers the replayed event's
    disposition (here an execution of the replay's generation, external effects suppressed), so nothing is
    left to schedule. Submitting the same request ID with the same bytes again returns the same request and
    receipt as `duplicate` and writes nothing.
    Proves: CV2-09-005, CV2-09-006, CV2-09-008, CV2-09-010, CV2-15-002, CV2-15-006"""
    e2 = Event.objects.get(source_event_key="e-2")
    data = replay_body(world, e2)
    with django_capture_on_commit_callbacks(execute=True):
        first = replay(data, basic(operator))
    assert first.status_code == 201, first.content
    request = ReplayRequest.objects.get()
    receipt = Receipt.objects.get(kind=ReceiptKind.REPLAY)
    replayed = Event.objects.get(replay_request=request)
    execution_row = Execution.objects.get(projection__event=replayed)
    answer = first.json()
    assert {k: v for k, v in answer.items() if k != "events"} == {
        "request": request.pk, "request_id": "rr-1", "receipt": receipt.pk, "admission": "created",
        "target_epoch": data["target_epoch"], "v1_predecessor": None}
    assert answer["events"] == [{
        "event": replayed.pk, "partition": "r-1", "position": "2", "disposition": "execution", "high_water": None,
        "detail": f"runs as execution #{execution_row.pk} (generation 1 of the replay projection "
                  f"#{execution_row.projection_id}) with external effects suppressed; now ready",
        "execution": {"id": execution_row.pk, "generation": 1, "state": "ready", "outcome": None,
                      "suppress_external_effects": True}}]
    component = ReceiptComponent.objects.get(event=e2)
    assert bytes(receipt.payload) == bytes(component.payload)
    assert (request.reason, request.principal, request.mode) == (data["reason"], "user:approver-1",
                                                                 "suppress_external_effects")
    assert receipt.replay_request_id == request.pk and receipt.epoch_id == world.active_epoch.pk
    assert not MaterializationDue.objects.filter(receipt=receipt).exists() and enqueued == []
    assert ReceiptComponent.objects.filter(receipt=receipt).count() == 1
    before = replay_counts()
    with django_capture_on_commit_callbacks() as callbacks:
        again = replay(data, basic(operator))
    assert again.status_code == 200
    assert again.json() == {**first.json(), "admission": "duplicate"}
    assert replay_counts() == before and callbacks == []


@pytest.mark.django_db
@pytest.mark.parametrize("change", [{"reason": "a different reason"}, {"principal": "user:someone-else"}])
def test_replay_id_reused_with_different_bytes_fails_closed(world, operator, delivered, change):
    """The same replay request ID with a different reason or principal is REPLAY_MISMATCH (409) and writes
    nothing. Proves: CV2-09-010, CV2-15-006"""
    e2 = Event.objects.get(source_event_key="e-2")
    assert replay(replay_body(world, e2), basic(operator)).status_code == 201
    before = replay_counts()
    response = replay(replay_body(world, e2, **change), basic(operator))
    assert response.status_code == 409
    assert response.json()["code"] == "REPLAY_MISMATCH"
    assert replay_counts() == before


@pytest.mark.django_db
def test_distinct_replay_ids_are_distinct_generations_and_leave_the_predecessor_unchanged(world, operator,
                                                                                         delivered):
    """A different request ID for the same predecessor is a separate ReplayRequest and replay Receipt; the
    predecessor Event stays byte-identical. Proves: CV2-09-010"""
    e2 = Event.objects.get(source_event_key="e-2")
    snapshot = Event.objects.filter(pk=e2.pk).values().get()
    one = replay(replay_body(world, e2, "rr-1"), basic(operator)).json()
    two = replay(replay_body(world, e2, "rr-2"), basic(operator)).json()
    assert one["admission"] == two["admission"] == "created"
    assert one["request"] != two["request"] and one["receipt"] != two["receipt"]
    assert Event.objects.filter(pk=e2.pk).values().get() == snapshot


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["allow_external_effects", "", "SUPPRESS_EXTERNAL_EFFECTS",
                                  "suppress_external_effects "])
def test_replay_mode_other_than_suppress_external_effects_is_refused(world, operator, delivered, mode):
    """Any mode but exactly `suppress_external_effects` is REPLAY_MODE_REFUSED (400); nothing is written.
    Proves: CV2-09-017"""
    before = replay_counts()
    response = replay(replay_body(world, Event.objects.get(source_event_key="e-2"), mode=mode), basic(operator))
    assert response.status_code == 400
    assert response.json()["code"] == "REPLAY_MODE_REFUSED"
    assert replay_counts() == before


@pytest.mark.django_db
@pytest.mark.parametrize("case", ["wrong-digest", "unknown-event", "other-account-event", "blank-reason"])
def test_replay_predecessor_must_match_exactly(world, operator, delivered, case):
    """A predecessor digest that does not match the exact component bytes, an unknown Event or an Event of another
    account is REPLAY_PREDECESSOR_INVALID (422); a blank reason is REPLAY_REQUEST_INVALID (409); nothing is
    written. Proves: CV2-09-006"""
    e2 = Event.objects.get(source_event_key="e-2")
    data = replay_body(world, e2)
    if case == "wrong-digest":
        data["predecessor"]["payload_digest"] = hashlib.sha256(b"other bytes").hexdigest()
    elif case == "unknown-event":
        data["predecessor"]["event_id"] = e2.pk + 10_000
    elif case == "other-account-event":
        other = admit(Client(), body(event("x-1")), "k-other", account=OTHER).json()["receipt"]
        receipt_materialize(receipt_pk=other)
        foreign = Event.objects.get(account__account_key=OTHER)
        data = replay_body(world, foreign)  # the exact digest of the other account's event, asked under ACCOUNT
    else:
        data["reason"] = "   "
    before = replay_counts()
    response = replay(data, basic(operator))
    expected = (409, "REPLAY_REQUEST_INVALID") if case == "blank-reason" else (422, "REPLAY_PREDECESSOR_INVALID")
    assert (response.status_code, response.json()["code"]) == expected, response.content
    assert replay_counts() == before


@pytest.mark.django_db
def test_replay_on_a_halted_gate_is_refused_with_retry_after(world, operator, delivered):
    """Replay admission needs `v2_serving`: after `halt_v2` it is GATE_NOT_SERVING (503) with Retry-After and
    nothing is written. Proves: CV2-09-005, CV2-03-016"""
    data = replay_body(world, Event.objects.get(source_event_key="e-2"))
    gate_halt()
    before = replay_counts()
    response = replay(data, basic(operator))
    assert response.status_code == 503
    assert response.json()["code"] == "GATE_NOT_SERVING" and response["Retry-After"] == "5"
    assert replay_counts() == before


@pytest.mark.django_db
@pytest.mark.parametrize("target", ["verified-epoch", "wrong-digest"])
def test_replay_target_must_be_the_exact_active_epoch(world, operator, delivered, target):
    """A target epoch that is not the gate's exact active epoch (a verified candidate, or the right ID with a
    different digest) is refused as a request error, not a retryable one (REPLAY_REQUEST_INVALID, 409); nothing is
    written. Proves: CV2-09-005, CV2-03-017"""
    data = replay_body(world, Event.objects.get(source_event_key="e-2"))
    if target == "verified-epoch":
        data["target_epoch"] = {"id": world.verified_epoch.epoch_id,
                                "digest": bytes(world.verified_epoch.digest).hex()}
    else:
        data["target_epoch"]["digest"] = "00" * 32
    before = replay_counts()
    response = replay(data, basic(operator))
    assert response.status_code == 409
    assert response.json()["code"] == "REPLAY_REQUEST_INVALID"
    assert replay_counts() == before


@pytest.mark.django_db
@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.pop("reason"), "reason"),
    (lambda d: d.update(request_id=17), "request_id"),
    (lambda d: d["predecessor"].update(payload_digest="xyz"), "predecessor"),
    (lambda d: d["predecessor"].update(payload_digest=" " + "ab" * 32), "predecessor"),
    (lambda d: d["predecessor"].update(event_id="one"), "predecessor"),
    (lambda d: d["predecessor"].update(event_id=2**63), "predecessor"),
    (lambda d: d.update(target_epoch="epoch-1"), "target_epoch"),
])
def test_malformed_replay_body_is_request_invalid(world, operator, delivered, mutate, field):
    """A missing or mistyped field is REQUEST_INVALID (400) with per-field detail; nothing is written."""
    data = replay_body(world, Event.objects.get(source_event_key="e-2"))
    mutate(data)
    before = replay_counts()
    response = replay(data, basic(operator))
    assert response.status_code == 400
    assert response.json()["code"] == "REQUEST_INVALID" and field in response.json()["detail"]
    assert replay_counts() == before


@pytest.mark.django_db
def test_replay_service_refuses_an_out_of_range_predecessor_id_with_a_catalog_error(world, delivered):
    """A predecessor id no Event can have is REPLAY_PREDECESSOR_INVALID, not an untranslated kernel error.
    Proves: CV2-09-006"""
    from connector.actors import Actor
    from connector.services.replay import ReplayPredecessorInvalid, replay_request_admit

    with pytest.raises(ReplayPredecessorInvalid):
        replay_request_admit(account_key=ACCOUNT, request_id="rr-range", target_epoch_id=world.active_epoch.epoch_id,
                             target_epoch_digest=bytes(world.active_epoch.digest), predecessor_event_id=2**63,
                             predecessor_payload_digest=b"\0" * 32, reason="r", principal="user:p",
                             mode="suppress_external_effects", actor=Actor.system("t"))


@pytest.mark.django_db
@pytest.mark.parametrize("request_id", [" rr-1", "rr-1 ", "", "rr\u200b"])
def test_noncanonical_replay_request_id_is_refused_untrimmed(world, operator, delivered, request_id):
    """A padded, empty or invisible-edged replay request ID is IDENTITY_INVALID (400), never trimmed; nothing
    is written. Proves: CV2-01-004, CV2-01-029"""
    before = replay_counts()
    response = replay(replay_body(world, Event.objects.get(source_event_key="e-2"), request_id), basic(operator))
    assert response.status_code == 400
    assert response.json()["code"] == "IDENTITY_INVALID"
    assert replay_counts() == before


@pytest.mark.django_db
def test_replay_body_must_be_json(world, operator, delivered):
    """A non-JSON content type is UNSUPPORTED_MEDIA_TYPE (415); a malformed JSON body is REQUEST_INVALID."""
    data = replay_body(world, Event.objects.get(source_event_key="e-2"))
    response = replay(json.dumps(data).encode(), basic(operator), content_type="text/plain")
    assert response.status_code == 415 and response.json()["code"] == "UNSUPPORTED_MEDIA_TYPE"
    response = replay(b"{not json", basic(operator))
    assert response.status_code == 400 and response.json()["code"] == "REQUEST_INVALID"
    assert ReplayRequest.objects.count() == 0


@pytest.mark.django_db
def test_oversized_replay_body_is_refused(world, operator, delivered, settings):
    """A replay body above DATA_UPLOAD_MAX_MEMORY_SIZE is BODY_TOO_LARGE (413) and nothing is written."""
    data = replay_body(world, Event.objects.get(source_event_key="e-2"))
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64
    response = replay(data, basic(operator))
    assert response.status_code == 413 and response.json()["code"] == "BODY_TOO_LARGE"
    assert ReplayRequest.objects.count() == 0


@pytest.mark.django_db
def test_replay_requires_an_authenticated_user_with_the_add_permission(world, delivered):
    """Anonymous or wrong-password calls are NOT_AUTHENTICATED (401, with a Basic challenge); a user without
    `connector.add_replayrequest` is PERMISSION_DENIED (403); nothing is written."""
    data = replay_body(world, Event.objects.get(source_event_key="e-2"))
    reader = user_with("view_receipt", username="reader")
    before = replay_counts()
    anonymous = replay(data, {})
    assert anonymous.status_code == 401 and anonymous.json()["code"] == "NOT_AUTHENTICATED"
    assert anonymous["WWW-Authenticate"].startswith("Basic")
    wrong = replay(data, basic(reader, "not-the-password"))
    assert wrong.status_code == 401 and wrong.json()["code"] == "NOT_AUTHENTICATED"
    denied = replay(data, basic(reader))
    assert denied.status_code == 403 and denied.json()["code"] == "PERMISSION_DENIED"
    assert replay_counts() == before


@pytest.mark.django_db
def test_session_replay_needs_the_csrf_token(world, operator, delivered):
    """A logged-in session may replay only with a CSRF token (SessionAuthentication); without it the call is
    PERMISSION_DENIED (403) and nothing is written."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    response = replay(replay_body(world, Event.objects.get(source_event_key="e-2")), {}, client=client)
    assert response.status_code == 403 and response.json()["code"] == "PERMISSION_DENIED"
    assert "CSRF" in response.json()["detail"]
    assert ReplayRequest.objects.count() == 0


@pytest.mark.django_db
def test_unknown_account_replay_is_account_not_found(world, operator, delivered):
    response = replay(replay_body(world, Event.objects.get(source_event_key="e-2")), basic(operator),
                      account="w-nobody")
    assert response.status_code == 404 and response.json()["code"] == "ACCOUNT_NOT_FOUND"


# -- reads ---------------------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_receipt_detail_shows_epoch_components_and_no_payload(world, operator, delivered):
    """The receipt read returns its exact epoch, kind, component counts and each component's disposition and
    event, and digests only, never payload bytes. Proves: CV2-05-011, CV2-05-015"""
    receipt, _ = delivered
    response = read("detail", basic(operator), receipt.pk)
    assert response.status_code == 200, response.content
    data = response.json()
    events = dict(Event.objects.values_list("source_event_key", "pk"))
    assert data["epoch"] == {"id": world.active_epoch.epoch_id, "digest": bytes(world.active_epoch.digest).hex()}
    assert (data["id"], data["account"], data["kind"], data["channel"]) == (receipt.pk, ACCOUNT, "transport",
                                                                           "records.webhook")
    assert (data["component_count"], data["materialized_component_count"]) == (3, 3)
    assert data["materialization_pending"] is False and data["replay_request"] is None
    assert data["payload_digest"] == bytes(receipt.payload_digest).hex()
    assert [(c["ordinal"], c["disposition"], c["event"]) for c in data["components"]] == [
        (0, "event", events["e-1"]), (1, "event", events["e-2"]), (2, "event", events["e-3"])]
    assert "payload" not in data and all("payload" not in c for c in data["components"])
    assert b"ada@example.com" not in response.content


@pytest.mark.django_db
def test_receipt_detail_before_materialization_shows_it_pending(world, operator):
    """A committed receipt whose children are not yet materialized shows 0 materialized components and a
    pending materialization."""
    pk = admit(Client(), body(), "k-1").json()["receipt"]
    data = read("detail", basic(operator), pk).json()
    assert (data["component_count"], data["materialized_component_count"], data["components"]) == (1, 0, [])
    assert data["materialization_pending"] is True


@pytest.mark.django_db
def test_receipt_events_show_projection_ordering_decision_and_executions(world, operator, delivered):
    """The events read lists each event with its ordering facts, projection, superseded decision and executions
    (state, attempts, outcome, command ID). Position 1 of r-1 is superseded by position 2 without an Execution;
    the claimed execution completed with one attempt. Proves: CV2-05-015, CV2-06-006, CV2-06-012"""
    receipt, out = delivered
    for lane_pk in sorted(out.lanes):
        execution.lane_advance(lane_pk=lane_pk)
    token = execution.execution_claim(holder="test", account_id=receipt.account_id)
    execution.execution_run(token=token)
    response = read("events", basic(operator), receipt.pk)
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["receipt"] == receipt.pk
    by_key = {e["source_event_key"]: e for e in data["events"]}
    assert [e["source_event_key"] for e in data["events"]] == ["e-1", "e-2", "e-3"]
    e1, e2, e3 = by_key["e-1"], by_key["e-2"], by_key["e-3"]
    assert (e1["partition"], e1["position"], e1["kind"], e1["component_disposition"]) == (
        "r-1", "1", "record.updated", "event")
    assert e1["superseded"]["reason"] == "lower_than_selected" and e1["superseded"]["selected_position"] == "2"
    assert e1["executions"] == [] and e1["projection"] is not None and e1["window"] is None
    assert e2["superseded"] is None and e3["superseded"] is None
    assert e1["epoch"] == e2["epoch"] == world.active_epoch.epoch_id
    executions = {e["source_event_key"]: e["executions"] for e in (e2, e3)}
    assert all(len(x) == 1 for x in executions.values())
    claimed = [x[0] for x in executions.values() if x[0]["id"] == token.execution_pk][0]
    waiting = [x[0] for x in executions.values() if x[0]["id"] != token.execution_pk][0]
    assert (claimed["state"], claimed["attempt_count"], claimed["result_outcome"]) == ("completed", 1, "applied")
    assert claimed["command_id"].startswith("cmd-")
    assert (waiting["state"], waiting["attempt_count"], waiting["result_outcome"]) == ("ready", 0, "")
    assert b"ada@example.com" not in response.content


@pytest.mark.django_db
def test_receipt_events_include_linked_duplicates_and_omit_quarantined_components(world, operator, delivered):
    """A later receipt repeating e-1's exact bytes links the existing Event (`duplicate_event`); a conflicting
    e-3 is a quarantined component with EVENT_KEY_CONFLICT and no Event. Proves: CV2-05-011, CV2-15-004"""
    pk = admit(Client(), body(event("e-1", "r-1", 1), event("e-3", "r-2", 1, name="Changed")), "k-2").json()[
        "receipt"]
    receipt_materialize(receipt_pk=pk)
    detail = read("detail", basic(operator), pk).json()
    assert [(c["disposition"], c["reason_code"]) for c in detail["components"]] == [
        ("duplicate_event", ""), ("quarantined", "EVENT_KEY_CONFLICT")]
    events = read("events", basic(operator), pk).json()["events"]
    assert [(e["source_event_key"], e["component_disposition"], e["id"]) for e in events] == [
        ("e-1", "duplicate_event", Event.objects.get(source_event_key="e-1").pk)]


@pytest.mark.django_db
def test_replay_receipt_reads_show_the_replay_generation(world, operator, delivered):
    """A materialized replay receipt reads as kind `replay` with its request ID; its event carries the request
    and the predecessor. Proves: CV2-09-009"""
    e2 = Event.objects.get(source_event_key="e-2")
    admitted = replay(replay_body(world, e2), basic(operator)).json()
    receipt_materialize(receipt_pk=admitted["receipt"])
    detail = read("detail", basic(operator), admitted["receipt"]).json()
    assert (detail["kind"], detail["replay_request"], detail["materialized_component_count"]) == ("replay", "rr-1",
                                                                                                   1)
    [replayed] = read("events", basic(operator), admitted["receipt"]).json()["events"]
    assert (replayed["source_event_key"], replayed["replay_request"], replayed["predecessor"]) == ("e-2", "rr-1",
                                                                                                  e2.pk)
    assert replayed["id"] != e2.pk


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["detail", "events"])
def test_reads_are_scoped_to_the_account(world, operator, delivered, path):
    """A receipt is readable only under its own account: under another account it is NOT_FOUND (404), an unknown
    account is ACCOUNT_NOT_FOUND, an unknown id NOT_FOUND."""
    receipt, _ = delivered
    foreign = read(path, basic(operator), receipt.pk, account=OTHER)
    assert foreign.status_code == 404 and foreign.json()["code"] == "NOT_FOUND"
    assert b"ada@example.com" not in foreign.content
    unknown = read(path, basic(operator), receipt.pk, account="w-nobody")
    assert unknown.status_code == 404 and unknown.json()["code"] == "ACCOUNT_NOT_FOUND"
    missing = read(path, basic(operator), receipt.pk + 10_000)
    assert missing.status_code == 404 and missing.json()["code"] == "NOT_FOUND"


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["detail", "events"])
def test_reads_require_the_view_permission(world, delivered, path):
    """Reads need an authenticated user (401 otherwise) holding `connector.view_receipt` (403 otherwise)."""
    receipt, _ = delivered
    assert read(path, {}, receipt.pk).json()["code"] == "NOT_AUTHENTICATED"
    replayer = user_with("add_replayrequest", username="replayer")
    denied = read(path, basic(replayer), receipt.pk)
    assert denied.status_code == 403 and denied.json()["code"] == "PERMISSION_DENIED"
    session = Client()
    session.force_login(user_with("view_receipt", username="viewer"))
    assert read(path, {}, receipt.pk, client=session).status_code == 200


@pytest.mark.django_db
def test_reads_render_json_only(world, operator, delivered):
    """An `Accept` header that excludes JSON is NOT_ACCEPTABLE (406), answered in JSON."""
    receipt, _ = delivered
    response = read("detail", {**basic(operator), "HTTP_ACCEPT": "text/html"}, receipt.pk)
    assert response.status_code == 406 and response.json()["code"] == "NOT_ACCEPTABLE"


@pytest.mark.django_db
def test_events_read_uses_a_constant_number_of_queries(world, operator):
    """The events read costs the same number of queries for one event as for five (no per-event queries)."""
    one = admit(Client(), body(event("q-1", "q-r1", 1)), "q-1").json()["receipt"]
    five = admit(Client(), body(*(event(f"q5-{i}", f"q5-r{i % 2}", i + 1) for i in range(5))), "q-5").json()[
        "receipt"]
    for pk in (one, five):
        out = receipt_materialize(receipt_pk=pk)
        for lane_pk in sorted(out.lanes):
            execution.lane_advance(lane_pk=lane_pk)
    auth = basic(operator)
    read("events", auth, one)  # warm caches (content types, permissions)
    sizes = []
    for pk in (one, five):
        with CaptureQueriesContext(connection) as queries:
            assert read("events", auth, pk).status_code == 200
        sizes.append(len(queries))
    assert sizes[0] == sizes[1]


# -- error handler, catalog and schema ------------------------------------------------------------------------------

@pytest.mark.django_db
def test_unexpected_error_is_internal_error_with_the_catalog_body(world, operator, monkeypatch):
    """An exception no handler knows is logged and answered 500 INTERNAL_ERROR with the catalog body."""
    def broken(**kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(api_views, "_receipt_get", broken)
    response = read("detail", basic(operator), 1, client=Client(raise_request_exception=False))
    assert response.status_code == 500
    assert response.json() == {"code": "INTERNAL_ERROR", "detail": API_ERROR_CODES["INTERNAL_ERROR"][1]}


def _schema(tmp_path) -> dict:
    GENERATOR_STATS.reset()
    path = tmp_path / "schema.yaml"
    err = io.StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(path), stderr=err)
    assert err.getvalue().strip() == "" and not GENERATOR_STATS
    return yaml.safe_load(path.read_text())


@pytest.mark.django_db
def test_openapi_schema_validates_without_warnings_and_documents_the_api(tmp_path):
    """`manage.py spectacular --validate --fail-on-warn` passes; the admission operation documents both
    headers, the raw body, every status it can return and Retry-After on 503; every error status uses the
    Error component whose `code` enum is the catalog."""
    schema = _schema(tmp_path)
    admit_op = schema["paths"]["/api/v2/accounts/{account}/channels/{channel}/receipts"]["post"]
    headers = {p["name"]: p for p in admit_op["parameters"] if p["in"] == "header"}
    assert headers["Idempotency-Key"]["required"] and headers["Connector-Signature"]["required"]
    assert set(admit_op["responses"]) >= {"200", "201", "400", "401", "404", "409", "413", "503"}
    assert "Retry-After" in admit_op["responses"]["503"]["headers"]
    assert admit_op["requestBody"]["content"]["*/*"]["schema"] == {"type": "string", "format": "binary"}
    replay_op = schema["paths"]["/api/v2/accounts/{account}/replays"]["post"]
    assert set(replay_op["responses"]) >= {"200", "201", "400", "401", "403", "404", "409", "415", "422", "503"}
    for path in ("/api/v2/accounts/{account}/receipts/{receipt_id}",
                 "/api/v2/accounts/{account}/receipts/{receipt_id}/events"):
        assert set(schema["paths"][path]["get"]["responses"]) >= {"200", "401", "403", "404"}
    error_schema = schema["components"]["schemas"]["Error"]
    code_ref = error_schema["properties"]["code"]["$ref"].rsplit("/", 1)[-1]
    assert schema["components"]["schemas"][code_ref]["enum"] == sorted(API_ERROR_CODES)
    for path_item in schema["paths"].values():
        for operation in path_item.values():
            for code, response in operation["responses"].items():
                if int(code) >= 400:
                    assert response["content"]["application/json"]["schema"]["$ref"].endswith("/Error")


@pytest.mark.django_db
def test_schema_is_served_at_api_schema():
    """The schema is public at /api/schema/ and lists the four operations."""
    response = Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    operations = {op["operationId"] for item in response.json()["paths"].values() for op in item.values()}
    assert operations >= {"receipt_admit", "replay_request_admit", "receipt_get", "receipt_event_list"}


def test_docs_error_catalog_matches_the_handler_catalog():
    """docs/api.md lists exactly the codes and statuses of connector.api.exceptions.API_ERROR_CODES."""
    text = (Path(django_settings.BASE_DIR) / "docs" / "api.md").read_text()
    table = dict(re.findall(r"^\| `([A-Z0-9_]+)` \| (\d{3}) \|", text, flags=re.MULTILINE))
    assert table == {code: str(status) for code, (status, _) in API_ERROR_CODES.items()}
