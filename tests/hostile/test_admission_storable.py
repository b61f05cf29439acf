"""Admission refuses, before the 201, every extracted value that no column could store and every body the bounded
JSON parser refuses: 400 BODY_UNPARSEABLE with a precise detail and nothing written (row counts of every
connector, effects and cutover table unchanged). Over HTTP through Django's test client, signed with the account's
real signing secret; the routes of one test pack extract every normalized field (ordered, grouped and dependent
routes). A value accepted at its exact limit is accepted and materializes (decisions D-165, D-166, D-167)."""
from __future__ import annotations

import json
import time

import pytest
from django.test import Client
from django.urls import reverse

from connector.models import Event, MaterializationDue, Receipt
from connector.services import storable
from connector.services.materialize import receipt_materialize
from connector.services.signatures import sign, signing_secret
from tests.connector.inbound_helpers import build_inbound_world
from tests.hostile.support import OPERATOR, OPERATOR_PASSWORD, build_api_world, row_counts

NORMALIZE = {"event_kind": "/kind", "source_event_key": "/id", "source_locator": "/loc", "occurred_at": "/at",
             "payload": "/data"}
EXTRACT = {"format": "json", "components": "/events"}
PROOF = {"writes": [{"target": "display_name", "operation": "insert_if_absent"}]}  # D-310
PACK = {
    "owner_pack": "h2-hooks", "label": "storability probe", "credential_ref": "h2-signing",
    "runtime": ("runtime.h2.apply", 1),
    "routes": {
        "h2.ordered": {"ordering_contract": "latest_source_position", "extract": EXTRACT, "normalize": NORMALIZE,
                       "ordering": {"partition": "/part", "position": "/seq", "position_kind": "integer",
                                    "tie_breaker": "/tie"},
                       "projection": {"record_key": "/rk"}, "mapping": "h2.fields"},
        "h2.grouped": {"ordering_contract": "order_independent", "extract": EXTRACT, "normalize": NORMALIZE,
                       "window": {"grouping_key": "/group", "max_members": 5, "max_age_seconds": 60},
                       "projection": {"record_key": "/rk"}, "mapping": "h2.fields", "order_independence": PROOF},
        "h2.dependent": {"ordering_contract": "order_independent", "extract": EXTRACT, "normalize": NORMALIZE,
                         "depends_on": {"source_event_key": "/after", "deadline_seconds": 60},
                         "projection": {"record_key": "/rk"}, "mapping": "h2.fields", "order_independence": PROOF},
    },
    "mappings": {"h2.fields": {"fields": [{"source": "/name", "target": "display_name"}]}},
}
STAMP_65 = "2026-01-01T00:00:00." + "1" * 44 + "Z"  # grammatical, one character over Event.occurred_at (64)


def component(**changes) -> dict:
    base = {"kind": "rec.changed", "id": "ev-1", "loc": "loc-1", "at": "2026-01-01T00:00:00Z",
            "data": {"name": "Ada"}, "part": "p-1", "seq": 1, "tie": "t-1", "rk": "rk-1", "group": "g-1",
            "after": "ev-0"}
    return {**base, **changes}


def body(*components: dict) -> bytes:
    return json.dumps({"events": list(components)}).encode()


@pytest.fixture
def probe(db):
    world = build_inbound_world("st-", [PACK])
    return world.account


def post(client: Client, account, channel: str, payload: bytes, key: str = "k-1"):
    secret = signing_secret(account_id=account.pk, channel=channel)
    url = reverse("connector-api:receipt-admit", kwargs={"account": account.account_key, "channel": channel})
    return client.post(url, data=payload, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key,
                       HTTP_CONNECTOR_SIGNATURE=sign(secret, int(time.time()), payload))


def refused(response, before: dict, *fragments: str) -> None:
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "BODY_UNPARSEABLE", response.json()
    for fragment in fragments:
        assert fragment in response.json()["detail"], response.json()["detail"]
    after = row_counts()
    assert after == before, {t: (before[t], after[t]) for t in after if after[t] != before[t]}


OVERSIZE = [  # (route, pointer key, value, fragments of the detail)
    ("h2.ordered", "at", STAMP_65, ["occurred_at has 65 characters", "connector.Event.occurred_at", "64"]),
    ("h2.ordered", "at", "2026-01-01T00:00:00." + "9" * 234 + "Z", ["occurred_at has 255 characters"]),
    ("h2.ordered", "kind", "k" * 256, ["event_kind"]),
    ("h2.ordered", "id", "i" * 256, ["source_event_key"]),
    ("h2.ordered", "loc", "l" * 256, ["source_locator"]),
    ("h2.ordered", "part", "p" * 256, ["partition"]),
    ("h2.ordered", "tie", "t" * 256, ["tie_breaker"]),
    ("h2.ordered", "seq", 10 ** 38, ["position"]),
    ("h2.ordered", "rk", "r" * 256, ["record_key"]),
    ("h2.grouped", "group", "g" * 256, ["grouping_key"]),
    ("h2.dependent", "after", "a" * 256, ["depends_on"]),
]


