"""Transport admission over HTTP (`POST /api/v2/accounts/{account}/channels/{channel}/receipts`) and the V1
tombstone import command, on real PostgreSQL. Every refusal is checked to write nothing."""
from __future__ import annotations

import hashlib
import io
import json
import logging
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.urls import reverse
from kombu.exceptions import OperationalError as KombuOperationalError

from connector import tasks
from connector.actors import Actor
from connector.demo import build_world
from connector.models import (
    AccountServingGate,
    CredentialGeneration,
    Event,
    MaterializationDue,
    Receipt,
    ReceiptAdmissionKey,
    ReceiptComponent,
    V1AcceptanceTombstone,
)
from connector.secrets import secret_backend
from connector.services import gates as gate_services
from connector.services.materialize import receipt_materialize
from connector.services.signatures import sign
from tests.concurrency import raised, run_concurrently

ACCOUNT = "w-acme-eu"
OTHER = "w-globex-us"
CHANNEL = "records.webhook"
ACTOR = Actor.system("test")
SIGN = object()  # sentinel: sign the body with the account's signing secret


# -- helpers (also used by test_api_replay_and_reads) ---------------------------------------------------------------

def event(id: str = "e-1", record_id: str = "r-1", sequence: int = 1, name: str = "Ada",
          email: str = "ada@example.com") -> dict:
    return {"id": id, "type": "record.updated", "record_id": record_id, "sequence": sequence,
            "occurred_at": "2026-01-01T00:00:00Z", "data": {"name": name, "email": email}}


def body(*events: dict) -> bytes:
    return json.dumps({"events": list(events or [event()])}).encode()


def signing_secret(account_key: str = ACCOUNT) -> bytes:
    generation = CredentialGeneration.objects.get(generation_id=f"{account_key}.webhook-signing.g1")
    return secret_backend().read(generation.secret_version_ref)


def wsgi(text: str) -> str:
    """A header value as a WSGI server hands it to Django: the UTF-8 bytes sent, decoded as latin-1."""
    return text.encode("utf-8").decode("latin-1")


def admit(client: Client, payload: bytes, key: str | None = "k-1", *, account: str = ACCOUNT,
          channel: str = CHANNEL, signature: object = SIGN, secret: bytes | None = None,
          timestamp: int | None = None, content_type: str = "application/json"):
    headers = {}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    if signature is SIGN:
        signature = sign(secret if secret is not None else signing_secret(account),
                         timestamp if timestamp is not None else int(time.time()), payload)
    if signature is not None:
        headers["HTTP_CONNECTOR_SIGNATURE"] = signature
    url = reverse("connector-api:receipt-admit", kwargs={"account": account, "channel": channel})
    return client.post(url, data=payload, content_type=content_type, **headers)


def counts() -> dict[str, int]:
    """Row counts of every table an admission or materialization writes."""
    return {"receipts": Receipt.objects.count(), "keys": ReceiptAdmissionKey.objects.count(),
            "due": MaterializationDue.objects.count(), "components": ReceiptComponent.objects.count(),
            "events": Event.objects.count()}


def gate_halt(account_key: str = ACCOUNT) -> AccountServingGate:
    gate = AccountServingGate.objects.get(account__account_key=account_key)
    return gate_services.gate_transition(account_id=gate.account_id, action="halt_v2", expected_fence=gate.fence,
                                         actor=Actor.system("t"))


@pytest.fixture(autouse=True)
def enqueued(monkeypatch):
    """Materialization enqueues are recorded instead of reaching the broker; tests materialize explicitly."""
    calls: list[int] = []
    monkeypatch.setattr(tasks, "materialization_wake",  # one wake-up per account and slot (D-269)
                        lambda account_id, slot=0: calls.append(account_id))
    return calls


@pytest.fixture
def client():
    return Client()


