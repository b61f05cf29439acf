"""Identity validation before persistence (CV2-01-003, CV2-01-004, CV2-01-005).

Every external locator and metadata key is validated *before* insert and then
compared byte-for-byte. This module never repairs a value: it does not trim,
fold case, or normalize. A value is either returned unchanged or rejected with
an :class:`IdentityRejected` carrying a stable ``code`` and the ``field`` name,
so that lookup and uniqueness share exactly one read path (no query-time
``TRIM``/``LOWER``/normalization fallback is ever needed or allowed).

Checks run in this fixed order; the first failing check decides the code:

1. ``IDENTITY_NULL``          -- the value is ``None``.
2. ``IDENTITY_TYPE``          -- not exactly ``str`` / ``bytes`` / ``bytearray``
                                 / ``memoryview`` (``str`` subclasses such as
                                 enums are rejected: their text form is
                                 version-dependent).
3. ``IDENTITY_ENCODING``      -- bytes that are not strict UTF-8, or text that
                                 contains lone surrogates.
4. ``IDENTITY_EMPTY``         -- the empty string.
5. ``IDENTITY_TOO_LONG``      -- more than ``max_length`` code points.
6. ``IDENTITY_WHITESPACE``    -- leading or trailing Unicode whitespace
                                 (``str.isspace``: space, tab, newline, NBSP,
                                 ...) or an edge zero-width / BOM character
                                 (U+200B, U+200C, U+200D, U+2060, U+FEFF);
                                 this includes a value that is only whitespace.
7. ``IDENTITY_CONTROL_CHAR``  -- any character of Unicode category ``Cc``
                                 (control) or ``Cf`` (format) anywhere, and the
                                 line/paragraph separators ``Zl``/``Zp``
                                 (U+2028, U+2029), which are line breaks just
                                 like ``\\n``.
8. ``IDENTITY_NOT_NFC``       -- the value is not already in Unicode NFC.

Pure Python: no Django imports, so it can be used from models, forms,
serializers and tests alike.
"""

from __future__ import annotations

import unicodedata

__all__ = [
    "IDENTITY_CODES",
    "IDENTITY_CONTROL_CHAR",
    "IDENTITY_EMPTY",
    "IDENTITY_ENCODING",
    "IDENTITY_NOT_NFC",
    "IDENTITY_NULL",
    "IDENTITY_TOO_LONG",
    "IDENTITY_TYPE",
    "IDENTITY_WHITESPACE",
    "DEFAULT_IDENTITY_MAX_LENGTH",
    "EDGE_INVISIBLE_CHARACTERS",
    "IdentityRejected",
    "canonical_identity",
    "canonical_optional_identity",
]

IDENTITY_NULL = "IDENTITY_NULL"
IDENTITY_TYPE = "IDENTITY_TYPE"
IDENTITY_ENCODING = "IDENTITY_ENCODING"
IDENTITY_EMPTY = "IDENTITY_EMPTY"
IDENTITY_TOO_LONG = "IDENTITY_TOO_LONG"
IDENTITY_WHITESPACE = "IDENTITY_WHITESPACE"
IDENTITY_CONTROL_CHAR = "IDENTITY_CONTROL_CHAR"
IDENTITY_NOT_NFC = "IDENTITY_NOT_NFC"

#: Every stable code this module can raise, in check order.
IDENTITY_CODES: tuple[str, ...] = (
    IDENTITY_NULL,
    IDENTITY_TYPE,
    IDENTITY_ENCODING,
    IDENTITY_EMPTY,
    IDENTITY_TOO_LONG,
    IDENTITY_WHITESPACE,
    IDENTITY_CONTROL_CHAR,
    IDENTITY_NOT_NFC,
)

DEFAULT_IDENTITY_MAX_LENGTH = 255

#: Invisible characters that are not ``str.isspace()`` but are treated as
#: whitespace at the edges of a value (they are also category ``Cf``, so they
#: are rejected as control characters in the interior).
EDGE_INVISIBLE_CHARACTERS = frozenset({"\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"})

_REJECTED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})

_BYTES_TYPES = (bytes, bytearray, memoryview)