@pytest.mark.parametrize("channel,key,value,fragments", OVERSIZE, ids=[f"{c[0]}:{c[1]}" for c in OVERSIZE])
def test_every_extracted_field_one_past_its_column_is_refused_before_the_201(probe, client, channel, key, value,
                                                                           fragments):
    """For every field a pack extracts, a value one past the tightest column that stores it is refused with
    BODY_UNPARSEABLE naming the component and the field, and nothing is written. Today's code answered 201 for a
    65..255-character `occurred_at` (then failed every materialization) and ignored an invalid prerequisite key.
    Proves: CV2-05-003, CV2-05-012, CV2-01-003"""
    before = row_counts()
    refused(post(client, probe, channel, body(component(), component(**{"id": "ev-2", key: value}))), before,
            "component 1:", *fragments)


UNGRAMMATICAL = ["x", "yesterday", "2026-01-01", "2026-01-01 00:00:00Z", "2026-01-01T00:00:00", "20260101T000000Z",
                 "2026-02-30T00:00:00Z", "2025-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-01-01T24:00:00Z",
                 "2026-01-01T00:60:00Z", "2026-01-01T00:00:61Z", "2026-01-01T00:00:00+24:00",
                 "2026-01-01T00:00:00.Z", "１２３４-01-01T00:00:00Z"]


@pytest.mark.parametrize("stamp", UNGRAMMATICAL)
def test_an_occurred_at_that_is_not_an_rfc3339_date_time_is_refused(probe, client, stamp):
    """`occurred_at` is an RFC 3339 date-time naming a real calendar date and time of day (D-166); anything else
    is refused before the 201 and writes nothing (today it was accepted and stored as given).
    Proves: CV2-05-012"""
    before = row_counts()
    refused(post(client, probe, "h2.ordered", body(component(at=stamp))), before, "occurred_at")


ACCEPTED = ["2026-01-01T00:00:00Z", "2024-05-01T10:00:00Z", "2024-02-29T23:59:60z", "2026-06-30t12:30:00.5+05:30",
            "2026-01-01T00:00:00-23:59", "2026-01-01T00:00:00." + "1" * 43 + "Z"]


@pytest.mark.parametrize("stamp", ACCEPTED)
def test_grammatical_values_at_their_limits_are_accepted_and_materialize(probe, client, stamp):
    """The demo and conformance packs' values and the edges of the grammar (a leap second, lower-case `t`/`z`,
    offsets, a fraction filling the 64-character column) and 255-character keys are admitted, and materialize.
    Proves: CV2-05-012, CV2-05-019"""
    payload = body(component(at=stamp, id="i" * 255, loc="l" * 255, part="p" * 255, tie="t" * 255, rk="r" * 255))
    response = post(client, probe, "h2.ordered", payload)
    assert response.status_code == 201, response.content
    receipt = Receipt.objects.get(pk=response.json()["receipt"])
    receipt_materialize(receipt_pk=receipt.pk)
    assert Event.objects.get(receipt=receipt).occurred_at == stamp
    assert not MaterializationDue.objects.filter(receipt=receipt).exists()


def test_a_payload_string_holding_u0000_is_refused(probe, client):
    """Runtime stores mapped payload values in a PostgreSQL jsonb column, which cannot hold U+0000: such a
    payload is refused before the 201 (today it was admitted and every Runtime run of it failed); an escaped
    backslash followed by `u0000` is ordinary text and is accepted. Proves: CV2-05-003"""
    before = row_counts()
    refused(post(client, probe, "h2.ordered", body(component(data={"name": "A\u0000da"}))), before,
            "payload holds a U+0000", "connector.CrmRecord.fields")
    refused(post(client, probe, "h2.ordered", body(component(data={"n\u0000": "x"}))), before, "U+0000")
    assert post(client, probe, "h2.ordered", body(component(data={"name": "\\u0000"})), key="k-2").status_code == 201


def test_the_limits_are_read_from_the_model_fields(probe, client, monkeypatch):
    """One mechanism: the limit of each normalized field is the tightest `max_length` / `max_digits` of the model
    fields it is stored in (`storable.TARGETS`), so narrowing a column narrows admission with it.
    Proves: CV2-05-012"""
    field = Event._meta.get_field("event_kind")
    monkeypatch.setattr(field, "max_length", 12)
    storable.limits.cache_clear()
    try:
        before = row_counts()
        refused(post(client, probe, "h2.ordered", body(component(kind="k" * 13))), before,
                "event_kind has 13 characters", "at most 12")
        assert post(client, probe, "h2.ordered", body(component(kind="k" * 12))).status_code == 201
    finally:
        storable.limits.cache_clear()
    assert storable.limits("occurred_at") == {"chars": 64}
    assert storable.limits("partition") == {"chars": 255}
    assert storable.limits("position") == {"digits": 38}
    assert storable.limits("payload") == {"json": "connector.CrmRecord.fields"}


@pytest.fixture
def push_account(db):
    from connector.demo import build_world

    return build_world("pu-", push=True).accounts[0]


def _demo_event(record_id: str) -> dict:
    return {"id": "e-1", "type": "record.updated", "record_id": record_id, "sequence": 1,
            "occurred_at": "2026-01-01T00:00:00Z", "data": {"name": "Ada", "email": "ada@example.com"}}