# -- admission -----------------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_new_delivery_creates_one_receipt_bound_to_the_active_epoch(world, client, enqueued,
                                                                   django_capture_on_commit_callbacks):
    """A signed delivery with a new key creates one Receipt holding the exact bytes, its admission key and its
    materialization work row, bound to the gate's exact active epoch and fence; materialization is enqueued only
    after commit. Proves: CV2-05-001, CV2-05-003, CV2-05-009, CV2-05-015"""
    payload = body(event("e-1"), event("e-2", record_id="r-2"))
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = admit(client, payload)
    assert response.status_code == 201, response.content
    receipt = Receipt.objects.get()
    assert response.json() == {
        "receipt": receipt.pk, "admission": "created", "component_count": 2,
        "epoch": {"id": world.active_epoch.epoch_id, "digest": bytes(world.active_epoch.digest).hex()}}
    assert bytes(receipt.payload) == payload
    assert bytes(receipt.payload_digest) == hashlib.sha256(payload).digest()
    assert receipt.gate_fence == AccountServingGate.objects.get(account__account_key=ACCOUNT).fence
    key = ReceiptAdmissionKey.objects.get()
    assert (key.transport_key, key.channel, key.receipt_id, key.tombstone_id) == ("k-1", CHANNEL, receipt.pk, None)
    assert MaterializationDue.objects.filter(receipt=receipt).exists()
    assert len(callbacks) == 1 and enqueued == [receipt.account_id]
    assert counts()["events"] == 0  # children come from the second transaction (receipt_materialize)


@pytest.mark.django_db
def test_body_is_admitted_as_the_exact_bytes_whatever_the_content_type(world, client):
    """The Receipt keeps the body byte for byte (whitespace, key order), whatever the declared content type; the
    signature covers those bytes. Proves: CV2-05-009"""
    payload = b'{ "events" : [\n  {"type": "record.updated", "id": "e-9", "record_id": "r-9", "sequence": 3,\n' \
              b'   "occurred_at": "2026-01-01T00:00:00Z", "data": {"email": "x@example.com", "name": "X"}} ] }\n'
    response = admit(client, payload, content_type="text/plain; charset=latin-1")
    assert response.status_code == 201, response.content
    assert bytes(Receipt.objects.get().payload) == payload


@pytest.mark.django_db
def test_retry_with_the_same_bytes_returns_the_original_receipt_and_epoch(world, client,
                                                                         django_capture_on_commit_callbacks):
    """A retry of a committed delivery (the acknowledgement was lost) resolves to the original Receipt and its
    epoch with 200 `duplicate`, writes nothing and schedules nothing, even after the gate moved on (halted: the
    duplicate is resolved before the serving guard). Proves: CV2-05-004, CV2-05-006, CV2-05-016"""
    payload = body()
    first = admit(client, payload).json()
    before = counts()
    with django_capture_on_commit_callbacks() as callbacks:
        again = admit(client, payload)
        gate_halt()
        halted = admit(client, payload)
    assert again.status_code == 200 and halted.status_code == 200
    assert again.json() == halted.json() == {**first, "admission": "duplicate"}
    assert halted.json()["epoch"] == {"id": world.active_epoch.epoch_id,
                                      "digest": bytes(world.active_epoch.digest).hex()}
    assert counts() == before
    assert callbacks == []  # a duplicate never schedules materialization again


@pytest.mark.django_db
def test_retry_with_different_bytes_fails_closed(world, client):
    """The same key with different bytes is RECEIPT_DIGEST_MISMATCH (409) and writes nothing.
    Proves: CV2-05-004, CV2-01-029"""
    admit(client, body(event(name="Ada")))
    before = counts()
    response = admit(client, body(event(name="Eve")))
    assert response.status_code == 409
    assert response.json()["code"] == "RECEIPT_DIGEST_MISMATCH"
    assert counts() == before


@pytest.mark.django_db
def test_key_namespace_is_per_account_and_channel(world, client):
    """The same transport key on two accounts names two deliveries: one ReceiptAdmissionKey per (account,
    channel, key). Proves: CV2-15-001"""
    assert admit(client, body(), "shared-key").status_code == 201
    assert admit(client, body(), "shared-key", account=OTHER).status_code == 201
    assert ReceiptAdmissionKey.objects.filter(transport_key="shared-key").count() == 2
    assert set(Receipt.objects.values_list("account__account_key", flat=True)) == {ACCOUNT, OTHER}


