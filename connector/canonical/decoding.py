"""Strict decoding of ``canonical_typed_length_delimited_v1`` preimages (the byte layout is documented in
:mod:`connector.canonical.encoding`). Pure Python, no Django. ``encode(*decode(p)) == p`` for every accepted ``p``:
the decoder never repairs or reinterprets bytes, and refuses anything :func:`encode` would refuse.
"""

from __future__ import annotations

from typing import Any

from .encoding import (
    _BYTES_TYPES,
    _I64,
    _U32,
    MAX_DEPTH,
    TAG_BOOL,
    TAG_BYTES,
    TAG_DOMAIN,
    TAG_INT,
    TAG_LIST,
    TAG_NULL,
    TAG_RECORD,
    TAG_TEXT,
    CanonicalEncodingError,
    Record,
    _check_domain,
)

__all__ = ["decode"]


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise CanonicalEncodingError(
                "CANONICAL_DECODE_TRUNCATED", f"need {n} bytes at offset {self.pos}, preimage ends at {len(self.data)}"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def byte(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def text(self, what: str) -> str:
        start = self.pos
        raw = self.take(self.u32())
        try:
            return raw.decode("utf-8", errors="strict")
        except UnicodeDecodeError:
            raise CanonicalEncodingError(
                "CANONICAL_DECODE_INVALID_UTF8", f"{what} at offset {start} is not strict UTF-8"
            ) from None


def _read_value(reader: _Reader, depth: int) -> Any:
    offset = reader.pos
    tag = reader.byte()
    if tag in (TAG_LIST, TAG_RECORD) and depth + 1 > MAX_DEPTH:
        raise CanonicalEncodingError("CANONICAL_TOO_DEEP", f"more than {MAX_DEPTH} nested lists/records")
    if tag == TAG_NULL:
        return None
    if tag == TAG_TEXT:
        return reader.text("text")
    if tag == TAG_BYTES:
        return reader.take(reader.u32())
    if tag == TAG_INT:
        return _I64.unpack(reader.take(8))[0]
    if tag == TAG_BOOL:
        flag = reader.byte()
        if flag not in (0x00, 0x01):
            raise CanonicalEncodingError("CANONICAL_DECODE_INVALID_BOOL", f"boolean byte 0x{flag:02x} at offset {offset + 1}")
        return flag == 0x01
    if tag == TAG_LIST:
        count = reader.u32()
        return tuple(_read_value(reader, depth + 1) for _ in range(count))
    if tag == TAG_RECORD:
        count = reader.u32()
        pairs = []
        for _ in range(count):
            name_offset = reader.pos
            name_tag = reader.byte()
            if name_tag != TAG_TEXT:
                raise CanonicalEncodingError(
                    "CANONICAL_DECODE_FIELD_NAME_TAG",
                    f"record field name at offset {name_offset} has tag 0x{name_tag:02x}, expected 0x01",
                )
            name = reader.text("record field name")
            pairs.append((name, _read_value(reader, depth + 1)))
        return Record(pairs)  # re-validates names (empty, duplicate, non-canonical)
    raise CanonicalEncodingError("CANONICAL_DECODE_UNKNOWN_TAG", f"unknown tag 0x{tag:02x} at offset {offset}")


def decode(preimage: bytes | bytearray | memoryview) -> tuple[str, Any]:
    """Strictly decode a preimage into ``(domain, value)``.

    Lists decode as tuples and binaries as ``bytes``. Rejects a missing domain
    separator, unknown tags, non-0/1 booleans, invalid UTF-8, truncation,
    trailing bytes, and anything :func:`encode` would refuse (so
    ``encode(*decode(p)) == p`` for every accepted ``p``).
    """
    if not isinstance(preimage, _BYTES_TYPES):
        raise CanonicalEncodingError("CANONICAL_UNSUPPORTED_TYPE", "decode() expects bytes")
    reader = _Reader(bytes(preimage))
    if not reader.data or reader.data[0] != TAG_DOMAIN:
        raise CanonicalEncodingError("CANONICAL_DECODE_MISSING_DOMAIN", "preimage does not start with the 0xD5 domain tag")
    reader.pos = 1
    domain = _check_domain(reader.text("domain"))
    value = _read_value(reader, 0)
    if reader.pos != len(reader.data):
        raise CanonicalEncodingError(
            "CANONICAL_DECODE_TRAILING_BYTES", f"{len(reader.data) - reader.pos} trailing bytes at offset {reader.pos}"
        )
    return domain, value