def test_a_record_key_its_outbound_command_could_not_hold_is_refused(push_account, client):
    """On a route that pushes applied records outbound, the record key becomes part of the EffectRoot ID (command
    ID + ":" + key, `OutboundCommand.effect_root_id` holds 255) and, percent-encoded, of the callout path
    (`OutboundCommand.path` holds 1024): a key either cannot hold is refused before the 201 (today a 211..255
    character key was admitted and its Runtime run failed on every attempt). Proves: CV2-10-001, CV2-05-003"""
    before = row_counts()
    payload = json.dumps({"events": [_demo_event("r" * 211)]}).encode()
    refused(post(client, push_account, "records.webhook", payload), before, "record_key has 211 characters",
            "EffectRoot")
    payload = json.dumps({"events": [_demo_event("\U0001f600" * 100)]}).encode()
    refused(post(client, push_account, "records.webhook", payload), before, "1212-character outbound path")
    payload = json.dumps({"events": [_demo_event("r" * 210)]}).encode()
    assert post(client, push_account, "records.webhook", payload).status_code == 201


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


HOSTILE_BODIES = {
    "nested 100,000 deep": '{"events":[{"kind":"k","id":"e","loc":"l","at":"2026-01-01T00:00:00Z","part":"p",'
                           '"seq":1,"tie":"t","rk":"r","data":' + nested(100_000) + "}]}",
    "nested 65 deep": '{"events":[{"kind":"k","id":"e","loc":"l","at":"2026-01-01T00:00:00Z","part":"p",'
                      '"seq":1,"tie":"t","rk":"r","data":' + nested(62) + "}]}",
    "unclosed 100,000 deep": "[" * 100_000,
    "5,000-digit sequence": '{"events":[{"kind":"k","id":"e","loc":"l","at":"2026-01-01T00:00:00Z","part":"p",'
                            '"seq":' + "9" * 5000 + ',"tie":"t","rk":"r","data":{}}]}',
    "5,000-digit payload number": '{"events":[{"kind":"k","id":"e","loc":"l","at":"2026-01-01T00:00:00Z",'
                                  '"part":"p","seq":1,"tie":"t","rk":"r","data":{"n":-' + "1" * 5000 + "}}]}",
    "65-character number": '{"events":[{"kind":"k","id":"e","loc":"l","at":"2026-01-01T00:00:00Z","part":"p",'
                           '"seq":1,"tie":"t","rk":"r","data":{"n":' + "1" * 65 + "}}]}",
    "NaN": '{"events":[{"kind":"k","id":"e","loc":"l","at":"2026-01-01T00:00:00Z","part":"p","seq":1,'
           '"tie":"t","rk":"r","data":{"n":NaN}}]}',
    "lone surrogate": '{"events":[{"kind":"k","id":"e","loc":"l","at":"2026-01-01T00:00:00Z","part":"p","seq":1,'
                      '"tie":"t","rk":"r","data":{"n":"\\ud800"}}]}',
}


@pytest.mark.parametrize("name", list(HOSTILE_BODIES))
def test_hostile_json_answers_400_body_unparseable(probe, client, name):
    """The admission parser bounds nesting (64 levels) and number literals (64 characters) before building any
    value, and maps every parse failure to BODY_UNPARSEABLE: JSON nested 100,000 deep and a 5,000-digit number
    answered 500 INTERNAL_ERROR before (a RecursionError; a ValueError without `.msg`). Proves: CV2-05-003"""
    before = row_counts()
    refused(post(client, probe, "h2.ordered", HOSTILE_BODIES[name].encode()), before)


def test_json_at_the_bounds_is_accepted(probe, client):
    """Nesting up to 64 levels and 64-character integers are accepted (the bounds are not off by one)."""
    payload = ('{"events":[{"kind":"k","id":"e","loc":"l","at":"2026-01-01T00:00:00Z","part":"p","seq":1,'
               '"tie":"t","rk":"r","data":{"deep":' + nested(60) + ',"n":' + "1" * 64 + "}}]}").encode()
    assert post(client, probe, "h2.ordered", payload).status_code == 201


@pytest.fixture
def api_world(db):
    return build_api_world("rp-")


@pytest.mark.parametrize("payload", [nested(100_000), "[" * 100_000, '{"reason": ' + "9" * 5000 + "}"],
                         ids=["nested", "unclosed", "huge number"])
def test_the_replay_endpoint_answers_400_for_hostile_json(api_world, client, payload):
    """The replay endpoint's JSON parser is bounded the same way: 400 REQUEST_INVALID, nothing written (DRF's
    JSONParser raised RecursionError, answered 500). Proves: CV2-09-001"""
    client.login(username=OPERATOR, password=OPERATOR_PASSWORD)
    before = row_counts()
    response = client.post(reverse("connector-api:replay-request-admit", kwargs={"account": api_world.account_key}),
                           data=payload.encode(), content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "REQUEST_INVALID"
    assert "JSON parse error" in str(response.json()["detail"])
    assert row_counts() == before