@pytest.mark.django_db
def test_canonical_non_ascii_key_is_stored_exactly(world, client):
    """A canonical key outside ASCII, sent as UTF-8 header bytes, is admitted and stored as exactly that text.
    Proves: CV2-01-003"""
    response = admit(client, body(), wsgi("clé-ü-1"))
    assert response.status_code == 201, response.content
    assert ReceiptAdmissionKey.objects.get().transport_key == "clé-ü-1"
    assert admit(client, body(), wsgi("clé-ü-1")).json()["admission"] == "duplicate"


@pytest.mark.django_db
@pytest.mark.parametrize("key,reason", [
    pytest.param(" k", "IDENTITY_WHITESPACE", id="leading-space"),
    pytest.param("k ", "IDENTITY_WHITESPACE", id="trailing-space"),
    pytest.param("\tk", "IDENTITY_WHITESPACE", id="leading-tab"),
    pytest.param("", "IDENTITY_EMPTY", id="empty"),
    pytest.param(None, "IDENTITY_NULL", id="missing"),
    pytest.param(wsgi("\u200bk"), "IDENTITY_WHITESPACE", id="leading-zero-width-space"),
    pytest.param(wsgi("k\ufeff"), "IDENTITY_WHITESPACE", id="trailing-bom"),
    pytest.param(wsgi("k\u200dk"), "IDENTITY_CONTROL_CHAR", id="inner-zero-width-joiner"),
    pytest.param(wsgi("e\u0301"), "IDENTITY_NOT_NFC", id="not-nfc"),
    pytest.param(b"\xff".decode("latin-1"), "IDENTITY_ENCODING", id="invalid-utf8-byte-ff"),
    pytest.param(b"k\xc3".decode("latin-1"), "IDENTITY_ENCODING", id="truncated-utf8"),
    pytest.param("k" * 256, "IDENTITY_TOO_LONG", id="too-long"),
])
def test_noncanonical_key_is_refused_before_anything_is_written(world, client, key, reason):
    """A padded, empty, missing, invisible-edged, non-NFC, over-long or non-UTF-8 Idempotency-Key (header bytes
    as a WSGI server delivers them) is NONCANONICAL_KEY (400) with the identity rule it broke; the key is never
    trimmed or repaired and nothing is written. Proves: CV2-01-004, CV2-01-029"""
    before = counts()
    response = admit(client, body(), key)
    assert response.status_code == 400, response.content
    assert response.json() == {"code": "NONCANONICAL_KEY", "detail": f"Idempotency-Key rejected: {reason}"}
    assert counts() == before


@pytest.mark.django_db
def test_trimmed_form_of_a_padded_key_is_a_different_key(world, client):
    """After " k" is refused, "k" is admitted as a new key: the refused value was never stored in a repaired
    form. Proves: CV2-01-005"""
    assert admit(client, body(), " k").status_code == 400
    assert admit(client, body(), "k").status_code == 201
    assert list(ReceiptAdmissionKey.objects.values_list("transport_key", flat=True)) == ["k"]


@pytest.mark.django_db
@pytest.mark.parametrize("case", ["wrong-key", "other-account-key", "stale", "future", "tampered-body",
                                  "missing", "malformed", "not-hex"])
def test_bad_signature_is_refused_before_admission(world, client, case):
    """A missing, malformed, wrongly keyed, out-of-tolerance or body-mismatching Connector-Signature is
    SIGNATURE_INVALID (401) and nothing is written (decision D-111: the HMAC signature is the transport's only
    authentication)."""
    payload = body()
    now = int(time.time())
    kwargs = {
        "wrong-key": {"secret": b"not-the-signing-secret"},
        "other-account-key": {"secret": signing_secret(OTHER)},
        "stale": {"timestamp": now - 301},
        "future": {"timestamp": now + 400},  # margin: the request may take seconds under load
        "tampered-body": {"signature": sign(signing_secret(), now, body(event(name="Eve")))},
        "missing": {"signature": None},
        "malformed": {"signature": "sha256=abc"},
        "not-hex": {"signature": f"t={now},v1=zz"},
    }[case]
    before = counts()
    response = admit(client, payload, **kwargs)
    assert response.status_code == 401, response.content
    assert response.json()["code"] == "SIGNATURE_INVALID"
    assert counts() == before


