"""``canonical_typed_length_delimited_v1``: the canonical preimage encoding.

Byte layout (big-endian everywhere)::

    preimage := DOMAIN value
    DOMAIN   := 0xD5 u32(len) utf8(domain)           domain separator, always first
    value    := 0x00                                  explicit null (None)
              | 0x01 u32(len) utf8                    text (str)
              | 0x02 u32(len) bytes                   binary (bytes/bytearray/memoryview)
              | 0x03 i64                              integer, signed 8 bytes
              | 0x04 0x00|0x01                        boolean
              | 0x05 u32(count) value*                ordered list (list/tuple)
              | 0x06 u32(count) (0x01 u32(len) utf8(name) value)*
                                                      record, fields in declared order

``len`` is always a *byte* length. Every value carries its type tag and every
variable-length item its length, so no two distinct values share an encoding
(``("ab", "c")`` vs ``("a", "bc")``, ``None`` vs ``""`` vs ``b""``, ``True``
vs ``1`` all differ).

Rejected (:class:`CanonicalEncodingError`, stable ``.code``): ``float``,
``dict`` and any other mapping (unordered: use :class:`Record`), ``set``/
``frozenset``, any other type (including ``str``/``int`` subclasses such as
enums -- pass ``.value`` explicitly), integers outside the signed 64-bit range,
lengths/counts above ``2**32 - 1``, nesting deeper than :data:`MAX_DEPTH`,
text with lone surrogates, and empty/duplicate/non-canonical record field names
or domains (names and domains must pass
:func:`connector.canonical.identity.canonical_identity`: non-empty, no edge
whitespace, no control characters, NFC).

An :class:`Encoded` value (made only by :mod:`.shapes`, from values it framed itself) is written as its bytes:
the bytes of the value it was made from (D-272).

This module is pure Python (no Django) and is frozen by golden byte vectors in
``tests/connector/test_canonical.py``; any change to the bytes it produces is a
new encoding and needs a new profile, never an edit here. The strict decoder is
:mod:`connector.canonical.decoding` (D-260).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from .identity import IDENTITY_EMPTY, IdentityRejected, canonical_identity

__all__ = [
    "ENCODING_ID",
    "TAG_DOMAIN",
    "TAG_NULL",
    "TAG_TEXT",
    "TAG_BYTES",
    "TAG_INT",
    "TAG_BOOL",
    "TAG_LIST",
    "TAG_RECORD",
    "U32_MAX",
    "I64_MIN",
    "I64_MAX",
    "MAX_DEPTH",
    "SUPPORTED_DIGEST_ALGORITHMS",
    "CanonicalEncodingError",
    "Encoded",
    "Record",
    "canonical_value",
    "digest",
    "encode",
    "i64",
    "u32",
]

ENCODING_ID = "canonical_typed_length_delimited_v1"

TAG_DOMAIN = 0xD5
TAG_NULL = 0x00
TAG_TEXT = 0x01
TAG_BYTES = 0x02
TAG_INT = 0x03
TAG_BOOL = 0x04
TAG_LIST = 0x05
TAG_RECORD = 0x06

U32_MAX = 0xFFFF_FFFF
I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

#: Maximum number of nested lists/records (guards cycles and hostile preimages).
MAX_DEPTH = 64

SUPPORTED_DIGEST_ALGORITHMS = frozenset({"sha256"})

_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_BYTES_TYPES = (bytes, bytearray, memoryview)


class CanonicalEncodingError(ValueError):
    """A value cannot be canonically encoded (or a preimage cannot be decoded).

    ``code`` is stable, e.g. ``CANONICAL_FLOAT``, ``CANONICAL_UNORDERED_MAPPING``.
    """

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(f"{code}: {detail}")

    def __reduce__(self):
        return (type(self), (self.code, self.detail))


# ---------------------------------------------------------------------------
# fixed-width helpers
# ---------------------------------------------------------------------------


def u32(n: int) -> bytes:
    """Unsigned 32-bit big-endian; raises ``CANONICAL_LENGTH_OVERFLOW``."""
    if type(n) is not int or n < 0 or n > U32_MAX:
        raise CanonicalEncodingError("CANONICAL_LENGTH_OVERFLOW", f"length/count {n!r} is not a u32")
    return _U32.pack(n)


def i64(n: int) -> bytes:
    """Signed 64-bit big-endian two's complement; raises ``CANONICAL_INT_RANGE``."""
    if type(n) is not int:
        raise CanonicalEncodingError("CANONICAL_UNSUPPORTED_TYPE", f"i64 expects int, got {type(n).__name__}")
    if n < I64_MIN or n > I64_MAX:
        raise CanonicalEncodingError("CANONICAL_INT_RANGE", "integer outside the signed 64-bit range")
    return _I64.pack(n)


