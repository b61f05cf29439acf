"""JSON parsing of untrusted bodies with bounds (decision D-167): nesting depth and number length are limited
before any value is built, and every failure is one exception type with a precise message.

Python's parser recurses once per nesting level (100,000 levels raise RecursionError, which is not a
ValueError) and refuses integers longer than 4,300 digits with a plain ValueError that has no `.msg`. Here:

* a linear pre-scan (string literals removed by one regular expression, then the running depth of the
  remaining brackets) refuses a document nested deeper than `MAX_DEPTH` before the recursive parser sees it;
* the parser's own `parse_int` / `parse_float` / `parse_constant` hooks refuse a number literal longer than
  `MAX_NUMBER_LENGTH` characters and the non-standard constants `NaN`, `Infinity`, `-Infinity`;
* every other failure (syntax, encoding, lone surrogate, a residual RecursionError) becomes `JsonRefused`.

Pure Python, no Django: used by the inbound interpreter and by the API's JSON parser alike."""
from __future__ import annotations

import json
import operator
import re
from itertools import accumulate, repeat
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_NUMBER_LENGTH", "JsonRefused", "loads"]

#: Deepest nesting of arrays and objects accepted (a delivery is `{"events": [{..., "data": {...}}]}`: three
#: levels before the payload's own structure).
MAX_DEPTH = 64
#: Longest number literal accepted, in characters (sign and digits). Positions are at most 38 digits
#: (`Event.position` is numeric(38, 0)); fractions and exponents are floats, which canonical JSON refuses.
MAX_NUMBER_LENGTH = 64

# A JSON string literal: a quote, then runs of ordinary bytes or backslash escapes, then a quote (the unrolled
# form is linear: no two alternatives can match the same byte). UTF-8 continuation bytes never equal `"` or `\`.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")  # opener +1, closer -1 (after subtracting 1)


class JsonRefused(ValueError):
    """The text is not JSON within the bounds; `detail` says where and why."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


def _depth_exceeds(text: str, limit: int) -> bool:
    """Whether the structure outside string literals is more than `limit` levels deep at some point. Only
    brackets outside strings count, exactly as a JSON parser tokenizes them; unmatched openers of malformed text
    count too, since a recursive parser descends into them before it fails. Linear, in C loops (a regular
    expression, `bytes.translate`, `itertools.accumulate`): 0.2-0.3 s for a 2.5 MB body of brackets."""
    if text.count("[") + text.count("{") <= limit:
        return False  # fewer openers than the limit: nothing can be deeper
    brackets = _STRING.sub(b"", text.encode("utf-8", "surrogatepass")).translate(None, _NOT_BRACKET)
    return max(accumulate(map(operator.sub, brackets.translate(_STEP), repeat(1))), default=0) > limit


def _bounded_number(kind):
    def parse(literal: str):
        if len(literal) > MAX_NUMBER_LENGTH:
            raise JsonRefused(f"a number literal has {len(literal)} characters; at most {MAX_NUMBER_LENGTH} "
                              "are accepted")
        return kind(literal)
    return parse


def _constant(name: str):
    raise JsonRefused(f"{name} is not JSON")


_PARSE_INT = _bounded_number(int)
_PARSE_FLOAT = _bounded_number(float)


def loads(text: str) -> Any:
    """Parse `text` (already decoded) within the bounds; raises JsonRefused with a precise detail."""
    if _depth_exceeds(text, MAX_DEPTH):
        raise JsonRefused(f"nesting deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text, parse_int=_PARSE_INT, parse_float=_PARSE_FLOAT, parse_constant=_constant)
    except JsonRefused:
        raise
    except json.JSONDecodeError as exc:
        raise JsonRefused(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except (ValueError, RecursionError) as exc:  # e.g. a lone surrogate escape; never expected past the pre-scan
        raise JsonRefused(f"{type(exc).__name__}: {exc}") from exc