class IdentityRejected(ValueError):
    """An identity value failed validation; nothing was persisted.

    ``code`` is one of :data:`IDENTITY_CODES` and is stable (API responses and
    tests match on it); ``field`` names the rejected field. The message never
    echoes the raw value (identities can be customer data); it names the
    offending code point and index instead.
    """

    def __init__(self, code: str, field: str, detail: str) -> None:
        self.code = code
        self.field = field
        self.detail = detail
        super().__init__(f"{field}: {code}: {detail}")

    def __reduce__(self):  # keep pickling (e.g. Celery) lossless
        return (type(self), (self.code, self.field, self.detail))


def _codepoint(ch: str) -> str:
    return f"U+{ord(ch):04X}"


def _is_edge_space(ch: str) -> bool:
    return ch.isspace() or ch in EDGE_INVISIBLE_CHARACTERS


def canonical_identity(value: object, *, field: str, max_length: int = DEFAULT_IDENTITY_MAX_LENGTH) -> str:
    """Validate a required identity and return it unchanged.

    ``value`` may be ``str`` or strict-UTF-8 ``bytes``/``bytearray``/
    ``memoryview`` (returned decoded as ``str``). ``max_length`` counts code
    points (the unit of a Django ``CharField``/PostgreSQL ``varchar``).

    Raises :class:`IdentityRejected`; never trims, folds case or normalizes.
    """
    if not isinstance(field, str) or not field:
        raise TypeError("canonical_identity(): 'field' must be a non-empty str")
    if type(max_length) is not int or max_length < 1:
        raise TypeError("canonical_identity(): 'max_length' must be an int >= 1")

    if value is None:
        raise IdentityRejected(IDENTITY_NULL, field, "value is null")

    if isinstance(value, _BYTES_TYPES):
        try:
            text = bytes(value).decode("utf-8", errors="strict")
        except UnicodeDecodeError as exc:
            raise IdentityRejected(
                IDENTITY_ENCODING, field, f"bytes are not valid UTF-8 (byte offset {exc.start})"
            ) from None
    elif type(value) is str:
        text = value
        try:
            text.encode("utf-8", errors="strict")
        except UnicodeEncodeError as exc:
            raise IdentityRejected(
                IDENTITY_ENCODING,
                field,
                f"text contains a lone surrogate {_codepoint(text[exc.start])} at index {exc.start}",
            ) from None
    else:
        raise IdentityRejected(IDENTITY_TYPE, field, f"expected str or UTF-8 bytes, got {type(value).__name__}")

    if text == "":
        raise IdentityRejected(IDENTITY_EMPTY, field, "value is empty")

    if len(text) > max_length:
        raise IdentityRejected(IDENTITY_TOO_LONG, field, f"{len(text)} code points exceeds max_length {max_length}")

    # Printable ASCII with no edge space passes every remaining check, decided in C: an ASCII character is
    # non-printable exactly when it is category Cc (U+0000..U+001F, U+007F; ASCII holds no Cf, Zl or Zp), the only
    # ASCII edge characters to refuse are `isspace()` ones, and ASCII text is always NFC. Any other value takes
    # the character-by-character checks below, which decide its code in the documented order (D-262).
    if text.isascii() and text.isprintable() and not text[0].isspace() and not text[-1].isspace():
        return text

    if _is_edge_space(text[0]):
        raise IdentityRejected(IDENTITY_WHITESPACE, field, f"leading whitespace {_codepoint(text[0])}")
    if _is_edge_space(text[-1]):
        raise IdentityRejected(IDENTITY_WHITESPACE, field, f"trailing whitespace {_codepoint(text[-1])}")

    for index, ch in enumerate(text):
        if unicodedata.category(ch) in _REJECTED_CATEGORIES:
            raise IdentityRejected(
                IDENTITY_CONTROL_CHAR,
                field,
                f"control/format character {_codepoint(ch)} at index {index}",
            )

    if not unicodedata.is_normalized("NFC", text):
        raise IdentityRejected(IDENTITY_NOT_NFC, field, "value is not in Unicode NFC form (it is never normalized)")

    return text


def canonical_optional_identity(
    value: object, *, field: str, max_length: int = DEFAULT_IDENTITY_MAX_LENGTH
) -> str | None:
    """Like :func:`canonical_identity`, but ``None`` means "absent".

    ``None`` is returned as ``None``. The empty string is still
    ``IDENTITY_EMPTY``: blank is never an alias of null.
    """
    if value is None:
        if not isinstance(field, str) or not field:
            raise TypeError("canonical_optional_identity(): 'field' must be a non-empty str")
        return None
    return canonical_identity(value, field=field, max_length=max_length)