# ---------------------------------------------------------------------------
# canonical text checks for domains and field names
# ---------------------------------------------------------------------------


def _check_name(value: object, *, what: str, empty_code: str, invalid_code: str) -> str:
    try:
        # max_length is bounded by u32 framing, checked on the encoded bytes.
        return canonical_identity(value, field=what, max_length=U32_MAX)
    except IdentityRejected as exc:
        code = empty_code if exc.code == IDENTITY_EMPTY else invalid_code
        err = CanonicalEncodingError(code, f"{what} is not canonical text ({exc.code}: {exc.detail})")
        err.identity_code = exc.code  # type: ignore[attr-defined]
        raise err from exc


#: Names (domains and record field names) already accepted by :func:`_check_name`. The check is a pure function
#: of an immutable ``str`` (exact type), so a name accepted once is accepted forever; only accepted names are
#: remembered, and at most :data:`ACCEPTED_NAMES_MAX` of them (code declares a few dozen; hostile input cannot
#: grow it past the bound). Rejections are never cached: every rejected name is checked, and raises, every time.
#: Without it, every field of every record re-ran the Unicode category scan of its name (issue 19: 37% of the
#: owner reread at 10,000 accounts). The bytes produced are unchanged.
ACCEPTED_NAMES_MAX = 4096
_accepted_domains: set[str] = set()
_accepted_field_names: set[str] = set()
#: The encoded field-name prefix (text tag, u32 byte length, UTF-8) of each name written so far, same bound.
_name_headers: dict[str, bytes] = {}


def _remember(accepted: set[str], name: str) -> str:
    if len(accepted) < ACCEPTED_NAMES_MAX:
        accepted.add(name)
    return name


def _check_domain(domain: object) -> str:
    if type(domain) is not str:
        raise CanonicalEncodingError("CANONICAL_DOMAIN_INVALID", f"domain must be str, got {type(domain).__name__}")
    if domain in _accepted_domains:
        return domain
    return _remember(_accepted_domains, _check_name(
        domain, what="domain", empty_code="CANONICAL_DOMAIN_EMPTY", invalid_code="CANONICAL_DOMAIN_INVALID"))


def _check_field_name(name: object) -> str:
    if type(name) is not str:
        raise CanonicalEncodingError(
            "CANONICAL_FIELD_NAME_INVALID", f"record field name must be str, got {type(name).__name__}"
        )
    if name in _accepted_field_names:
        return name
    return _remember(_accepted_field_names, _check_name(
        name,
        what="record field name",
        empty_code="CANONICAL_FIELD_NAME_EMPTY",
        invalid_code="CANONICAL_FIELD_NAME_INVALID",
    ))


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8", errors="strict")
    except UnicodeEncodeError:
        raise CanonicalEncodingError("CANONICAL_TEXT_ENCODING", f"{what} is not encodable as strict UTF-8") from None


# ---------------------------------------------------------------------------
# freezing / validation
# ---------------------------------------------------------------------------


