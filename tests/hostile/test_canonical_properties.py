"""Hypothesis properties of the canonical kernel (connector/canonical), beyond the golden vectors of
tests/connector/test_canonical.py: the encoding round-trips and is injective on every value it accepts, strict
decoding of arbitrary bytes either fails with a coded error or yields a preimage that re-encodes byte-identically,
and identity validation returns its input unchanged or rejects it, never a repaired value, rejecting every empty,
whitespace-padded or non-NFC input. No database."""
from __future__ import annotations

import sys
import unicodedata

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from connector.canonical import (
    I64_MAX,
    I64_MIN,
    IDENTITY_CODES,
    IDENTITY_EMPTY,
    IDENTITY_NOT_NFC,
    IDENTITY_WHITESPACE,
    CanonicalEncodingError,
    IdentityRejected,
    Record,
    canonical_identity,
    canonical_optional_identity,
    canonical_value,
    decode,
    encode,
)
from connector.canonical.identity import EDGE_INVISIBLE_CHARACTERS

# database=None: no .hypothesis/ example directory is written into the work tree.
PROPERTIES = settings(max_examples=300, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow])

# -- strategies ---------------------------------------------------------------------------------------------------

# Text without lone surrogates (the kernel rejects those; a separate property covers them).
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=24)
SAFE = st.characters(whitelist_categories=("Lu", "Ll", "Nd"), max_codepoint=0x7F)
# Canonical names: non-empty, no edge whitespace, no control/format/line-separator characters, NFC.
NAMES = st.text(st.characters(exclude_categories=("Cs", "Cc", "Cf", "Zl", "Zp", "Zs")), min_size=1, max_size=12) \
    .filter(lambda s: unicodedata.is_normalized("NFC", s) and not s[0].isspace() and not s[-1].isspace())

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(I64_MIN, I64_MAX), TEXT, st.binary(max_size=24))


def _records(children):
    return st.lists(st.tuples(NAMES, children), max_size=4, unique_by=lambda pair: pair[0]).map(Record)


VALUES = st.recursive(SCALARS, lambda children: st.one_of(st.lists(children, max_size=4),
                                                          st.tuples(children, children), _records(children)),
                      max_leaves=20)
DOMAINS = NAMES


