"""Tests for the canonical identity and digest kernel (``connector.canonical``).

Plain pytest, no database: run with
``.venv/bin/python -m pytest tests/connector/test_canonical.py -p no:django -q``.

The golden vectors below are FROZEN. They were computed once, checked against
the independent ``_ref_encode`` re-implementation in this file (written only
from the byte layout in ``docs/digest-profiles.md``, using ``struct``), and
checked by hand / with ``sha256sum``. If one of them fails, the encoding has
drifted: do not update the hex -- a different byte layout is a new profile.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import struct
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType

import pytest

from connector.canonical import (
    DELIVERY,
    DELIVERY_PROFILE_ID,
    EPOCH_AUTHORING_PROFILE_ID,
    I64_MAX,
    I64_MIN,
    IDENTITY_CODES,
    IDENTITY_CONTROL_CHAR,
    IDENTITY_EMPTY,
    IDENTITY_ENCODING,
    IDENTITY_NOT_NFC,
    IDENTITY_NULL,
    IDENTITY_TOO_LONG,
    IDENTITY_TYPE,
    IDENTITY_WHITESPACE,
    LEGACY_UNPROFILED,
    MAX_DEPTH,
    PROFILES,
    V1,
    V1_PROFILE_ID,
    V2,
    V2_PROFILE_ID,
    CanonicalEncodingError,
    DigestProfile,
    DigestProfileEmpty,
    DigestProfileError,
    DigestProfileMismatch,
    DigestProfileReadOnly,
    DigestProfileUnknown,
    DigestRef,
    IdentityRejected,
    Record,
    authoring_profile,
    canonical_identity,
    canonical_optional_identity,
    canonical_value,
    decode,
    digest,
    encode,
    i64,
    profile_for,
    u32,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _secret_dir():
    """Override ``tests/conftest.py``'s autouse ``_secret_dir`` (which needs pytest-django's
    ``settings``): this module is pure Python and must also run with ``-p no:django``."""
    yield

# ---------------------------------------------------------------------------
# fixtures for the golden vectors
# ---------------------------------------------------------------------------

EVERY_TYPE_DOMAIN = "nexuscrm.test/golden-every-type"
EVERY_TYPE_RECORD = Record(
    [
        ("null", None),
        ("text", "Zoë ✓"),
        ("empty_text", ""),
        ("bytes", b"\x00\x01\xfe\xff"),
        ("empty_bytes", b""),
        ("zero", 0),
        ("negative", -1),
        ("i64_max", 9223372036854775807),
        ("i64_min", -9223372036854775808),
        ("true", True),
        ("false", False),
        ("list", [1, "x", None, [b"\x00"]]),
        ("record", Record([("inner", "v"), ("n", 255)])),
    ]
)
EVERY_TYPE_PREIMAGE_HEX = (
    "d50000001f6e6578757363726d2e746573742f676f6c64656e2d65766572792d74797065"  # 0xD5 u32(31) domain
    "060000000d"  # record, 13 fields
    "01000000046e756c6c" "00"  # "null": null
    "010000000474657874" "01000000085a6fc3ab20e29c93"  # "text": "Zoë ✓" (8 UTF-8 bytes)
    "010000000a656d7074795f74657874" "0100000000"  # "empty_text": ""
    "01000000056279746573" "02000000040001feff"  # "bytes": 00 01 fe ff
    "010000000b656d7074795f6279746573" "0200000000"  # "empty_bytes": b""
    "01000000047a65726f" "030000000000000000"  # "zero": 0
    "01000000086e65676174697665" "03ffffffffffffffff"  # "negative": -1
    "01000000076936345f6d6178" "037fffffffffffffff"  # "i64_max"
    "01000000076936345f6d696e" "038000000000000000"  # "i64_min"
    "010000000474727565" "0401"  # "true": true
    "010000000566616c7365" "0400"  # "false": false
    "01000000046c697374" "0500000004"  # "list": 4 items
    "030000000000000001" "010000000178" "00" "0500000001" "020000000100"  # 1, "x", null, [b"\x00"]
    "01000000067265636f7264" "0600000002"  # "record": 2 fields
    "0100000005696e6e6572" "010000000176"  # "inner": "v"
    "01000000016e" "0300000000000000ff"  # "n": 255
)
EVERY_TYPE_SHA256_HEX = "3348510e81feae2c05ae27f1050c0cf467feb5257f9e00fdde68c34ad7188986"

EMPTY_LIST_DOMAIN = "nexuscrm.test/golden-empty-list"
EMPTY_LIST_PREIMAGE_HEX = "d50000001f6e6578757363726d2e746573742f676f6c64656e2d656d7074792d6c697374" "0500000000"
EMPTY_LIST_SHA256_HEX = "b123651bc77181b999a3a7912021ea42594fd6a04ff4ffa844bcdd3862825eca"

V2_PURPOSE = "golden_fixture"
V2_RECORD = Record(
    [
        ("epoch_id", "epoch-0001"),
        ("serving_scope_digest", bytes(range(32))),
        ("binding_count", 2),
        ("bindings", ["b-1", "b-2"]),
    ]
)
V2_PREIMAGE_HEX = (
    # 0xD5 u32(51) "nexuscrm.connector-digest-profile.v2/golden_fixture"
    "d500000033"
    "6e6578757363726d2e636f6e6e6563746f722d6469676573742d70726f66696c652e7632"
    "2f676f6c64656e5f66697874757265"
    "0600000004"
    "010000000865706f63685f6964" "010000000a65706f63682d30303031"
    "010000001473657276696e675f73636f70655f646967657374"
    "0200000020000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
    "010000000d62696e64696e675f636f756e74" "030000000000000002"
    "010000000862696e64696e6773" "0500000002" "0100000003622d31" "0100000003622d32"
)
V2_SHA256_HEX = "7be609af067b826bcb396832d203d63f04f1491309ef9a68b7a7fbd2d03fd89b"

OPERATION_NAMESPACE = Record(
    [
        ("platform_instance_id", "plat-01"),
        ("tenant_id", "tenant-Zoë"),
        ("environment_id", "prod"),
        ("namespace_revision", 7),
    ]
)
OPERATION_NAMESPACE_PREIMAGE_HEX = (
    "d500000013" "6f7065726174696f6e5f6e616d657370616365"  # domain "operation_namespace"
    "0600000004"
    "0100000014706c6174666f726d5f696e7374616e63655f6964" "0100000007706c61742d3031"
    "010000000974656e616e745f6964" "010000000b74656e616e742d5a6fc3ab"
    "010000000e656e7669726f6e6d656e745f6964" "010000000470726f64"
    "01000000126e616d6573706163655f7265766973696f6e" "030000000000000007"
)
OPERATION_NAMESPACE_SHA256_HEX = "7c15ffc2c1c3e83032dc1517f8b7b9b2f2042b7c520edc622dfa70c2857f316e"

V1_RECORD = Record(
    [
        ("epoch_id", "epoch-0001"),
        ("scope_digest", b"\xde\xad\xbe\xef"),
        ("revision", 42),
        ("label", "Zoë"),
    ]
)
V1_PREIMAGE = (
    b"nexuscrm.connector-digest-profile.v1\n"
    b"epoch_id=epoch-0001\n"
    b"scope_digest=deadbeef\n"
    b"revision=42\n"
    b"label=Zo\xc3\xab\n"
)
V1_SHA256_HEX = "2c670bac756f48945e857cd15fcff20378d83d29690ceedd0341a3273343b82e"

# The worked example of docs/digest-profiles.md.
DOC_EXAMPLE_RECORD = Record([("id", "Zoë"), ("n", -2), ("ok", True), ("raw", b"\x00\xff"), ("gone", None)])
DOC_EXAMPLE_PREIMAGE_HEX = (
    "d5000000076578616d706c65"
    "0600000005"
    "0100000002696401000000045a6fc3ab"
    "01000000016e03fffffffffffffffe"
    "01000000026f6b0401"
    "0100000003726177020000000200ff"
    "0100000004676f6e6500"
)
DOC_EXAMPLE_SHA256_HEX = "070cec5bf898dd299d2793b026a811f1b62d62d7a5fb7519c425ddb9d98325f6"


# ---------------------------------------------------------------------------
# independent reference encoder (struct-based; written from the grammar only)
# ---------------------------------------------------------------------------


def _ref_value(v) -> bytes:
    if v is None:
        return b"\x00"
    if v is True or v is False:
        return b"\x04" + (b"\x01" if v else b"\x00")
    if isinstance(v, int):
        return b"\x03" + struct.pack(">q", v)
    if isinstance(v, str):
        b = v.encode("utf-8")
        return b"\x01" + struct.pack(">I", len(b)) + b
    if isinstance(v, bytes):
        return b"\x02" + struct.pack(">I", len(v)) + v
    if isinstance(v, (list, tuple)):
        return b"\x05" + struct.pack(">I", len(v)) + b"".join(_ref_value(x) for x in v)
    if isinstance(v, Record):
        out = b"\x06" + struct.pack(">I", len(v))
        for name, item in v:
            nb = name.encode("utf-8")
            out += b"\x01" + struct.pack(">I", len(nb)) + nb + _ref_value(item)
        return out
    raise AssertionError(f"reference encoder does not know {type(v)}")


def _ref_encode(domain: str, v) -> bytes:
    db = domain.encode("utf-8")
    return b"\xd5" + struct.pack(">I", len(db)) + db + _ref_value(v)


TYPED_GOLDEN = [
    pytest.param(EVERY_TYPE_DOMAIN, EVERY_TYPE_RECORD, EVERY_TYPE_PREIMAGE_HEX, EVERY_TYPE_SHA256_HEX, id="every-type"),
    pytest.param(EMPTY_LIST_DOMAIN, [], EMPTY_LIST_PREIMAGE_HEX, EMPTY_LIST_SHA256_HEX, id="empty-list"),
    pytest.param(f"{V2_PROFILE_ID}/{V2_PURPOSE}", V2_RECORD, V2_PREIMAGE_HEX, V2_SHA256_HEX, id="v2-profile"),
    pytest.param(
        "operation_namespace",
        OPERATION_NAMESPACE,
        OPERATION_NAMESPACE_PREIMAGE_HEX,
        OPERATION_NAMESPACE_SHA256_HEX,
        id="delivery-operation-namespace",
    ),
    pytest.param("example", DOC_EXAMPLE_RECORD, DOC_EXAMPLE_PREIMAGE_HEX, DOC_EXAMPLE_SHA256_HEX, id="docs-example"),
]


# ===========================================================================
# golden vectors
# ===========================================================================


@pytest.mark.parametrize(("domain", "value", "preimage_hex", "sha256_hex"), TYPED_GOLDEN)
def test_golden_vectors_match_frozen_bytes_and_reference_encoder(domain, value, preimage_hex, sha256_hex):
    """Proves: CV2-01-007, CV2-01-023

    The typed encoding (domain separator, tags, null, text/binary encodings,
    u32 length framing, fixed-width i64) produces exactly the frozen bytes,
    which an independent struct-based encoder also produces, and the digest is
    sha256 of those bytes.
    """
    expected = bytes.fromhex(preimage_hex)
    assert _ref_encode(domain, value) == expected  # the frozen hex matches the grammar
    assert encode(domain, value) == expected
    assert hashlib.sha256(expected).hexdigest() == sha256_hex
    assert digest(domain, value).hex() == sha256_hex
    assert len(digest(domain, value)) == 32


@pytest.mark.parametrize(("domain", "value", "preimage_hex", "sha256_hex"), TYPED_GOLDEN)
def test_golden_vectors_decode_strictly_and_reencode_identically(domain, value, preimage_hex, sha256_hex):
    """Proves: CV2-01-007, CV2-01-027

    The strict decoder inverts the encoding exactly: every accepted preimage
    re-encodes byte-for-byte (no recanonicalization path exists).
    """
    preimage = bytes.fromhex(preimage_hex)
    decoded_domain, decoded_value = decode(preimage)
    assert decoded_domain == domain
    assert decoded_value == canonical_value(value)
    assert encode(decoded_domain, decoded_value) == preimage


def test_golden_v2_profile_digest_frames_profile_id():
    """Proves: CV2-01-006, CV2-01-007, CV2-01-027

    The V2 profile's preimage is the typed encoding under the domain
    ``"<V2 profile id>/<purpose>"``, so the exact profile ID participates in
    every V2 digest; ``author`` pairs the digest with the exact profile ID.
    """
    assert V2.preimage(V2_PURPOSE, V2_RECORD).hex() == V2_PREIMAGE_HEX
    assert V2.digest(V2_PURPOSE, V2_RECORD).hex() == V2_SHA256_HEX
    assert decode(V2.preimage(V2_PURPOSE, V2_RECORD))[0] == "nexuscrm.connector-digest-profile.v2/golden_fixture"
    ref = V2.author(V2_PURPOSE, V2_RECORD)
    assert ref.profile_id == V2_PROFILE_ID
    assert ref.digest.hex() == V2_SHA256_HEX
    # Same purpose and value under the DELIVERY profile (no profile framing) differ.
    assert DELIVERY.digest(V2_PURPOSE, V2_RECORD) != V2.digest(V2_PURPOSE, V2_RECORD)


def test_golden_delivery_operation_namespace_digest():
    """Proves: CV2-01-007

    The REST bulk delivery ``operation_namespace`` digest is sha256 of
    ``canonical_typed_length_delimited_v1`` over the four declared fields in
    declared order, under the domain ``operation_namespace``.
    """
    assert DELIVERY.profile_id == "canonical_typed_length_delimited_v1"
    assert DELIVERY.preimage("operation_namespace", OPERATION_NAMESPACE).hex() == OPERATION_NAMESPACE_PREIMAGE_HEX
    ref = DELIVERY.author("operation_namespace", OPERATION_NAMESPACE)
    assert ref.profile_id == DELIVERY_PROFILE_ID
    assert ref.digest.hex() == OPERATION_NAMESPACE_SHA256_HEX


def test_golden_v1_recipe_is_byte_stable_and_read_only():
    """Proves: CV2-01-011

    Retained V1 bytes are reproduced only by the exact V1 recipe (frozen
    bytes and digest), V1 refuses authoring, and its digest is never equal to
    (nor comparable with) a V2 digest of the same fields.
    """
    assert V1.reader_preimage(None, V1_RECORD) == V1_PREIMAGE
    assert hashlib.sha256(V1_PREIMAGE).hexdigest() == V1_SHA256_HEX
    assert V1.recompute(None, V1_RECORD).hex() == V1_SHA256_HEX
    assert V1.verify(None, V1_RECORD, bytes.fromhex(V1_SHA256_HEX)) is True
    tampered = Record([(n, v) for n, v in V1_RECORD][:-1] + [("label", "Zoe")])
    assert V1.verify(None, tampered, bytes.fromhex(V1_SHA256_HEX)) is False
    for author in (V1.preimage, V1.digest, V1.author):
        with pytest.raises(DigestProfileReadOnly):
            author(None, V1_RECORD)
    v1_ref = V1.read(bytes.fromhex(V1_SHA256_HEX))
    v2_ref = V2.author("v1_fields", V1_RECORD)
    with pytest.raises(DigestProfileMismatch):
        v1_ref.same_as(v2_ref)


def test_v1_recipe_refuses_unrepresentable_values():
    """Proves: CV2-01-011

    The V1 reader only reproduces what the V1 line recipe can represent; it
    has no purpose framing, so a purpose is refused rather than ignored.
    """
    for bad in (
        Record([("a", None)]),
        Record([("a", True)]),
        Record([("a", ["x"])]),
        Record([("a", "line\nbreak")]),
        Record([("a=b", "x")]),
    ):
        with pytest.raises(CanonicalEncodingError) as exc:
            V1.reader_preimage(None, bad)
        assert exc.value.code == "CANONICAL_V1_UNREPRESENTABLE"
    with pytest.raises(CanonicalEncodingError):
        V1.reader_preimage(None, ["not", "a", "record"])
    with pytest.raises(TypeError):
        V1.recompute("some_purpose", V1_RECORD)


# ===========================================================================
# encoding properties
# ===========================================================================


def test_length_framing_prevents_concatenation_ambiguity():
    """Proves: CV2-01-023"""
    assert encode("d", ["ab", "c"]) != encode("d", ["a", "bc"])
    assert encode("d", [b"ab", b"c"]) != encode("d", [b"a", b"bc"])
    assert encode("ab", "c") != encode("a", "bc")
    assert encode("d", Record([("ab", "c")])) != encode("d", Record([("a", "bc")]))
    assert encode("d", [["a"], "b"]) != encode("d", [["a", "b"]])
    assert digest("d", ["ab", "c"]) != digest("d", ["a", "bc"])


def test_null_empty_text_and_empty_bytes_are_distinct():
    """Proves: CV2-01-004, CV2-01-007

    Null, empty text, empty binary, empty list and empty record each have a
    distinct encoding: blank is never an alias of null.
    """
    encodings = {
        encode("d", None),
        encode("d", ""),
        encode("d", b""),
        encode("d", []),
        encode("d", Record([])),
        encode("d", 0),
        encode("d", False),
    }
    assert len(encodings) == 7
    assert encode("d", None).hex() == "d5000000016400"
    assert encode("d", "").hex() == "d500000001640100000000"
    assert encode("d", b"").hex() == "d500000001640200000000"


def test_bool_is_not_int():
    """Proves: CV2-01-007"""
    assert encode("d", True).hex() == "d500000001640401"
    assert encode("d", 1).hex() == "d50000000164030000000000000001"
    assert encode("d", True) != encode("d", 1)
    assert encode("d", False) != encode("d", 0)
    assert Record([("a", True)]) != Record([("a", 1)])
    assert Record([("a", 1)]) == Record([("a", 1)])
    assert hash(Record([("a", [1, b"x"])])) == hash(Record([("a", (1, b"x"))]))


def test_field_order_matters():
    """Proves: CV2-01-007"""
    ab = Record([("a", 1), ("b", 2)])
    ba = Record([("b", 2), ("a", 1)])
    assert encode("d", ab) != encode("d", ba)
    assert digest("d", ab) != digest("d", ba)
    assert ab != ba
    assert encode("d", [1, 2]) != encode("d", [2, 1])


def test_fixed_width_integers_and_u32_framing_helpers():
    """Proves: CV2-01-023"""
    assert u32(0) == b"\x00\x00\x00\x00"
    assert u32(0xFFFFFFFF) == b"\xff\xff\xff\xff"
    assert i64(0) == b"\x00" * 8
    assert i64(-1) == b"\xff" * 8
    assert i64(I64_MAX) == b"\x7f" + b"\xff" * 7
    assert i64(I64_MIN) == b"\x80" + b"\x00" * 7
    for bad in (-1, 2**32, True, 1.0):
        with pytest.raises(CanonicalEncodingError) as exc:
            u32(bad)
        assert exc.value.code == "CANONICAL_LENGTH_OVERFLOW"
    for bad in (I64_MAX + 1, I64_MIN - 1):
        with pytest.raises(CanonicalEncodingError) as exc:
            i64(bad)
        assert exc.value.code == "CANONICAL_INT_RANGE"
    # Small and large integers take the same 8 bytes.
    assert len(encode("d", 0)) == len(encode("d", I64_MAX)) == len(encode("d", I64_MIN))


class _Color(enum.Enum):
    RED = "red"


class _StrColor(str, enum.Enum):
    RED = "red"


class _IntColor(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize(
    ("value", "code"),
    [
        pytest.param(1.0, "CANONICAL_FLOAT", id="float"),
        pytest.param(float("nan"), "CANONICAL_FLOAT", id="nan"),
        pytest.param({"a": 1}, "CANONICAL_UNORDERED_MAPPING", id="dict"),
        pytest.param(MappingProxyType({"a": 1}), "CANONICAL_UNORDERED_MAPPING", id="mappingproxy"),
        pytest.param({1, 2}, "CANONICAL_UNORDERED_SET", id="set"),
        pytest.param(frozenset({1}), "CANONICAL_UNORDERED_SET", id="frozenset"),
        pytest.param(I64_MAX + 1, "CANONICAL_INT_RANGE", id="int-above-i64"),
        pytest.param(I64_MIN - 1, "CANONICAL_INT_RANGE", id="int-below-i64"),
        pytest.param("\ud800", "CANONICAL_TEXT_ENCODING", id="lone-surrogate"),
        pytest.param(["ok", 1.5], "CANONICAL_FLOAT", id="nested-float"),
        pytest.param(Decimal("1"), "CANONICAL_UNSUPPORTED_TYPE", id="decimal"),
        pytest.param(1j, "CANONICAL_UNSUPPORTED_TYPE", id="complex"),
        pytest.param(object(), "CANONICAL_UNSUPPORTED_TYPE", id="object"),
        pytest.param(_Color.RED, "CANONICAL_UNSUPPORTED_TYPE", id="enum"),
        pytest.param(_StrColor.RED, "CANONICAL_UNSUPPORTED_TYPE", id="str-enum"),
        pytest.param(_IntColor.RED, "CANONICAL_UNSUPPORTED_TYPE", id="int-enum"),
        pytest.param(iter([1]), "CANONICAL_UNSUPPORTED_TYPE", id="iterator"),
    ],
)
def test_encode_rejects_noncanonical_values(value, code):
    """Proves: CV2-01-007

    The closed recipe has no float, unordered collection, or implicit type
    conversion; each is refused with a stable code.
    """
    with pytest.raises(CanonicalEncodingError) as exc:
        encode("d", value)
    assert exc.value.code == code
    assert isinstance(exc.value, ValueError)
    with pytest.raises(CanonicalEncodingError):
        Record([("field", value)])


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        pytest.param([("a", 1), ("a", 2)], "CANONICAL_FIELD_NAME_DUPLICATE", id="duplicate"),
        pytest.param([("", 1)], "CANONICAL_FIELD_NAME_EMPTY", id="empty"),
        pytest.param([(" a", 1)], "CANONICAL_FIELD_NAME_INVALID", id="leading-space"),
        pytest.param([("a\n", 1)], "CANONICAL_FIELD_NAME_INVALID", id="trailing-newline"),
        pytest.param([("a\x00b", 1)], "CANONICAL_FIELD_NAME_INVALID", id="control-char"),
        pytest.param([("e\u0301", 1)], "CANONICAL_FIELD_NAME_INVALID", id="not-nfc"),
        pytest.param([(None, 1)], "CANONICAL_FIELD_NAME_INVALID", id="none-name"),
        pytest.param([(b"a", 1)], "CANONICAL_FIELD_NAME_INVALID", id="bytes-name"),
        pytest.param([("a", 1, 2)], "CANONICAL_RECORD_FIELDS", id="triple"),
        pytest.param(["ab"], "CANONICAL_RECORD_FIELDS", id="not-a-pair"),
        pytest.param({"a": 1}, "CANONICAL_UNORDERED_MAPPING", id="dict"),
    ],
)
def test_record_rejects_bad_field_names(fields, code):
    """Proves: CV2-01-007"""
    with pytest.raises(CanonicalEncodingError) as exc:
        Record(fields)
    assert exc.value.code == code


@pytest.mark.parametrize(
    ("domain", "code"),
    [
        pytest.param("", "CANONICAL_DOMAIN_EMPTY", id="empty"),
        pytest.param(None, "CANONICAL_DOMAIN_INVALID", id="none"),
        pytest.param(b"d", "CANONICAL_DOMAIN_INVALID", id="bytes"),
        pytest.param(" d", "CANONICAL_DOMAIN_INVALID", id="leading-space"),
        pytest.param("d\t", "CANONICAL_DOMAIN_INVALID", id="trailing-tab"),
        pytest.param("a\u200bb", "CANONICAL_DOMAIN_INVALID", id="zero-width"),
        pytest.param("\ud800", "CANONICAL_DOMAIN_INVALID", id="surrogate"),
    ],
)
def test_encode_rejects_empty_or_noncanonical_domain(domain, code):
    """Proves: CV2-01-007"""
    with pytest.raises(CanonicalEncodingError) as exc:
        encode(domain, 1)
    assert exc.value.code == code
    with pytest.raises(CanonicalEncodingError):
        digest(domain, 1)


def test_digest_algorithm_is_closed():
    """Proves: CV2-01-007"""
    assert digest("d", 1) == hashlib.sha256(encode("d", 1)).digest()
    with pytest.raises(CanonicalEncodingError) as exc:
        digest("d", 1, algorithm="md5")
    assert exc.value.code == "CANONICAL_DIGEST_ALGORITHM"


def test_binary_values_are_defensively_copied_and_records_immutable():
    """Proves: CV2-01-023"""
    receipt = bytearray(b"\x01\x02")
    view_source = bytearray(b"\x03\x04")
    record = Record([("receipt", receipt), ("view", memoryview(view_source)), ("items", [bytearray(b"\x05")])])
    before = encode("d", record)
    receipt[0] = 0xFF
    view_source[0] = 0xFF
    assert encode("d", record) == before
    assert record.value_of("receipt") == b"\x01\x02"
    assert type(record.value_of("receipt")) is bytes
    assert record.value_of("items") == (b"\x05",)
    assert encode("d", bytearray(b"ab")) == encode("d", b"ab") == encode("d", memoryview(b"ab"))
    with pytest.raises(AttributeError):
        record.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        record._fields = ()  # type: ignore[misc]


def test_nesting_depth_is_bounded_and_cycles_fail_closed():
    """Proves: CV2-01-007"""
    value: list = []
    for _ in range(MAX_DEPTH - 1):
        value = [value]
    encode("d", value)  # exactly MAX_DEPTH nested lists is accepted
    with pytest.raises(CanonicalEncodingError) as exc:
        encode("d", [value])
    assert exc.value.code == "CANONICAL_TOO_DEEP"
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(CanonicalEncodingError) as exc:
        encode("d", cycle)
    assert exc.value.code == "CANONICAL_TOO_DEEP"


# ===========================================================================
# strict decoder
# ===========================================================================


def test_decode_rejects_every_truncation_and_trailing_bytes():
    """Proves: CV2-01-027"""
    preimage = bytes.fromhex(EVERY_TYPE_PREIMAGE_HEX)
    for cut in range(len(preimage)):
        with pytest.raises(CanonicalEncodingError) as exc:
            decode(preimage[:cut])
        assert exc.value.code in {"CANONICAL_DECODE_TRUNCATED", "CANONICAL_DECODE_MISSING_DOMAIN"}
    with pytest.raises(CanonicalEncodingError) as exc:
        decode(preimage + b"\x00")
    assert exc.value.code == "CANONICAL_DECODE_TRAILING_BYTES"


@pytest.mark.parametrize(
    ("preimage_hex", "code"),
    [
        pytest.param("", "CANONICAL_DECODE_MISSING_DOMAIN", id="empty"),
        pytest.param("0100000001640401", "CANONICAL_DECODE_MISSING_DOMAIN", id="no-domain-tag"),
        pytest.param("d5000000016407", "CANONICAL_DECODE_UNKNOWN_TAG", id="unknown-tag"),
        pytest.param("d500000001640402", "CANONICAL_DECODE_INVALID_BOOL", id="bool-02"),
        pytest.param("d50000000164010000000180", "CANONICAL_DECODE_INVALID_UTF8", id="bad-utf8"),
        pytest.param("d50000000164" "0600000001" "0100000001ff" "00", "CANONICAL_DECODE_INVALID_UTF8", id="bad-utf8-name"),
        pytest.param("d5000000036564a0" "00", "CANONICAL_DECODE_INVALID_UTF8", id="bad-utf8-domain"),
        pytest.param("d500000000" "00", "CANONICAL_DOMAIN_EMPTY", id="empty-domain"),
        pytest.param("d500000002206400", "CANONICAL_DOMAIN_INVALID", id="space-domain"),
        pytest.param("d50000000164" "0600000001" "0200000001" "61" "00", "CANONICAL_DECODE_FIELD_NAME_TAG", id="bytes-name"),
        pytest.param(
            "d50000000164" "0600000002" "010000000161" "00" "010000000161" "00",
            "CANONICAL_FIELD_NAME_DUPLICATE",
            id="duplicate-field",
        ),
        pytest.param("d50000000164" "0600000001" "0100000000" "00", "CANONICAL_FIELD_NAME_EMPTY", id="empty-field"),
        pytest.param("d50000000164" "0500000002" "00", "CANONICAL_DECODE_TRUNCATED", id="list-count-overstated"),
        pytest.param("d50000000164" "03000000", "CANONICAL_DECODE_TRUNCATED", id="short-int"),
    ],
)
def test_decode_rejects_malformed_preimages(preimage_hex, code):
    """Proves: CV2-01-027

    Malformed or noncanonical preimages fail closed with a stable code; the
    decoder never repairs or reinterprets bytes.
    """
    with pytest.raises(CanonicalEncodingError) as exc:
        decode(bytes.fromhex(preimage_hex))
    assert exc.value.code == code


def test_decode_rejects_excessive_nesting():
    """Proves: CV2-01-027"""
    hostile = bytes.fromhex("d50000000164") + b"\x05\x00\x00\x00\x01" * (MAX_DEPTH + 1) + b"\x00"
    with pytest.raises(CanonicalEncodingError) as exc:
        decode(hostile)
    assert exc.value.code == "CANONICAL_TOO_DEEP"


# ===========================================================================
# identity validation
# ===========================================================================

IDENTITY_REJECTIONS = [
    pytest.param(" abc", IDENTITY_WHITESPACE, id="leading-space"),
    pytest.param("abc ", IDENTITY_WHITESPACE, id="trailing-space"),
    pytest.param("\tabc", IDENTITY_WHITESPACE, id="leading-tab"),
    pytest.param("abc\t", IDENTITY_WHITESPACE, id="trailing-tab"),
    pytest.param("\nabc", IDENTITY_WHITESPACE, id="leading-newline"),
    pytest.param("abc\n", IDENTITY_WHITESPACE, id="trailing-newline"),
    pytest.param("abc\r\n", IDENTITY_WHITESPACE, id="trailing-crlf"),
    pytest.param("\u00a0abc", IDENTITY_WHITESPACE, id="leading-nbsp"),
    pytest.param("abc\u00a0", IDENTITY_WHITESPACE, id="trailing-nbsp"),
    pytest.param("abc\u3000", IDENTITY_WHITESPACE, id="trailing-ideographic-space"),
    pytest.param("\u200babc", IDENTITY_WHITESPACE, id="leading-zwsp"),
    pytest.param("abc\u200b", IDENTITY_WHITESPACE, id="trailing-zwsp"),
    pytest.param("abc\u200d", IDENTITY_WHITESPACE, id="trailing-zwj"),
    pytest.param("\u2060abc", IDENTITY_WHITESPACE, id="leading-word-joiner"),
    pytest.param("\ufeffabc", IDENTITY_WHITESPACE, id="leading-bom"),
    pytest.param("abc\ufeff", IDENTITY_WHITESPACE, id="trailing-bom"),
    pytest.param("   ", IDENTITY_WHITESPACE, id="only-spaces"),
    pytest.param("\u200b", IDENTITY_WHITESPACE, id="only-zwsp"),
    pytest.param(b" abc", IDENTITY_WHITESPACE, id="bytes-leading-space"),
    pytest.param("", IDENTITY_EMPTY, id="empty"),
    pytest.param(b"", IDENTITY_EMPTY, id="empty-bytes"),
    pytest.param(None, IDENTITY_NULL, id="none"),
    pytest.param(b"\xff", IDENTITY_ENCODING, id="invalid-utf8"),
    pytest.param(b"abc\xc3", IDENTITY_ENCODING, id="truncated-utf8"),
    pytest.param(b"\xc0\xaf", IDENTITY_ENCODING, id="overlong-utf8"),
    pytest.param(b"\xed\xa0\x80", IDENTITY_ENCODING, id="utf8-encoded-surrogate"),
    pytest.param("\ud800", IDENTITY_ENCODING, id="lone-surrogate"),
    pytest.param("a\udfffb", IDENTITY_ENCODING, id="interior-lone-surrogate"),
    pytest.param("a\x00b", IDENTITY_CONTROL_CHAR, id="nul"),
    pytest.param("a\x07b", IDENTITY_CONTROL_CHAR, id="bell"),
    pytest.param("a\tb", IDENTITY_CONTROL_CHAR, id="interior-tab"),
    pytest.param("a\nb", IDENTITY_CONTROL_CHAR, id="interior-newline"),
    pytest.param("a\x7fb", IDENTITY_CONTROL_CHAR, id="del"),
    pytest.param("a\x85b", IDENTITY_CONTROL_CHAR, id="c1-nel"),
    pytest.param("\x01abc", IDENTITY_CONTROL_CHAR, id="leading-control"),
    pytest.param("a\u200bb", IDENTITY_CONTROL_CHAR, id="interior-zwsp"),
    pytest.param("a\u00adb", IDENTITY_CONTROL_CHAR, id="soft-hyphen"),
    pytest.param("a\u202eb", IDENTITY_CONTROL_CHAR, id="bidi-override"),
    pytest.param("a\u2028b", IDENTITY_CONTROL_CHAR, id="line-separator"),
    pytest.param("e\u0301", IDENTITY_NOT_NFC, id="nfd-e-acute"),
    pytest.param("Zoe\u0308", IDENTITY_NOT_NFC, id="nfd-diaeresis"),
    pytest.param("\u212b", IDENTITY_NOT_NFC, id="angstrom-sign"),
    pytest.param("x" * 256, IDENTITY_TOO_LONG, id="too-long"),
    pytest.param(123, IDENTITY_TYPE, id="int"),
    pytest.param(True, IDENTITY_TYPE, id="bool"),
    pytest.param(1.5, IDENTITY_TYPE, id="float"),
    pytest.param(["abc"], IDENTITY_TYPE, id="list"),
    pytest.param(_StrColor.RED, IDENTITY_TYPE, id="str-enum"),
]


@pytest.mark.parametrize(("value", "code"), IDENTITY_REJECTIONS)
def test_identity_rejections(value, code):
    """Proves: CV2-01-003, CV2-01-004, CV2-01-029

    Noncanonical whitespace, empty/null values, invalid encoding, control
    characters, non-NFC text and over-long values are rejected before
    persistence with a stable code and the field name.
    """
    with pytest.raises(IdentityRejected) as exc:
        canonical_identity(value, field="external_locator")
    assert exc.value.code == code
    assert exc.value.field == "external_locator"
    assert isinstance(exc.value, ValueError)


def test_every_identity_code_is_exercised():
    """Proves: CV2-01-029"""
    assert {p.values[1] for p in IDENTITY_REJECTIONS} == set(IDENTITY_CODES)


def test_identity_rejection_message_does_not_echo_value():
    """Proves: CV2-01-029"""
    with pytest.raises(IdentityRejected) as exc:
        canonical_identity("secret-tenant-name ", field="tenant_id")
    assert "secret-tenant-name" not in str(exc.value)
    assert "U+0020" in str(exc.value)
    assert str(exc.value).startswith("tenant_id: IDENTITY_WHITESPACE")


@pytest.mark.parametrize(
    "value",
    [
        "abc",
        "ABC",
        "Zoë ✓",
        "a b",
        "a\u00a0b",
        "tenant/42:env-prod_x.y",
        "日本語",
        "🙂",
        "\u00c5",
        "x" * 255,
        "0",
    ],
)
def test_valid_identities_come_back_unchanged(value):
    """Proves: CV2-01-003, CV2-01-005

    Valid values are returned byte-identical: no trimming, case folding, or
    normalization happens anywhere.
    """
    result = canonical_identity(value, field="external_locator")
    assert result is value
    assert result.encode("utf-8") == value.encode("utf-8")
    assert canonical_identity(value.encode("utf-8"), field="external_locator") == value
    assert canonical_optional_identity(value, field="external_locator") is value


def test_identity_never_folds_case():
    """Proves: CV2-01-005"""
    upper = canonical_identity("Tenant-A", field="tenant_id")
    lower = canonical_identity("tenant-a", field="tenant_id")
    assert upper == "Tenant-A" and lower == "tenant-a"
    assert upper != lower


def _identity_code(value: str) -> str | None:
    try:
        canonical_identity(value, field="f")
    except IdentityRejected as exc:
        return exc.code
    return None


@pytest.mark.parametrize("code_point", range(128))
def test_identity_ascii_fast_path_decides_as_the_documented_checks(code_point):
    """Every ASCII character, alone, inside, leading and trailing a value, gets the code the documented checks give
    (computed here from `unicodedata`, not from the implementation): the printable-ASCII shortcut of
    `canonical_identity` (D-262) accepts nothing the character checks refuse. Proves: CV2-01-003, CV2-01-004"""
    import unicodedata

    ch = chr(code_point)
    control = unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp"}
    edge = IDENTITY_WHITESPACE if ch.isspace() else (IDENTITY_CONTROL_CHAR if control else None)
    assert _identity_code(f"a{ch}b") == (IDENTITY_CONTROL_CHAR if control else None)
    assert _identity_code(f"{ch}ab") == edge
    assert _identity_code(f"ab{ch}") == edge
    assert _identity_code(ch) == edge
    assert _identity_code("a" * 254 + ch) == edge and _identity_code("a" * 255 + ch) == IDENTITY_TOO_LONG


def test_identity_max_length_counts_code_points():
    """Proves: CV2-01-004, CV2-01-029"""
    assert canonical_identity("ëëë", field="f", max_length=3) == "ëëë"  # 6 UTF-8 bytes, 3 code points
    with pytest.raises(IdentityRejected) as exc:
        canonical_identity("abcd", field="f", max_length=3)
    assert exc.value.code == IDENTITY_TOO_LONG
    assert canonical_identity("x" * 1000, field="f", max_length=1000)


def test_optional_identity_keeps_null_and_blank_apart():
    """Proves: CV2-01-004, CV2-01-029"""
    assert canonical_optional_identity(None, field="remote_id") is None
    for blank, code in (("", IDENTITY_EMPTY), (b"", IDENTITY_EMPTY), (" ", IDENTITY_WHITESPACE)):
        with pytest.raises(IdentityRejected) as exc:
            canonical_optional_identity(blank, field="remote_id")
        assert exc.value.code == code
        assert exc.value.field == "remote_id"
    with pytest.raises(IdentityRejected) as exc:
        canonical_identity(None, field="remote_id")
    assert exc.value.code == IDENTITY_NULL


def test_identity_requires_field_name_and_sane_max_length():
    """Proves: CV2-01-029"""
    with pytest.raises(TypeError):
        canonical_identity("abc", field="")
    with pytest.raises(TypeError):
        canonical_identity("abc", field="f", max_length=0)


# ===========================================================================
# digest profiles
# ===========================================================================


def test_profile_lookup_is_exact():
    """Proves: CV2-01-009, CV2-01-010

    Lookup is by exact ID; ``None`` (no stored profile) resolves only to the
    legacy unprofiled entry.
    """
    assert profile_for(None) is LEGACY_UNPROFILED
    assert profile_for("nexuscrm.connector-digest-profile.v1") is V1
    assert profile_for("nexuscrm.connector-digest-profile.v2") is V2
    assert profile_for("canonical_typed_length_delimited_v1") is DELIVERY
    assert LEGACY_UNPROFILED.profile_id is None


@pytest.mark.parametrize(
    ("profile_id", "error", "code"),
    [
        pytest.param("", DigestProfileEmpty, "DIGEST_PROFILE_EMPTY", id="empty"),
        pytest.param("NEXUSCRM.connector-digest-profile.v2", DigestProfileUnknown, "DIGEST_PROFILE_UNKNOWN", id="case"),
        pytest.param(" nexuscrm.connector-digest-profile.v2", DigestProfileUnknown, "DIGEST_PROFILE_UNKNOWN", id="lead-sp"),
        pytest.param("nexuscrm.connector-digest-profile.v2 ", DigestProfileUnknown, "DIGEST_PROFILE_UNKNOWN", id="trail-sp"),
        pytest.param("nexuscrm.connector-digest-profile.v2\n", DigestProfileUnknown, "DIGEST_PROFILE_UNKNOWN", id="nl"),
        pytest.param("nexuscrm.connector-digest-profile.v3", DigestProfileUnknown, "DIGEST_PROFILE_UNKNOWN", id="v3"),
        pytest.param("v2", DigestProfileUnknown, "DIGEST_PROFILE_UNKNOWN", id="short-alias"),
        pytest.param(" ", DigestProfileUnknown, "DIGEST_PROFILE_UNKNOWN", id="blank"),
        pytest.param("0" * 64, DigestProfileUnknown, "DIGEST_PROFILE_UNKNOWN", id="digest-shaped"),
        pytest.param(b"nexuscrm.connector-digest-profile.v2", DigestProfileUnknown, "DIGEST_PROFILE_UNKNOWN", id="bytes"),
        pytest.param(2, DigestProfileUnknown, "DIGEST_PROFILE_UNKNOWN", id="int"),
    ],
)
def test_profile_lookup_rejections(profile_id, error, code):
    """Proves: CV2-01-009, CV2-01-013

    An empty ID aliases no profile and every non-exact variant (case,
    whitespace, unknown version, digest-shaped text) fails closed; nothing is
    inferred from shape.
    """
    for lookup in (profile_for, authoring_profile):
        with pytest.raises(error) as exc:
            lookup(profile_id)
        assert exc.value.code == code
        assert isinstance(exc.value, DigestProfileError)
        assert isinstance(exc.value, ValueError)
    with pytest.raises(error):
        DigestRef(profile_id, b"\x00" * 32)


def test_authoring_profile_refuses_legacy_and_v1():
    """Proves: CV2-01-010, CV2-01-011, CV2-01-012"""
    with pytest.raises(DigestProfileReadOnly) as exc:
        authoring_profile(None)
    assert exc.value.code == "DIGEST_PROFILE_READ_ONLY"
    with pytest.raises(DigestProfileReadOnly) as exc:
        authoring_profile(V1_PROFILE_ID)
    assert exc.value.code == "DIGEST_PROFILE_READ_ONLY"
    assert authoring_profile(V2_PROFILE_ID) is V2
    assert authoring_profile(DELIVERY_PROFILE_ID) is DELIVERY
    assert EPOCH_AUTHORING_PROFILE_ID == "nexuscrm.connector-digest-profile.v2"
    assert authoring_profile(EPOCH_AUTHORING_PROFILE_ID) is V2


def test_legacy_unprofiled_is_read_as_is_only():
    """Proves: CV2-01-010, CV2-01-015

    The legacy reader returns stored bytes exactly; it can never compute,
    author, recompute or verify (so a legacy candidate can never be verified).
    """
    stored = bytearray(b"legacy-\x00-digest-of-any-shape")
    ref = LEGACY_UNPROFILED.read(stored)
    stored[0] = 0
    assert ref.profile_id is None
    assert ref.digest == b"legacy-\x00-digest-of-any-shape"
    with pytest.raises(DigestProfileReadOnly):
        LEGACY_UNPROFILED.digest("p", 1)
    with pytest.raises(DigestProfileReadOnly):
        LEGACY_UNPROFILED.preimage("p", 1)
    with pytest.raises(DigestProfileReadOnly):
        LEGACY_UNPROFILED.author("p", 1)
    with pytest.raises(DigestProfileReadOnly):
        LEGACY_UNPROFILED.reader_preimage("p", 1)
    with pytest.raises(DigestProfileReadOnly):
        LEGACY_UNPROFILED.recompute("p", 1)
    with pytest.raises(DigestProfileReadOnly):
        LEGACY_UNPROFILED.verify("p", 1, ref)
    assert LEGACY_UNPROFILED.recomputable is False
    assert LEGACY_UNPROFILED.authoring is False


def test_only_v2_and_delivery_author():
    """Proves: CV2-01-010, CV2-01-011, CV2-01-012"""
    assert {p.profile_id for p in PROFILES.values() if p.authoring} == {V2_PROFILE_ID, DELIVERY_PROFILE_ID}
    assert {p.profile_id for p in PROFILES.values() if not p.authoring} == {None, V1_PROFILE_ID}


def test_cross_profile_comparison_raises():
    """Proves: CV2-01-026, CV2-01-027"""
    same_bytes = b"\x11" * 32
    v2_ref = V2.read(same_bytes)
    delivery_ref = DELIVERY.read(same_bytes)
    v1_ref = V1.read(same_bytes)
    legacy_ref = LEGACY_UNPROFILED.read(same_bytes)
    for a, b in ((v2_ref, delivery_ref), (v2_ref, v1_ref), (v2_ref, legacy_ref), (v1_ref, legacy_ref)):
        with pytest.raises(DigestProfileMismatch) as exc:
            a.same_as(b)
        assert exc.value.code == "DIGEST_PROFILE_MISMATCH"
        with pytest.raises(DigestProfileMismatch):
            b.same_as(a)
        with pytest.raises(DigestProfileMismatch):
            _ = a == b
    # Verifying against a ref of another profile also fails closed.
    with pytest.raises(DigestProfileMismatch):
        V2.verify(V2_PURPOSE, V2_RECORD, DigestRef(V1_PROFILE_ID, bytes.fromhex(V2_SHA256_HEX)))


def test_same_profile_comparison_is_exact():
    """Proves: CV2-01-026, CV2-01-029"""
    a = V2.read(b"\x11" * 32)
    assert a.same_as(V2.read(b"\x11" * 32)) is True
    assert a.same_as(V2.read(b"\x11" * 31 + b"\x12")) is False
    assert a == V2.read(b"\x11" * 32)
    assert a != V2.read(b"\x22" * 32)
    assert hash(a) == hash(V2.read(b"\x11" * 32))


def test_verify_recomputes_with_the_profiles_own_recipe():
    """Proves: CV2-01-026, CV2-01-027, CV2-01-029

    V2 verification recomputes under V2 only; any digest disagreement is
    ``False``; a digest of the wrong width for the profile is refused.
    """
    good = bytes.fromhex(V2_SHA256_HEX)
    assert V2.verify(V2_PURPOSE, V2_RECORD, good) is True
    assert V2.verify(V2_PURPOSE, V2_RECORD, V2.read(good)) is True
    bad = bytes([good[0] ^ 1]) + good[1:]
    assert V2.verify(V2_PURPOSE, V2_RECORD, bad) is False
    assert V2.verify("other_purpose", V2_RECORD, good) is False
    assert DELIVERY.verify("operation_namespace", OPERATION_NAMESPACE, bytes.fromhex(OPERATION_NAMESPACE_SHA256_HEX))
    with pytest.raises(CanonicalEncodingError) as exc:
        V2.read(good[:31])
    assert exc.value.code == "CANONICAL_DIGEST_LENGTH"


def test_digest_ref_is_frozen_and_copies_bytes():
    """Proves: CV2-01-006, CV2-01-015, CV2-01-023

    A ref pairs bytes with an exact profile, copies the bytes, and cannot be
    mutated or relabeled under another profile.
    """
    raw = bytearray(b"\x01" * 32)
    ref = DigestRef(V2_PROFILE_ID, raw)
    raw[0] = 0
    assert ref.digest == b"\x01" * 32
    assert type(ref.digest) is bytes
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.profile_id = V1_PROFILE_ID  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.digest = b"\x02" * 32  # type: ignore[misc]
    assert ref.profile is V2
    with pytest.raises(TypeError):
        DigestRef(V2_PROFILE_ID, "01" * 32)  # hex text is not a digest


def test_registry_is_closed():
    """Proves: CV2-01-007, CV2-01-009

    Exactly four profiles exist; the registry cannot be extended and no new
    profile can be constructed at runtime.
    """
    assert isinstance(PROFILES, MappingProxyType)
    assert len(PROFILES) == 4
    assert set(PROFILES) == {None, V1_PROFILE_ID, V2_PROFILE_ID, DELIVERY_PROFILE_ID}
    with pytest.raises(TypeError):
        PROFILES["nexuscrm.connector-digest-profile.v3"] = V2  # type: ignore[index]
    with pytest.raises(TypeError):
        DigestProfile(  # type: ignore[call-arg]
            profile_id="nexuscrm.connector-digest-profile.v3",
            label="rogue",
            authoring=True,
            algorithm="sha256",
            encoding="x",
            domain_rule="x",
            null_representation="x",
            text_encoding="x",
            binary_encoding="x",
            integer_encoding="x",
            length_framing="x",
            normalization="x",
            _recipe="typed_caller_domain",
        )
    with pytest.raises(dataclasses.FrozenInstanceError):
        V1.authoring = True  # type: ignore[misc]
    for profile in (V2, DELIVERY, V1):
        assert profile.algorithm == "sha256"
        assert profile.digest_size == 32
        for attr in (
            "encoding",
            "domain_rule",
            "null_representation",
            "text_encoding",
            "binary_encoding",
            "integer_encoding",
            "length_framing",
            "normalization",
        ):
            assert getattr(profile, attr)


@pytest.mark.parametrize("purpose", ["", " p", "p\n", None, b"p"])
def test_profile_purpose_must_be_canonical(purpose):
    """Proves: CV2-01-007"""
    with pytest.raises((CanonicalEncodingError, TypeError)):
        V2.digest(purpose, 1)
    with pytest.raises((CanonicalEncodingError, TypeError)):
        DELIVERY.digest(purpose, 1)


def test_kernel_is_pure_python_without_django():
    """Proves: (architecture constraint; no CV2 ID) the kernel imports no Django."""
    code = (
        "import sys, connector.canonical\n"
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_accepted_name_cache_never_accepts_a_rejected_name():
    """The cache of accepted field names and domains (issue 19, D-207) remembers only names that passed and never
    decides a rejection: a non-canonical name is refused every time, with the same code, before and after a
    canonical one was remembered, and a str subclass is never served from the cache."""
    from connector.canonical import encoding

    assert encoding.encode("d.v1", encoding.Record([("name", "x")])) == encoding.encode(
        "d.v1", encoding.Record([("name", "x")]))
    assert "name" in encoding._accepted_field_names
    for _ in range(2):
        for bad, code in ((" name", "CANONICAL_FIELD_NAME_INVALID"), ("", "CANONICAL_FIELD_NAME_EMPTY")):
            with pytest.raises(encoding.CanonicalEncodingError) as info:
                encoding.Record([(bad, 1)])
            assert info.value.code == code
            assert bad not in encoding._accepted_field_names

    class Name(str):
        pass

    with pytest.raises(encoding.CanonicalEncodingError) as info:
        encoding.Record([(Name("name"), 1)])
    assert info.value.code == "CANONICAL_FIELD_NAME_INVALID"
    with pytest.raises(encoding.CanonicalEncodingError):
        encoding.encode(" d.v1", 1)
    assert len(encoding._accepted_field_names) <= encoding.ACCEPTED_NAMES_MAX