@pytest.mark.django_db
def test_signature_inside_the_tolerance_is_accepted(world, client):
    """A timestamp 290 s old is inside the 300 s tolerance (decision D-111)."""
    assert admit(client, body(), timestamp=int(time.time()) - 290).status_code == 201


@pytest.mark.django_db
def test_unknown_account_is_refused_before_the_signature(world, client):
    """An unknown account is ACCOUNT_NOT_FOUND (404) even without a signature; nothing is written."""
    before = counts()
    response = admit(client, body(), account="w-nobody", signature=None)
    assert response.status_code == 404
    assert response.json()["code"] == "ACCOUNT_NOT_FOUND"
    assert counts() == before


@pytest.mark.django_db
@pytest.mark.parametrize("channel", ["records.unknown", "records.callout", "records.mapping", "Records.Webhook",
                                     "records.webhook "])
def test_channel_that_is_not_an_enabled_inbound_route_is_refused(world, client, channel):
    """A channel that is not an enabled inbound route of the account's active epoch (unknown, another binding
    kind, another case, padded) is CHANNEL_NOT_FOUND (404), checked before the signature; nothing is written:
    the route resolves only through the frozen epoch, with no fallback or normalization. Proves: CV2-02-026"""
    before = counts()
    response = admit(client, body(), channel=channel, signature=None)
    assert response.status_code == 404, response.content
    assert response.json()["code"] == "CHANNEL_NOT_FOUND"
    assert counts() == before


@pytest.mark.django_db
@pytest.mark.parametrize("payload", [
    pytest.param(b"not json", id="not-json"),
    pytest.param(b"", id="empty"),
    pytest.param(b"\xff\xfe{}", id="not-utf8"),
    pytest.param(b'{"events": []}', id="no-component"),
    pytest.param(b'{"records": []}', id="no-events-array"),
    pytest.param(json.dumps({"events": [event("e-1"), {"type": "x"}]}).encode(), id="one-bad-component"),
    pytest.param(json.dumps({"events": [event(" e-1")]}).encode(), id="noncanonical-event-key"),
    pytest.param(json.dumps({"events": [event(sequence="01")]}).encode(), id="noncanonical-position"),
])
def test_unparseable_body_is_refused_as_a_whole(world, client, payload):
    """A body the route cannot parse completely (including a non-canonical event key or position) is
    BODY_UNPARSEABLE (400): no Receipt, key, component or event, not even for the components that would have
    parsed. Proves: CV2-01-004"""
    before = counts()
    response = admit(client, payload)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "BODY_UNPARSEABLE"
    assert counts() == before


@pytest.mark.django_db
def test_halted_gate_refuses_new_admission_with_retry_after(world, client):
    """After `halt_v2` a new delivery is GATE_NOT_SERVING (503) with `Retry-After`, and nothing is written.
    Proves: CV2-03-016, CV2-05-003"""
    gate_halt()
    before = counts()
    response = admit(client, body())
    assert response.status_code == 503
    assert response.json()["code"] == "GATE_NOT_SERVING"
    assert response["Retry-After"] == "5"
    assert counts() == before


@pytest.mark.django_db
def test_gate_naming_no_epoch_refuses_with_retry_after(client):
    """An account whose gate names no epoch yet (still v1_serving) cannot be served: 503 GATE_NOT_SERVING."""
    from connector.demo import build_owners

    build_owners("w-")
    response = admit(client, body(), signature=None)
    assert response.status_code == 503
    assert response.json()["code"] == "GATE_NOT_SERVING"
    assert response["Retry-After"] == "5"
    assert counts()["receipts"] == 0


