"""The kept parses of `RouteProgram.parse` (D-262): a parse is served again only to an equal route for the very
same body bytes, never to another definition (a new generation) or other bytes, and the memo stays bounded."""
from __future__ import annotations

import copy
import hashlib
import json

import pytest

from connector.interpreters import inbound
from connector.interpreters.inbound import BodyUnparseable, compile_route
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import webhook_body, webhook_event

WEBHOOK = "records.webhook"


def _compile(definition: dict, *, version: int = 1, digest: bytes | None = None):
    raw = json.dumps(definition, sort_keys=True).encode()
    return compile_route(business_key=WEBHOOK, version=version, definition_bytes=raw,
                         definition_digest=digest or hashlib.sha256(raw).digest())


@pytest.fixture(autouse=True)
def _fresh_memo():
    inbound.parsed_clear()
    yield
    inbound.parsed_clear()


def _counting(monkeypatch) -> list[int]:
    calls = [0]
    original = inbound.RouteProgram.normalize

    def normalize(self, component):
        calls[0] += 1
        return original(self, component)

    monkeypatch.setattr(inbound.RouteProgram, "normalize", normalize)
    return calls


def test_the_same_route_and_bytes_are_parsed_once(monkeypatch):
    """Admission and materialization in one process parse a receipt once: the second parse of the same bytes by
    an equal route returns equal events without normalizing again, as a new list. Proves: CV2-14-001"""
    calls = _counting(monkeypatch)
    route = _compile(PACK_A["routes"][WEBHOOK])
    body = webhook_body(webhook_event("E-1", "rec-1", 1), webhook_event("E-2", "rec-2", 1))
    first = route.parse(body)
    assert calls[0] == 2
    second = _compile(PACK_A["routes"][WEBHOOK]).parse(bytearray(body))  # an equal route, compiled again
    assert calls[0] == 2 and second == first and second is not first
    second.clear()
    assert route.parse(body) == first and calls[0] == 2


def test_a_new_definition_is_never_served_from_an_old_entry(monkeypatch):
    """A route whose definition differs, even under the same business key, version and definition digest (which
    a new generation never shares, forged here), parses the bytes itself: the entry names the exact route.
    Proves: CV2-02-026, CV2-14-001"""
    calls = _counting(monkeypatch)
    definition = PACK_A["routes"][WEBHOOK]
    old = _compile(definition)
    body = webhook_body(webhook_event("E-1", "rec-1", 1))
    events = old.parse(body)
    changed = copy.deepcopy(definition)
    changed["normalize"]["event_kind"] = {"const": "other.kind"}
    forged = _compile(changed, digest=old.definition_digest)
    assert forged.definition_digest == old.definition_digest and forged.version == old.version
    parsed = forged.parse(body)
    assert calls[0] == 2
    assert [e.event_kind for e in parsed] == ["other.kind"] != [e.event_kind for e in events]
    assert [e.event_kind for e in _compile(changed, version=2).parse(body)] == ["other.kind"]
    assert calls[0] == 3


def test_other_bytes_under_the_same_digest_are_parsed_again(monkeypatch):
    """The digest only finds an entry; the body is compared byte for byte, so even a digest collision (planted
    here) cannot hand one body's events to another. Proves: CV2-14-001"""
    calls = _counting(monkeypatch)
    route = _compile(PACK_A["routes"][WEBHOOK])
    body = webhook_body(webhook_event("E-1", "rec-1", 1))
    other = webhook_body(webhook_event("E-9", "rec-9", 1))
    planted = tuple(route.parse(other))
    key = (route.business_key, route.version, route.definition_digest, hashlib.sha256(body).digest())
    inbound._parsed_put(key, (route, other, planted))
    assert [e.source_event_key for e in route.parse(body)] == ["E-1"]
    assert calls[0] == 2


def test_a_refused_body_is_refused_every_time_and_nothing_is_kept():
    """Only successful parses are kept: a body the route refuses is refused again on every call. Proves:
    CV2-02-026"""
    route = _compile(PACK_A["routes"][WEBHOOK])
    for _ in range(2):
        with pytest.raises(BodyUnparseable):
            route.parse(b'{"events": [{"id": " padded"}]}')
    assert len(inbound._PARSED) == 0


def test_the_memo_is_bounded_by_entries_and_bytes(monkeypatch):
    """At most PARSED_MAX_ENTRIES entries and PARSED_MAX_BYTES (three times each body), oldest first out; a body
    above the byte bound is never kept. Proves: CV2-14-001"""
    route = _compile(PACK_A["routes"][WEBHOOK])
    monkeypatch.setattr(inbound, "PARSED_MAX_ENTRIES", 3)
    bodies = [webhook_body(webhook_event(f"E-{i}", f"rec-{i}", 1)) for i in range(5)]
    for body in bodies:
        route.parse(body)
    assert [entry[1] for entry in inbound._PARSED.values()] == bodies[2:]
    monkeypatch.setattr(inbound, "PARSED_MAX_BYTES", 3 * len(bodies[0]) * 2)
    route.parse(bodies[0])
    assert len(inbound._PARSED) == 2 and inbound._parsed_size[0] <= inbound.PARSED_MAX_BYTES
    big = webhook_body(*[webhook_event(f"B-{i}", f"rec-{i}", 1) for i in range(40)])
    route.parse(big)
    assert all(entry[1] != big for entry in inbound._PARSED.values())
    assert inbound._parsed_size[0] == sum(3 * len(entry[1]) for entry in inbound._PARSED.values())