def key(value):
    """A type-strict structural identity of a canonical value (Python's `True == 1` and `(1,) == [1]` blur it)."""
    if value is None:
        return ("null",)
    if type(value) is bool:
        return ("bool", value)
    if type(value) is int:
        return ("int", value)
    if type(value) is str:
        return ("text", value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("bytes", bytes(value))
    if isinstance(value, Record):
        return ("record", tuple((name, key(v)) for name, v in value.fields))
    return ("list", tuple(key(v) for v in value))


# -- encoding -------------------------------------------------------------------------------------------------------

@PROPERTIES
@given(DOMAINS, VALUES)
def test_encode_decode_round_trip(domain, value):
    """decode(encode(d, v)) == (d, canonical_value(v)), type-strictly, and re-encoding gives the same bytes."""
    preimage = encode(domain, value)
    decoded_domain, decoded = decode(preimage)
    assert decoded_domain == domain
    assert key(decoded) == key(canonical_value(value)) == key(value)
    assert encode(decoded_domain, decoded) == preimage


@PROPERTIES
@given(DOMAINS, VALUES, DOMAINS, VALUES)
def test_encoding_is_injective(domain_a, a, domain_b, b):
    """Distinct (domain, value) pairs never share a preimage; equal ones always do."""
    same = domain_a == domain_b and key(a) == key(b)
    assert (encode(domain_a, a) == encode(domain_b, b)) == same


@PROPERTIES
@given(st.lists(TEXT, min_size=1, max_size=5), st.data())
def test_regrouping_the_same_characters_changes_the_encoding(parts, data):
    """Length framing: ("ab", "c") and ("a", "bc") — any other split of the same characters — differ."""
    joined = "".join(parts)
    cuts = data.draw(st.lists(st.integers(0, len(joined)), max_size=4).map(sorted))
    other = [joined[i:j] for i, j in zip([0, *cuts], [*cuts, len(joined)])]
    assume(other != parts)
    assert encode("d", parts) != encode("d", other)


@PROPERTIES
@given(VALUES, VALUES)
def test_python_equal_values_of_another_type_never_collide(a, b):
    """Type tags: True == 1 and (1,) == [1] in Python, yet True/1, None/""/b"" and list/record differ here."""
    if key(a) != key(b):
        assert encode("d", a) != encode("d", b)
    for x, y in ((True, 1), (False, 0), (None, ""), (None, b""), ("", b""), ((), Record([]))):
        assert encode("d", x) != encode("d", y)


@PROPERTIES
@given(st.binary(max_size=64))
def test_decoding_arbitrary_bytes_is_strict(blob):
    """Any byte string either fails with a coded CanonicalEncodingError or is exactly a canonical preimage."""
    try:
        domain, value = decode(blob)
    except CanonicalEncodingError as exc:
        assert exc.code.startswith("CANONICAL_")
        return
    assert encode(domain, value) == blob


@PROPERTIES
@given(DOMAINS, VALUES, st.data())
def test_mutated_preimages_never_decode_to_the_same_value(domain, value, data):
    """Flipping one byte of a preimage is detected (an error) or yields a different (domain, value)."""
    preimage = bytearray(encode(domain, value))
    index = data.draw(st.integers(0, len(preimage) - 1))
    preimage[index] ^= data.draw(st.integers(1, 255))
    try:
        decoded_domain, decoded = decode(bytes(preimage))
    except CanonicalEncodingError:
        return
    assert (decoded_domain, key(decoded)) != (domain, key(value))


# -- identity validation ---------------------------------------------------------------------------------------------

ANY_TEXT = st.text(max_size=40)  # includes lone surrogates, controls, format characters, every script


@PROPERTIES
@given(st.one_of(ANY_TEXT, st.binary(max_size=40), st.integers(), st.none(), st.floats()))
def test_identity_is_returned_unchanged_or_rejected(value):
    """Never a changed value: text comes back identical (same code points), UTF-8 bytes come back as exactly the
    text they encode; everything else is rejected with a stable code."""
    try:
        out = canonical_identity(value, field="k")
    except IdentityRejected as exc:
        assert exc.code in IDENTITY_CODES and exc.field == "k"
        return
    assert type(out) is str
    if isinstance(value, str):
        assert out == value
    else:
        assert out.encode("utf-8") == value
    # accepted values are fixed points: validating again changes nothing
    assert canonical_identity(out, field="k") == out
    assert canonical_optional_identity(out, field="k") == out


EDGE_SPACE = st.sampled_from(sorted({chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}
                                    | set(EDGE_INVISIBLE_CHARACTERS)))
CORE = st.text(SAFE, min_size=1, max_size=20)


@PROPERTIES
@given(CORE, st.lists(EDGE_SPACE, min_size=1, max_size=3).map("".join), st.sampled_from(["lead", "trail", "both"]))
def test_every_whitespace_padded_identity_is_rejected(core, pad, where):
    value = {"lead": pad + core, "trail": core + pad, "both": pad + core + pad}[where]
    with pytest.raises(IdentityRejected) as exc:
        canonical_identity(value, field="k")
    assert exc.value.code == IDENTITY_WHITESPACE
    with pytest.raises(IdentityRejected):
        canonical_identity(value.encode("utf-8"), field="k")


@PROPERTIES
@given(st.lists(EDGE_SPACE, min_size=1, max_size=5).map("".join))
def test_whitespace_only_and_empty_identities_are_rejected(blank):
    for value in (blank, ""):
        with pytest.raises(IdentityRejected) as exc:
            canonical_identity(value, field="k")
        assert exc.value.code == (IDENTITY_EMPTY if value == "" else IDENTITY_WHITESPACE)
    with pytest.raises(IdentityRejected) as exc:
        canonical_identity(b"", field="k")
    assert exc.value.code == IDENTITY_EMPTY


def _non_nfc_pieces() -> list[str]:
    """Short strings that are not NFC and contain nothing else the validator rejects: singletons that NFC
    replaces (U+212B ANGSTROM SIGN -> U+00C5) and canonical decompositions that NFC recomposes (e + U+0301)."""
    pieces = []
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        if unicodedata.category(ch) in ("Cs", "Co", "Cn", "Cc", "Cf", "Zl", "Zp") or ch.isspace():
            continue
        if unicodedata.normalize("NFC", ch) != ch:
            pieces.append(ch)
        decomposed = unicodedata.normalize("NFD", ch)
        if decomposed != ch and not unicodedata.is_normalized("NFC", decomposed):
            pieces.append(decomposed)
    return pieces


NON_NFC = _non_nfc_pieces()


@PROPERTIES
@given(CORE, st.sampled_from(NON_NFC), CORE)
def test_every_non_nfc_identity_is_rejected_never_normalized(prefix, piece, suffix):
    value = prefix + piece + suffix
    assert not unicodedata.is_normalized("NFC", value)
    with pytest.raises(IdentityRejected) as exc:
        canonical_identity(value, field="k")
    assert exc.value.code == IDENTITY_NOT_NFC
    with pytest.raises(IdentityRejected) as exc:
        canonical_identity(value.encode("utf-8"), field="k")
    assert exc.value.code == IDENTITY_NOT_NFC
    # and the NFC form of the same text, which is a different identity, is accepted as itself
    normalized = unicodedata.normalize("NFC", value)
    assert canonical_identity(normalized, field="k") == normalized != value


@PROPERTIES
@given(NAMES, st.sampled_from(["lead", "trail"]), EDGE_SPACE)
def test_domains_and_field_names_follow_identity_rules(name, where, space):
    """A padded domain or record field name is refused by the encoder too (names are identities)."""
    padded = space + name if where == "lead" else name + space
    with pytest.raises(CanonicalEncodingError):
        encode(padded, None)
    with pytest.raises(CanonicalEncodingError):
        Record([(padded, 1)])
    assert decode(encode(name, Record([(name, 1)])))[0] == name
