"""The admission dispatch of config/wsgi.py (D-540): the signed transport POST runs through a handler of its own
(settings.ADMISSION_MIDDLEWARE, config.urls_admission, connector.api.admission_direct.receipt_admit_direct) and
answers exactly what the whole stack (every middleware, DRF's ReceiptAdmitApi) answers: status, body bytes and headers,
for every outcome and refusal; on real PostgreSQL, each refusal writing nothing."""
from __future__ import annotations

import io
import json
import time

import pytest
from axes.middleware import AxesMiddleware
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.middleware.csrf import CsrfViewMiddleware

from config.wsgi import AdmissionHandler, application
from connector import tasks
from connector.api.views import ReceiptAdmitApi, _admission_data
from connector.models import Receipt, ReceiptAdmissionKey
from connector.services.signatures import sign
from observability.admission import ADMISSION
from tests.connector.test_api_admission import ACCOUNT, CHANNEL, body, counts, event, signing_secret

PATH = f"/api/v2/accounts/{ACCOUNT}/channels/{CHANNEL}/receipts"


@pytest.fixture(autouse=True)
def enqueued(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(tasks, "materialization_wake", lambda account_id, slot=0: calls.append(account_id))
    return calls


def call(app, payload: bytes, *, key: str | None = "k-1", path: str = PATH, method: str = "POST",
         signature: str | None = None, secret: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request through a WSGI callable, as gunicorn hands it over."""
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
               "SERVER_NAME": "testserver", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
               "REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "testserver", "CONTENT_TYPE": "application/json",
               "CONTENT_LENGTH": str(len(payload)), "wsgi.version": (1, 0), "wsgi.url_scheme": "http",
               "wsgi.input": io.BytesIO(payload), "wsgi.errors": io.StringIO(), "wsgi.multithread": True,
               "wsgi.multiprocess": True, "wsgi.run_once": False}
    if key is not None:
        environ["HTTP_IDEMPOTENCY_KEY"] = key
    if signature is None:
        signature = sign(secret or signing_secret(), int(time.time()), payload)
    if signature:
        environ["HTTP_CONNECTOR_SIGNATURE"] = signature
    seen: dict = {}

    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = int(status.split()[0]), dict(headers)

    # As Django's test client does: the test's connection (and its transaction) must survive the request.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        result = app(environ, start_response)
        content = b"".join(result)
        result.close()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    return seen["status"], seen["headers"], content


@pytest.fixture
def whole():
    return WSGIHandler()  # settings.MIDDLEWARE and config.urls: what every request ran before the dispatch


def test_the_dispatch_sends_only_the_admission_post_to_the_admission_handler():
    assert isinstance(application.admission, AdmissionHandler)
    assert application.whole is not application.admission


@pytest.mark.django_db
def test_direct_answers_equal_the_whole_stack_for_every_outcome_and_refusal(world, whole, settings):
    """Same status, body bytes and headers through the dispatch as through every middleware and DRF: a duplicate,
    a digest mismatch, each refusal before the statement, an unknown account and channel, a body too large; the
    refusals write nothing. A created receipt differs from another only by its id."""
    first = body(event("e-1"))
    created_whole = call(whole, first, key="k-whole")
    created_direct = call(application, first, key="k-direct")
    assert created_whole[0] == created_direct[0] == 201
    for _, headers, content in (created_whole, created_direct):  # the receipt ids may differ in length
        assert headers.pop("Content-Length") == str(len(content))
    assert created_whole[1] == created_direct[1]
    a, b = json.loads(created_whole[2]), json.loads(created_direct[2])
    assert b["receipt"] == a["receipt"] + 1 and {**a, "receipt": 0} == {**b, "receipt": 0}
    before = counts()
    cases = {
        "duplicate": dict(payload=first, key="k-whole"),
        "digest mismatch": dict(payload=body(event("e-2")), key="k-whole"),
        "bad signature": dict(payload=first, key="k-2", signature="t=1,v1=00"),
        "no signature": dict(payload=first, key="k-2", signature=""),
        "no key": dict(payload=first, key=None),
        "padded key": dict(payload=first, key=" k-2"),
        "unparseable": dict(payload=b"{not json", key="k-3"),
        "unknown account": dict(payload=first, key="k-4",
                                path=f"/api/v2/accounts/nobody/channels/{CHANNEL}/receipts"),
        "unknown channel": dict(payload=first, key="k-5",
                                path=f"/api/v2/accounts/{ACCOUNT}/channels/nothing/receipts"),
    }
    for name, case in cases.items():
        assert call(whole, **case) == call(application, **case), name
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 16
    large = dict(payload=first, key="k-6")
    assert call(whole, **large) == call(application, **large)
    assert call(application, **large)[0] == 413
    assert counts() == before


@pytest.mark.django_db
def test_admission_data_is_the_output_serializer_representation(world):
    """receipt_admit_direct and ReceiptAdmitApi build the answer without the serializer; the schema's serializer
    renders the same data."""
    status, _, content = call(application, body(event("e-1")))
    assert status == 201
    from connector.services.admission import Admission

    receipt = Receipt.objects.select_related("epoch").get()
    admission = Admission("created", receipt, ReceiptAdmissionKey.objects.get())
    serialized = ReceiptAdmitApi.OutputSerializer({  # the serializer's input as the view gave it before D-540
        "receipt": receipt.pk, "admission": "created", "component_count": receipt.component_count,
        "epoch": {"id": receipt.epoch.epoch_id, "digest": bytes(receipt.epoch_digest)}}).data
    assert _admission_data(admission) == serialized == json.loads(content)
    tombstone = {"receipt": None, "admission": "v1_accepted", "epoch": None, "component_count": None}
    assert _admission_data(Admission("v1_accepted", None, None)) == ReceiptAdmitApi.OutputSerializer(tombstone).data


@pytest.mark.django_db
def test_the_admission_runs_no_session_csrf_auth_messages_or_axes_middleware(world, whole, monkeypatch):
    """The dispatch runs none of the stack the signed POST does not need; the same request through the whole stack
    does (so this test fails if the dispatch stops dispatching)."""
    def refuse(*args, **kwargs):
        raise AssertionError("middleware ran")

    for cls, name in ((SessionMiddleware, "process_request"), (CsrfViewMiddleware, "process_view"),
                      (AuthenticationMiddleware, "process_request"), (MessageMiddleware, "process_request"),
                      (AxesMiddleware, "__call__")):
        monkeypatch.setattr(cls, name, refuse)
    status, headers, _ = call(application, body(event("e-1")), key="k-lean")
    assert status == 201
    assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff"
    assert "Content-Security-Policy" in headers
    with pytest.raises(AssertionError, match="middleware ran"):
        call(WSGIHandler(), body(event("e-2", record_id="r-2")), key="k-whole")


@pytest.mark.django_db
def test_the_admission_metrics_count_the_direct_answers(world):
    """observability's admission histogram observes every direct answer by outcome, refusals included."""
    before = {o: _samples(o) for o in ("created", "SIGNATURE_INVALID")}
    assert call(application, body(event("e-1")))[0] == 201
    assert call(application, body(event("e-1")), key="k-2", signature="t=1,v1=00")[0] == 401
    assert _samples("created") == before["created"] + 1
    assert _samples("SIGNATURE_INVALID") == before["SIGNATURE_INVALID"] + 1


def _samples(outcome: str) -> float:
    for metric in ADMISSION.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.labels.get("outcome") == outcome:
                return sample.value
    return 0.0


@pytest.mark.django_db
def test_other_methods_on_the_admission_path_take_the_whole_stack(world):
    """Only the POST is dispatched; a GET answers the whole stack's 405 METHOD_NOT_ALLOWED catalog body."""
    status, headers, content = call(application, b"", method="GET")
    assert status == 405 and json.loads(content)["code"] == "METHOD_NOT_ALLOWED"