@pytest.mark.django_db
def test_broker_outage_never_fails_an_admitted_delivery(world, client, monkeypatch, caplog,
                                                        django_capture_on_commit_callbacks):
    """When the broker is unreachable the enqueue failure is logged, the answer is still 201, and the
    MaterializationDue row lets the sweeper materialize the receipt later. Proves: CV2-05-017"""
    def broker_down(account_id, slot=0):
        raise KombuOperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(tasks, "materialization_wake", broker_down)
    with caplog.at_level(logging.WARNING, logger="connector.api.views"):
        with django_capture_on_commit_callbacks(execute=True):
            response = admit(client, body(event("e-1"), event("e-2", record_id="r-2")))
    assert response.status_code == 201
    receipt_pk = response.json()["receipt"]
    assert MaterializationDue.objects.filter(receipt_id=receipt_pk).exists()
    assert "materialization enqueue failed" in caplog.text
    receipt_materialize(receipt_pk=receipt_pk)  # what the sweeper does from the work row
    assert counts()["events"] == 2 and counts()["due"] == 0


@pytest.mark.django_db
def test_oversized_body_is_refused(world, client, settings):
    """A body above DATA_UPLOAD_MAX_MEMORY_SIZE is BODY_TOO_LARGE (413) and nothing is written."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 16
    before = counts()
    response = admit(client, body())
    assert response.status_code == 413
    assert response.json()["code"] == "BODY_TOO_LARGE"
    assert counts() == before


@pytest.mark.django_db
def test_admission_answers_json_whatever_the_accept_header(world, client):
    """A sender's `Accept` header never refuses a delivery: the acknowledgement is JSON."""
    payload = body()
    url = reverse("connector-api:receipt-admit", kwargs={"account": ACCOUNT, "channel": CHANNEL})
    response = client.post(url, data=payload, content_type="application/json", HTTP_ACCEPT="text/html",
                           HTTP_IDEMPOTENCY_KEY="k-accept",
                           HTTP_CONNECTOR_SIGNATURE=sign(signing_secret(), int(time.time()), payload))
    assert response.status_code == 201 and response["Content-Type"] == "application/json"


@pytest.mark.django_db(transaction=True)
def test_admission_query_count_is_pinned_and_independent_of_history(transactional_db, client,
                                                                      django_assert_num_queries):
    """The admission hot path costs a fixed number of queries (STYLE R13), the same for one component as for
    five and after earlier receipts, and a duplicate costs fewer: no scan of the account's retained history.
    Each admission is its own transaction, as in production (no savepoints; no guard memo carried over).
    Created: account, gate, signing key (gate epoch, binding proof, credential mapping), account and key in
    the service, the guard (one call of connector_lock_serving, D-199; before issue 18 six statements: gate
    epoch, two savepoints, epoch and gate share locks, the advisory lock), BEGIN, three inserts, COMMIT (the answer's
    epoch is the one the guard locked; before issue 18 it was read back, preimage included). Measured 19 before
    issue 18 (the test then ran in the test's transaction, with savepoints), 13 after its first slice, 2 after
    goal 1 (D-201..D-203: one read of the account and its gate's epoch, whose signing key and route are cached by
    the exact epoch; then `connector_receipt_admit`, which locks, checks, writes the three rows and commits in
    autocommit), 1 since D-297 (the process's last hint for the account is used without a read; the statement
    admits only under exactly that hint). A duplicate: the statement (it finds the key before any lock), the
    gate read that proves the verified hint is still the gate's epoch (D-297), the key's byte comparison; 7
    before goal 1. Proves: CV2-14-010"""
    build_world("w-")
    for i in range(3):
        admit(client, body(event(f"h-{i}")), f"history-{i}")
    secret = signing_secret()
    one, five = body(event("p-1")), body(*(event(f"p5-{i}", f"r-{i}") for i in range(5)))
    for key, payload in (("pinned-1", one), ("pinned-5", five)):
        with django_assert_num_queries(1):
            assert admit(client, payload, key, secret=secret).status_code == 201
    with django_assert_num_queries(3):
        assert admit(client, one, "pinned-1", secret=secret).status_code == 200


