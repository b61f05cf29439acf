"""Schemathesis against the app's own OpenAPI schema (GET /api/schema/ through the WSGI app, in process): generated
requests to the admission, replay and read endpoints. For every request: no 5xx; the response conforms to the
schema (status code, content type, body); every error body is exactly `{"code", "detail"}` with a code of
connector.api.exceptions.API_ERROR_CODES whose catalog status is the response status; and a rejected request
(4xx) writes nothing (row counts of every connector/effects table unchanged).

Two passes per operation: `raw` sends what the schema allows, as generated (hostile headers, keys, bodies, path
parameters); `aimed` additionally points part of the requests at the real account and channel, signs the
generated body with the account's secret, authenticates as an operator and names real epochs, events and
receipts, so generated values reach the deeper checks (key canonicalization, body parsing, replay validation,
reads) instead of stopping at 401/404."""
from __future__ import annotations

import base64
import time
from urllib.parse import urlsplit

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, connection
from django.urls import Resolver404, resolve
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from connector.api.exceptions import API_ERROR_CODES
from tests.hostile.support import OPERATOR, OPERATOR_PASSWORD, ApiWorld, build_api_world, row_counts

APP = get_wsgi_application()
SCHEMA = schemathesis.openapi.from_wsgi("/api/schema/", APP)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
FUZZ = settings(max_examples=80, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much, HealthCheck.data_too_large])


@pytest.fixture
def api_world(db) -> ApiWorld:
    """The world, and the WSGI app kept off connection recycling: like Django's test client, requests must not
    close the test's connection (and its transaction) at request start and end."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield build_api_world()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def flag(data, label: str) -> bool:
    """A drawn choice whose simplest (shrunk, derandomized-first) value is True: aim unless told otherwise."""
    return data.draw(st.sampled_from([True, False]), label=label)


def aim(case, world: ApiWorld, data) -> None:
    """Point a generated case at real rows and credentials (each choice drawn, so both sides are explored)."""
    path = case.operation.path
    if "account" in case.path_parameters and flag(data, "real account"):
        case.path_parameters["account"] = world.account_key
    real_account = case.path_parameters.get("account") == world.account_key
    headers = case.headers if case.headers is not None else {}
    case.headers = headers
    if path.endswith("/receipts") and "channels" in path:
        if flag(data, "real channel"):
            case.path_parameters["channel"] = world.channel
        body = case.body if isinstance(case.body, bytes) else (case.body or "").encode() \
            if isinstance(case.body, str) else b""
        case.body = body
        if real_account and flag(data, "valid signature"):
            headers["Connector-Signature"] = world.sign(body, int(time.time()))
        if data.draw(st.booleans(), label="canonical key"):
            headers["Idempotency-Key"] = f"fuzz-{data.draw(st.integers(0, 10**6), label='key')}"
        if data.draw(st.booleans(), label="real body"):
            case.body = world.delivery(data.draw(st.integers(0, 10**6), label="event"))
            if real_account:
                headers["Connector-Signature"] = world.sign(case.body, int(time.time()))
        return
    if flag(data, "operator"):
        headers["Authorization"] = _basic(OPERATOR, OPERATOR_PASSWORD)
    if "receipt_id" in case.path_parameters and flag(data, "real receipt"):
        case.path_parameters["receipt_id"] = world.receipt_id
    if path.endswith("/replays") and isinstance(case.body, dict) and flag(data, "real refs"):
        case.body["target_epoch"] = {"id": world.epoch_id, "digest": world.epoch_digest}
        case.body["predecessor"] = {"event_id": world.event_id, "payload_digest": world.event_digest}


def routes(case) -> bool:
    """Whether Django's URL resolver maps the generated path to a view (a negative-mode path parameter such as
    receipt_id="null,null" does not match `<int:receipt_id>`)."""
    try:
        match = resolve(urlsplit(case.formatted_path).path)
    except Resolver404:
        return False
    return match.url_name != "not-found"  # the /api/ catch-all answers the catalog's JSON NOT_FOUND


def verify(case, response, before: dict[str, int]) -> None:
    if not routes(case):
        # An unroutable /api/ path answers the catalog's JSON NOT_FOUND, and nothing is written.
        assert response.status_code == 404 and row_counts() == before
        assert response.json()["code"] == "NOT_FOUND"
        return
    case.validate_response(response, checks=CHECKS)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        body = response.json()
        assert isinstance(body, dict) and set(body) == {"code", "detail"}, body
        assert body["code"] in API_ERROR_CODES, body
        assert API_ERROR_CODES[body["code"]][0] == response.status_code, (body, response.status_code)
        after = row_counts()
        assert after == before, {t: (before[t], after[t]) for t in after if after[t] != before[t]}


@pytest.mark.django_db
@SCHEMA.parametrize()
@FUZZ
def test_generated_requests_raw(case, api_world):
    before = row_counts()
    verify(case, case.call(), before)


@pytest.mark.django_db
@SCHEMA.parametrize()
@SCHEMA.given(data=st.data())
@FUZZ
def test_generated_requests_aimed(case, data, api_world):
    aim(case, api_world, data)
    before = row_counts()
    verify(case, case.call(), before)


def test_schema_covers_the_admission_replay_and_read_endpoints():
    operations = {(op.ok().method.upper(), op.ok().path) for op in SCHEMA.get_all_operations()}
    assert operations == {
        ("POST", "/api/v2/accounts/{account}/channels/{channel}/receipts"),
        ("POST", "/api/v2/accounts/{account}/replays"),
        ("GET", "/api/v2/accounts/{account}/receipts/{receipt_id}"),
        ("GET", "/api/v2/accounts/{account}/receipts/{receipt_id}/events"),
        ("GET", "/api/v2/accounts/{account}/replays/{request_id}"),
    }
    assert connection.vendor == "postgresql"


@pytest.mark.django_db
def test_unroutable_api_url_answers_the_json_error_body(client):
    response = client.get("/api/v2/accounts/x/receipts/not-a-number", HTTP_ACCEPT="application/json")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    assert response.json()["code"] == "NOT_FOUND"
