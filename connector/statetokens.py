"""State tokens: the exact state an operator decision was made on (an effect's `changed_at`, an operation's
revision, a subject digest, a fence). A page or a confirmation form carries the token it showed; the interface
parses it here and the owning service compares it with the row under its lock. A missing or malformed token is
refused with STATE_TOKEN_INVALID, never read as "no check" (issue 17; docs/security.md).

Every parser takes the raw posted value (a string, or None when the field was left out) and returns the typed
token or raises StateTokenInvalid. Interfaces that cannot import governance (the admin) use these directly;
governance wraps them in form fields (governance/forms.py)."""
from __future__ import annotations

import re
from datetime import datetime

from connector.errors import StateTokenInvalid

_HEX = re.compile(r"[0-9a-f]+")
_INTEGER = re.compile(r"-?[0-9]{1,18}")


def _present(raw: object, what: str) -> str:
    if not isinstance(raw, str) or raw == "":
        raise StateTokenInvalid(f"the decision carries no {what}; reload the page and decide again")
    return raw


def timestamp(raw: object, *, what: str = "change time") -> datetime:
    """An ISO 8601 timestamp with its UTC offset, exactly as the page rendered it (`isoformat()`)."""
    value = _present(raw, what)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise StateTokenInvalid(f"the {what} {value[:40]!r} is not an ISO 8601 timestamp") from None
    if parsed.tzinfo is None:
        raise StateTokenInvalid(f"the {what} {value[:40]!r} has no UTC offset")
    return parsed


def integer(raw: object, *, what: str = "revision") -> int:
    """A revision or fence: a decimal integer."""
    value = _present(raw, what)
    if not _INTEGER.fullmatch(value):
        raise StateTokenInvalid(f"the {what} {value[:40]!r} is not an integer")
    return int(value)


def digest(raw: object, *, nbytes: int = 32, what: str = "subject digest") -> bytes:
    """A digest as lowercase hex of exactly `nbytes` bytes."""
    value = _present(raw, what)
    if len(value) != 2 * nbytes or not _HEX.fullmatch(value):
        raise StateTokenInvalid(f"the {what} is not {2 * nbytes} lowercase hex characters")
    return bytes.fromhex(value)


def text(raw: object, *, what: str = "state", max_length: int = 128) -> str:
    """A state name or an opaque token the page rendered (compared exactly, never trimmed)."""
    value = _present(raw, what)
    if len(value) > max_length or value != value.strip():
        raise StateTokenInvalid(f"the {what} is not a token this page renders")
    return value
