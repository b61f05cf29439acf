"""connector.canonical.shapes writes the same bytes as the generic encoder, and raises what it raises (D-272)."""
from __future__ import annotations

import random

import pytest

from connector import receipts
from connector.canonical.encoding import MAX_DEPTH, CanonicalEncodingError, Encoded, Record, encode
from connector.canonical.shapes import RecordShape, text_list

SHAPE = RecordShape("a", "b", "c")
EDGES = ["", "x", "é", "日本", "\U0001F600", b"", b"\x00\xff", 0, -1, 2**63 - 1, -(2**63), True, False, None,
         [], ["p", "q"], [b"z", 1, None], [[1], [2, [None]]], (), ("t",)]


def _generic(values):
    return Record(zip(SHAPE.names, values))


def _outcome(fn):
    try:
        return fn()
    except CanonicalEncodingError as exc:
        return ("raises", exc.code)


def test_every_edge_value_in_every_field_frames_as_the_generic_encoder():
    """Each edge value (empty, multibyte, integer bounds, booleans, null, nested lists) in each field gives
    byte-identical encodings, alone, as a nested value and in a list of records. Proves: CV2-01-016, CV2-01-025"""
    rows = []
    for value in EDGES:
        for position in range(3):
            values = ["f", b"g", 7]
            values[position] = value
            rows.append(tuple(values))
            assert SHAPE.encode("d/shape", *values) == encode("d/shape", _generic(values))
            assert encode("d", Record([("r", SHAPE.value(*values))])) == encode("d", Record([("r", _generic(values))]))
    assert encode("d", SHAPE.many(rows)) == encode("d", [_generic(v) for v in rows])
    assert encode("d", SHAPE.many([])) == encode("d", [])
    assert encode("d", text_list(["a", "é", ""])) == encode("d", ["a", "é", ""])


def test_random_rows_frame_as_the_generic_encoder():
    """Random texts, bytes and integers: byte-identical, row by row and as lists. Proves: CV2-01-016"""
    rng = random.Random(19)
    alphabet = "az09-./é\u00e9\u4e2d\U0001F600"

    def value():
        kind = rng.randrange(4)
        if kind == 0:
            return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        if kind == 1:
            return rng.randbytes(rng.randrange(40))
        if kind == 2:
            return rng.randrange(-(2**63), 2**63)
        return [value() for _ in range(rng.randrange(3))] if rng.random() < 0.3 else None

    rows = [(value(), value(), value()) for _ in range(500)]
    for row in rows:
        assert SHAPE.encode("d/random", *row) == encode("d/random", _generic(row))
    assert encode("d", SHAPE.many(rows)) == encode("d", [_generic(r) for r in rows])


@pytest.mark.parametrize("bad", ["\ud800", 2**63, -(2**63) - 1, 1.5, {"k": 1}, {1}, memoryview(b"mv"),
                                 bytearray(b"ba"), [1.5], ["\udfff"]])
def test_unframeable_values_raise_or_frame_exactly_as_the_generic_encoder(bad):
    """A lone surrogate, an out-of-range integer, a float, a mapping, a set: the same error code; a memoryview
    or bytearray: the same bytes. Proves: CV2-01-025"""
    for position in range(3):
        values = ["f", b"g", 7]
        values[position] = bad
        assert _outcome(lambda: SHAPE.encode("d", *values)) == _outcome(lambda: encode("d", _generic(values)))
        assert _outcome(lambda: encode("d", SHAPE.many([tuple(values)]))) == _outcome(
            lambda: encode("d", [_generic(values)]))


def test_names_domains_and_depth_are_checked_as_the_generic_encoder_checks_them():
    """Field names go through Record's checks; a bad domain raises the generic code; nesting beyond MAX_DEPTH
    raises CANONICAL_TOO_DEEP; an Encoded value cannot be made from caller bytes. Proves: CV2-01-025"""
    for names in [("a", "a"), ("",), (" a",)]:
        with pytest.raises(CanonicalEncodingError):
            RecordShape(*names)
    with pytest.raises(CanonicalEncodingError) as exc:
        SHAPE.encode(" bad", "f", b"g", 7)
    assert exc.value.code == "CANONICAL_DOMAIN_INVALID"
    deep: list = []
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert _outcome(lambda: SHAPE.encode("d", deep, b"g", 7)) == _outcome(
        lambda: encode("d", _generic([deep, b"g", 7]))) == ("raises", "CANONICAL_TOO_DEEP")
    nested = SHAPE.value([[]], b"g", 7)
    assert _outcome(lambda: encode("d", Record([("n", nested)]))) == _outcome(
        lambda: encode("d", Record([("n", _generic([[[]], b"g", 7]))])))
    with pytest.raises(TypeError):
        Encoded(b"\x00", 0, object())


def test_the_owner_receipts_keep_their_bytes():
    """The credential receipt and the configuration payload framed by shape equal their rec(...) spelling.
    Proves: CV2-02-017, CV2-02-021"""
    cols = dict(generation_id="acct.crm-api.g1", credential_identity="crm-api", provider_scope="demo-provider",
                account_key="acct", secret_version_ref="crm-api/v1", transport_config_digest=b"\x01" * 32)
    data, digest = receipts.credential_receipt(**cols)
    assert data == encode(receipts.CREDENTIAL_RECEIPT_PROTOCOL, receipts.rec(**cols))
    assert digest == receipts.sha256(data)
    accounts = [{"account_key": "b", "provider_scope": "p", "enabled_routes": ["r"], "mapping_selections": {},
                 "policy_values": {"x": 1}}, {"account_key": "a", "provider_scope": "p", "enabled_routes": [],
                                              "mapping_selections": {"m": "v"}, "policy_values": {}}]
    relation = [("b", "crm", "b.g1"), ("a", "crm", "a.g1")]
    expected = encode(receipts.CONFIGURATION_PROTOCOL, receipts.rec(
        generation_id="g", catalog_view_key="v", catalog_revision=3,
        accounts=[receipts.rec(account_key=a["account_key"], provider_scope=a["provider_scope"],
                               enabled_routes=list(a["enabled_routes"]),
                               mapping_selections=receipts.canonical_json(a["mapping_selections"]),
                               policy_values=receipts.canonical_json(a["policy_values"])) for a in accounts],
        credential_relation=[receipts.rec(account_key=a, credential_ref=r, credential_generation_id=g)
                             for a, r, g in sorted(relation)]))
    assert receipts.configuration_payload(generation_id="g", catalog_view_key="v", catalog_revision=3,
                                          accounts=accounts, relation=relation) == expected