def _freeze(value: Any, depth: int) -> Any:
    """Validate ``value`` and return its immutable canonical form.

    ``depth`` is the number of lists/records enclosing ``value``.

    None/str/int/bool are returned as-is, bytes-likes are copied to ``bytes``,
    lists/tuples become tuples, records stay records (already frozen).
    """
    if value is None:
        return None
    # bool before int: bool is an int subclass.
    if type(value) is bool:
        return value
    if type(value) is int:
        if value < I64_MIN or value > I64_MAX:
            raise CanonicalEncodingError("CANONICAL_INT_RANGE", "integer outside the signed 64-bit range")
        return value
    if type(value) is str:
        data = _utf8(value, "text")
        u32(len(data))
        return value
    if isinstance(value, bytes):
        if type(value) is not bytes:
            value = bytes(value)
        u32(len(value))
        return value
    if isinstance(value, (bytearray, memoryview)):
        copied = value.tobytes() if isinstance(value, memoryview) else bytes(value)  # defensive copy
        u32(len(copied))
        return copied
    if isinstance(value, (Record, Encoded)):
        if depth + value._depth > MAX_DEPTH:
            raise CanonicalEncodingError("CANONICAL_TOO_DEEP", f"more than {MAX_DEPTH} nested lists/records")
        return value
    if type(value) in (list, tuple):
        if depth + 1 > MAX_DEPTH:
            raise CanonicalEncodingError("CANONICAL_TOO_DEEP", f"more than {MAX_DEPTH} nested lists/records")
        u32(len(value))
        return tuple(_freeze(item, depth + 1) for item in value)
    if isinstance(value, float):
        raise CanonicalEncodingError("CANONICAL_FLOAT", "floats have no canonical encoding; use int or text")
    if isinstance(value, Mapping):
        raise CanonicalEncodingError("CANONICAL_UNORDERED_MAPPING", "mappings are unordered; use Record")
    if isinstance(value, (set, frozenset)):
        raise CanonicalEncodingError("CANONICAL_UNORDERED_SET", "sets are unordered; use a sorted list")
    raise CanonicalEncodingError("CANONICAL_UNSUPPORTED_TYPE", f"type {type(value).__name__} is not encodable")


def canonical_value(value: Any) -> Any:
    """Validate and return the immutable canonical form of ``value``.

    ``decode(encode(d, v)) == (d, canonical_value(v))``.
    """
    return _freeze(value, 0)


class Record:
    """An immutable, ordered sequence of ``(name, value)`` pairs.

    Field order is the declared order and is part of the encoding. Names must
    be unique, non-empty canonical text. Values are validated and frozen at
    construction (bytes-likes are copied, lists become tuples), so a Record can
    never change after it was built.

    Two Records are equal iff their canonical encodings are equal (so
    ``Record([("a", True)]) != Record([("a", 1)])``, unlike tuple equality).
    """

    __slots__ = ("_fields", "_depth", "_encoded")

    def __init__(self, fields: Iterable[tuple[str, Any]] = ()) -> None:
        if isinstance(fields, Mapping):
            raise CanonicalEncodingError(
                "CANONICAL_UNORDERED_MAPPING", "Record() takes an ordered iterable of (name, value) pairs, not a mapping"
            )
        if isinstance(fields, (str, bytes, bytearray, memoryview, set, frozenset)):
            raise CanonicalEncodingError("CANONICAL_RECORD_FIELDS", "Record() takes an iterable of (name, value) pairs")
        frozen: list[tuple[str, Any]] = []
        seen: set[str] = set()
        depth = 0
        for pair in fields:
            if type(pair) not in (tuple, list) or len(pair) != 2:
                raise CanonicalEncodingError("CANONICAL_RECORD_FIELDS", "each record field must be a (name, value) pair")
            name, value = pair
            if type(name) is not str or name not in _accepted_field_names:
                name = _check_field_name(name)
            if name in seen:
                raise CanonicalEncodingError("CANONICAL_FIELD_NAME_DUPLICATE", f"duplicate record field name {name!r}")
            seen.add(name)
            # Scalars inline (the same checks as _freeze: strict UTF-8 and a u32 byte length; depth 0); the
            # rest through _freeze. Issue 19: records are built per account and per credential generation.
            kind = type(value)
            if kind is str:
                try:
                    size = len(value.encode("utf-8"))
                except UnicodeEncodeError:
                    _utf8(value, "text")  # raises CANONICAL_TEXT_ENCODING
                    raise  # pragma: no cover - _utf8 raised
                if size > U32_MAX:
                    u32(size)  # raises CANONICAL_LENGTH_OVERFLOW
                frozen_value = value
            elif kind is bytes:
                if len(value) > U32_MAX:
                    u32(len(value))  # raises CANONICAL_LENGTH_OVERFLOW
                frozen_value = value
            elif value is None or kind is bool:
                frozen_value = value
            else:
                frozen_value = _freeze(value, 1)
                depth = max(depth, _depth_of(frozen_value))
            frozen.append((name, frozen_value))
        u32(len(frozen))
        object.__setattr__(self, "_fields", tuple(frozen))
        object.__setattr__(self, "_depth", depth + 1)
        object.__setattr__(self, "_encoded", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Record is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Record is immutable")

    @property
    def fields(self) -> tuple[tuple[str, Any], ...]:
        return self._fields

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._fields)

    def value_of(self, name: str) -> Any:
        for field_name, value in self._fields:
            if field_name == name:
                return value
        raise KeyError(name)

    def __iter__(self):
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __getitem__(self, index: int) -> tuple[str, Any]:
        return self._fields[index]

    def _canonical_bytes(self) -> bytes:
        if self._encoded is None:
            out = bytearray()
            _write(out, self)
            object.__setattr__(self, "_encoded", bytes(out))
        return self._encoded

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return self._canonical_bytes() == other._canonical_bytes()

    def __hash__(self) -> int:
        return hash(self._canonical_bytes())

    def __repr__(self) -> str:
        inner = ", ".join(f"({name!r}, {value!r})" for name, value in self._fields)
        return f"Record([{inner}])"

    def __reduce__(self):
        return (Record, (self._fields,))