@pytest.mark.django_db
def test_other_methods_answer_with_a_catalog_code(world, client):
    """A GET on the admission URL is METHOD_NOT_ALLOWED (405) with the catalog body."""
    url = reverse("connector-api:receipt-admit", kwargs={"account": ACCOUNT, "channel": CHANNEL})
    response = client.get(url)
    assert response.status_code == 405
    assert response.json()["code"] == "METHOD_NOT_ALLOWED"


# -- V1 tombstones -------------------------------------------------------------------------------------------------

def tombstone_line(payload: bytes, key: str = "v1-key-1", *, account: str = ACCOUNT, **extra) -> dict:
    return {"account": account, "channel": CHANNEL, "transport_key": key,
            "payload_digest": hashlib.sha256(payload).hexdigest(), "predecessor_ref": f"v1:receipt:{key}", **extra}


def import_file(tmp_path, *rows: dict | str) -> str:
    path = tmp_path / "tombstones.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    out = io.StringIO()
    call_command("import_v1_tombstones", str(path), stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_v1_tombstone_answers_already_accepted_without_a_v2_descendant(world, client, tmp_path):
    """A delivery whose key was accepted by V1 (imported tombstone) with the same bytes answers 200
    `v1_accepted` with no receipt and creates no Receipt, Component or Event; different bytes fail closed with
    RECEIPT_DIGEST_MISMATCH (409). Proves: CV2-05-002, CV2-05-005, CV2-05-007, CV2-15-001"""
    payload = body()
    assert "created 1, unchanged 0" in import_file(tmp_path, tombstone_line(payload))
    before = counts()
    response = admit(client, payload, "v1-key-1")
    assert response.status_code == 200, response.content
    assert response.json() == {"receipt": None, "admission": "v1_accepted", "epoch": None, "component_count": None}
    mismatch = admit(client, body(event(name="Eve")), "v1-key-1")
    assert mismatch.status_code == 409
    assert mismatch.json()["code"] == "RECEIPT_DIGEST_MISMATCH"
    assert counts() == before
    assert ReceiptAdmissionKey.objects.get(transport_key="v1-key-1").receipt_id is None


@pytest.mark.django_db
def test_tombstone_import_is_idempotent(world, tmp_path):
    """Re-importing the same file changes nothing and reports every row unchanged. Proves: CV2-05-008"""
    rows = [tombstone_line(body(), "v1-a"), tombstone_line(body(event("e-2")), "v1-b")]
    assert "created 2, unchanged 0" in import_file(tmp_path, *rows)
    assert "created 0, unchanged 2" in import_file(tmp_path, *rows)
    assert V1AcceptanceTombstone.objects.count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("bad,line,message", [
    pytest.param("{not json", 2, "not JSON", id="not-json"),
    pytest.param({"account": ACCOUNT}, 2, "missing", id="missing-fields"),
    pytest.param(tombstone_line(b"x", "v1-x", extra_field=1), 2, "unexpected extra_field", id="extra-field"),
    pytest.param({**tombstone_line(b"x", "v1-x"), "payload_digest": "ab" * 31}, 2, "payload_digest",
                 id="short-digest"),
    pytest.param({**tombstone_line(b"x", "v1-x"), "payload_digest": " " + "ab" * 32}, 2, "payload_digest",
                 id="padded-digest"),
    pytest.param(tombstone_line(b"x", " v1-x"), 2, "NONCANONICAL_KEY", id="noncanonical-key"),
    pytest.param(tombstone_line(b"x", "v1-x", account="w-nobody"), 2, "ACCOUNT_NOT_FOUND", id="unknown-account"),
    pytest.param(tombstone_line(b"other", "v1-a"), 2, "TOMBSTONE_CONFLICT", id="same-key-other-digest"),
])
def test_bad_tombstone_line_names_its_line_and_imports_nothing(world, tmp_path, bad, line, message):
    """A malformed or refused line fails the command with an error naming its line number, and no line of the
    file is imported (all or nothing). Proves: CV2-05-007, CV2-05-008"""
    good_first, good_last = tombstone_line(body(), "v1-a"), tombstone_line(body(), "v1-z")
    with pytest.raises(CommandError) as raised:
        import_file(tmp_path, good_first, bad, good_last)
    assert str(raised.value).startswith(f"line {line}:")
    assert message in str(raised.value)
    assert V1AcceptanceTombstone.objects.count() == 0
    assert ReceiptAdmissionKey.objects.count() == 0


@pytest.mark.django_db
def test_tombstone_cannot_take_a_key_held_by_a_v2_receipt(world, client, tmp_path):
    """Importing a tombstone for a key a V2 Receipt already holds fails closed and writes nothing.
    Proves: CV2-05-001, CV2-15-001"""
    payload = body()
    admit(client, payload, "k-v2")
    with pytest.raises(CommandError, match=r"^line 1: TOMBSTONE_CONFLICT"):
        import_file(tmp_path, tombstone_line(payload, "k-v2"))
    assert V1AcceptanceTombstone.objects.count() == 0


@pytest.mark.django_db
def test_missing_tombstone_file_is_a_command_error(world, tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        call_command("import_v1_tombstones", str(tmp_path / "absent.jsonl"))


# -- concurrency ---------------------------------------------------------------------------------------------------

def _race(payloads: list[bytes], key: str, account: str) -> list[tuple[int, dict, bytes]]:
    """Submit each payload from its own thread (own Client, own database connection), released together."""
    secret = signing_secret(account)

    def submit(payload: bytes):
        def run():
            response = admit(Client(), payload, key, account=account, secret=secret)
            return response.status_code, response.json(), payload
        return run

    # connect before the barrier so the submissions really overlap
    results = run_concurrently([submit(p) for p in payloads], before=lambda: connection.ensure_connection())
    assert raised(results) == []
    return results

@pytest.mark.django_db(transaction=True)
def test_32_concurrent_submissions_of_one_key_create_exactly_one_receipt(enqueued):
    """32 threads submit the same key and bytes at once through the API: exactly one is `created`, the other 31
    resolve to the same Receipt and epoch as `duplicate`, and exactly one Receipt, key and work row exist; no
    error, no deadlock. Proves: CV2-05-001, CV2-05-004, CV2-15-001, CV2-15-024"""
    build_world("c-")
    account = "c-acme-eu"
    results = _race([body()] * 32, "race-key", account)
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200] * 31 + [201]
    receipt = Receipt.objects.get()
    assert {data["receipt"] for _, data, _ in results} == {receipt.pk}
    assert {data["epoch"]["id"] for _, data, _ in results} == {"c-epoch-1"}
    assert sorted(data["admission"] for _, data, _ in results) == ["created"] + ["duplicate"] * 31
    assert ReceiptAdmissionKey.objects.count() == 1 and MaterializationDue.objects.count() == 1
    assert enqueued == [receipt.account_id]  # exactly one materialization enqueue, after the winner's commit


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_with_different_bytes_fail_closed(enqueued):
    """32 threads race on one key, half of them with different bytes: exactly one Receipt exists; every thread
    that sent the winner's bytes gets it (`created` once, then `duplicate`), every other thread gets
    RECEIPT_DIGEST_MISMATCH (409) and writes nothing. Proves: CV2-05-004, CV2-15-001, CV2-15-024"""
    build_world("c-")
    account = "c-acme-eu"
    a, b = body(event(name="Ada")), body(event(name="Eve"))
    results = _race([a if i % 2 else b for i in range(32)], "race-key", account)
    receipt = Receipt.objects.get()
    winner = bytes(receipt.payload)
    assert winner in (a, b)
    same = [(status, data) for status, data, payload in results if payload == winner]
    other = [(status, data) for status, data, payload in results if payload != winner]
    assert sorted(status for status, _ in same) == [200] * 15 + [201]
    assert {data["receipt"] for _, data in same} == {receipt.pk}
    assert other and all(status == 409 and data["code"] == "RECEIPT_DIGEST_MISMATCH" for status, data in other)
    assert len(other) == 16
    assert ReceiptAdmissionKey.objects.count() == 1 and MaterializationDue.objects.count() == 1
    assert Event.objects.count() == 0 and enqueued == [receipt.account_id]
