"""Fixed-shape records encoded straight to ``canonical_typed_length_delimited_v1`` bytes (issue 19, D-272).

An owner reread recomputes the same few record shapes once per account or credential generation (a credential
receipt, a configuration account, a relation triple, a credential proof). Building a :class:`.encoding.Record`
per row validates its field names and freezes its values again each time; a :class:`RecordShape` validates its
names once (through ``Record`` itself) and then writes each row's values next to the pre-encoded field-name
frames. The bytes are exactly those of ``encode(domain, Record(zip(names, values)))``: scalars of exact type
``str``/``bytes``/``int``/``bool``/``None`` and lists of them are framed here with the same tags, lengths and
checks; any other value (a Record, a memoryview, a float, a too-long text, a lone surrogate, an out-of-range
integer...) goes through the generic encoder, which frames it, or raises, exactly as it always did.
``tests/connector/test_canonical_shapes.py`` compares both on edge cases and random values.

Pure Python, no Django (the ``connector.canonical`` contract).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from .encoding import (
    _ENCODED_TOKEN,
    I64_MAX,
    I64_MIN,
    MAX_DEPTH,
    TAG_LIST,
    TAG_RECORD,
    U32_MAX,
    Encoded,
    Record,
    _freeze,
    _write,
    encode,
    u32,
)

__all__ = ["RecordShape", "text_list"]

_U32 = struct.Struct(">I").pack
_I64 = struct.Struct(">q").pack
_LIST = bytes([TAG_LIST])


def _generic(value: Any, depth: int) -> bytes:
    out = bytearray()
    _write(out, _freeze(value, depth))
    return bytes(out)


def _value(value: Any, depth: int) -> bytes:
    """The canonical bytes of ``value`` enclosed by ``depth`` lists/records (the generic encoder's for any value
    this fast path does not frame itself)."""
    kind = type(value)
    if kind is str:
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError:
            return _generic(value, depth)  # raises CANONICAL_TEXT_ENCODING
        if len(data) > U32_MAX:
            return _generic(value, depth)  # raises CANONICAL_LENGTH_OVERFLOW
        return b"\x01" + _U32(len(data)) + data
    if kind is bytes:
        if len(value) > U32_MAX:
            return _generic(value, depth)
        return b"\x02" + _U32(len(value)) + value
    if kind is int:
        if I64_MIN <= value <= I64_MAX:
            return b"\x03" + _I64(value)
        return _generic(value, depth)  # raises CANONICAL_INT_RANGE
    if value is None:
        return b"\x00"
    if kind is bool:
        return b"\x04\x01" if value else b"\x04\x00"
    if kind is Encoded:
        if depth + value._depth > MAX_DEPTH:
            return _generic(value, depth)  # raises CANONICAL_TOO_DEEP
        return value.data
    if (kind is list or kind is tuple) and depth + 1 <= MAX_DEPTH and len(value) <= U32_MAX:
        return b"".join([_LIST, _U32(len(value)), *[_value(item, depth + 1) for item in value]])
    return _generic(value, depth)


def _depth(value: Any) -> int:
    """How many lists/records a value is (0 for a scalar), as ``Record`` counts it."""
    kind = type(value)
    if kind is Encoded or isinstance(value, Record):
        return value._depth
    if kind is list or kind is tuple:
        return 1 + max((_depth(item) for item in value), default=0)
    return 0


def text_list(values: Iterable[Any]) -> Encoded:
    """A list value as one :class:`Encoded` value: the bytes of ``list(values)``."""
    items = list(values)
    return Encoded(_value(items, 0), _depth(items), _ENCODED_TOKEN)


class RecordShape:
    """A record with these field names in this order. ``encode(domain, *values)`` returns the bytes of
    ``encode(domain, Record(zip(names, values)))``; ``value(*values)`` that record and ``many(rows)`` the list
    of such records (one per tuple of values) as one :class:`Encoded` value, for a Record or another shape."""

    __slots__ = ("names", "_head", "_frames", "_text", "_binary")

    def __init__(self, *names: str) -> None:
        self.names = Record([(name, None) for name in names]).names  # the generic name and duplicate checks
        self._head = bytes([TAG_RECORD]) + u32(len(names))
        self._frames = tuple(b"\x01" + u32(len(n.encode("utf-8"))) + n.encode("utf-8") for n in self.names)
        self._text = tuple(frame + b"\x01" for frame in self._frames)  # the name frame, then a text's tag
        self._binary = tuple(frame + b"\x02" for frame in self._frames)  # ... then a bytes value's tag

    def _body(self, values: tuple[Any, ...], depth: int) -> tuple[bytes, int]:
        """The record's bytes when ``depth`` lists/records enclose it, and its own depth. Texts and bytes are
        framed inline (their length through ``struct``, which refuses a length above the u32 range); a text that
        is not strict UTF-8 or a too-long value sends the whole record through the generic encoder, which
        raises as it always did."""
        if len(values) != len(self._frames):
            raise TypeError(f"a {len(self._frames)}-field shape got {len(values)} values")
        if depth + 1 > MAX_DEPTH:
            return _generic(Record(zip(self.names, values)), depth), 0  # raises CANONICAL_TOO_DEEP
        parts = [self._head]
        extend = parts.extend
        inner = 0
        try:
            for text, binary, frame, value in zip(self._text, self._binary, self._frames, values):
                kind = type(value)
                if kind is str:
                    data = value.encode("utf-8")
                    extend((text, _U32(len(data)), data))
                elif kind is bytes:
                    extend((binary, _U32(len(value)), value))
                else:
                    extend((frame, _value(value, depth + 1)))
                    if kind in _NESTED or isinstance(value, Record):
                        inner = max(inner, _depth(value))
        except (UnicodeEncodeError, struct.error):
            return _generic(Record(zip(self.names, values)), depth), 0  # raises its CanonicalEncodingError
        return b"".join(parts), 1 + inner

    def encode(self, domain: str, *values: Any) -> bytes:
        prefix = _domain_frames.get(domain) if type(domain) is str else None
        if prefix is None:
            prefix = encode(domain, None)[:-1]  # the generic domain checks; the frame is all but the null's tag
            if len(_domain_frames) < DOMAIN_FRAMES_MAX:
                _domain_frames[domain] = prefix
        return prefix + self._body(values, 0)[0]

    def value(self, *values: Any) -> Encoded:
        return Encoded(*self._body(values, 0), _ENCODED_TOKEN)

    def many(self, rows: Iterable[tuple[Any, ...]]) -> Encoded:
        bodies, inner = [], 0
        for row in rows:
            body, depth = self._body(row, 1)
            bodies.append(body)
            if depth > inner:
                inner = depth
        return Encoded(b"".join([_LIST, u32(len(bodies)), *bodies]), 1 + inner, _ENCODED_TOKEN)


_NESTED = (list, tuple, Encoded)
#: Domain frames of accepted domains (a pure function of the exact ``str``; code declares a few), bounded.
DOMAIN_FRAMES_MAX = 256
_domain_frames: dict[str, bytes] = {}