_ENCODED_TOKEN = object()


class Encoded:
    """The canonical bytes of one value (no domain), made only by :mod:`.shapes` from values it framed itself,
    so that a fixed-shape list of N records can enter a Record or :func:`encode` without N Record objects
    (issue 19). Encoding writes ``data`` as-is: the bytes are those of the value it was made from, never caller
    bytes (the constructor refuses without the module's token). Not decodable back into itself: it is an input
    to encoding only."""

    __slots__ = ("data", "_depth")

    def __init__(self, data: bytes, depth: int, token: object) -> None:
        if token is not _ENCODED_TOKEN:
            raise TypeError("Encoded values are made by connector.canonical.shapes, never from caller bytes")
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "_depth", depth)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Encoded is immutable")

    def __repr__(self) -> str:
        return f"Encoded({len(self.data)} bytes)"


def _depth_of(value: Any) -> int:
    if isinstance(value, (Record, Encoded)):
        return value._depth
    if type(value) is tuple:
        return 1 + max((_depth_of(item) for item in value), default=0)
    return 0


# ---------------------------------------------------------------------------
# encoding
# ---------------------------------------------------------------------------


def _write(out: bytearray, value: Any) -> None:
    """Serialize an already-frozen value."""
    if value is None:
        out.append(TAG_NULL)
    elif type(value) is bool:
        out.append(TAG_BOOL)
        out.append(0x01 if value else 0x00)
    elif type(value) is int:
        out.append(TAG_INT)
        out += i64(value)
    elif type(value) is str:
        data = _utf8(value, "text")
        out.append(TAG_TEXT)
        out += _U32.pack(len(data))  # _freeze (or Record) checked the u32 length of every frozen text
        out += data
    elif type(value) is bytes:
        out.append(TAG_BYTES)
        out += _U32.pack(len(value))  # checked when frozen, as above
        out += value
    elif type(value) is tuple:
        out.append(TAG_LIST)
        out += u32(len(value))
        for item in value:
            _write(out, item)
    elif type(value) is Encoded:
        out += value.data
    elif isinstance(value, Record):
        if value._encoded is not None:
            out += value._encoded
            return
        out.append(TAG_RECORD)
        out += u32(len(value._fields))
        for name, item in value._fields:
            header = _name_headers.get(name)
            if header is None:
                data = _utf8(name, "record field name")
                header = bytes([TAG_TEXT]) + u32(len(data)) + data
                if len(_name_headers) < ACCEPTED_NAMES_MAX:
                    _name_headers[name] = header
            out += header
            _write(out, item)
    else:  # pragma: no cover - _freeze guarantees this cannot happen
        raise CanonicalEncodingError("CANONICAL_UNSUPPORTED_TYPE", f"type {type(value).__name__} is not encodable")


def encode(domain: str, value: Any) -> bytes:
    """Return the canonical preimage ``DOMAIN value`` as ``bytes``."""
    domain = _check_domain(domain)
    frozen = _freeze(value, 0)
    out = bytearray()
    domain_bytes = _utf8(domain, "domain")
    out.append(TAG_DOMAIN)
    out += u32(len(domain_bytes))
    out += domain_bytes
    _write(out, frozen)
    return bytes(out)


def digest(domain: str, value: Any, algorithm: str = "sha256") -> bytes:
    """Raw digest (32 bytes for sha256) of ``encode(domain, value)``."""
    if algorithm not in SUPPORTED_DIGEST_ALGORITHMS:
        raise CanonicalEncodingError("CANONICAL_DIGEST_ALGORITHM", f"unsupported digest algorithm {algorithm!r}")
    return hashlib.new(algorithm, encode(domain, value)).digest()
