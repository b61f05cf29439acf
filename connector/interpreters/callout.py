"""The callout-profile interpreter: the one place an outbound request path is built from a frozen path template,
and the one place a frozen path is checked against it (D-170, D-171).

Template grammar (checked when the binding is installed and every time its owner reader reads it):

    /v1/records/{record_key}              one placeholder fills one whole path segment
    /v1/items/{item}/notes?owner={owner}   a query value may be one whole placeholder too

- an absolute path: it starts with "/", names no scheme, host, port, userinfo or fragment;
- every path segment is either a literal (RFC 3986 unreserved characters and `!$&'()*+,;=:@`, not empty, not
  "." or "..") or exactly one `{name}` placeholder filling the whole segment; a trailing "/" is allowed;
- an optional query of `name=value` pairs joined by "&": names are literal, each value is a literal or exactly
  one placeholder;
- a placeholder name is `[A-Za-z_][A-Za-z0-9_]*` and appears once.

A value fills exactly one opaque segment or query value. It is refused (PathValueUnsafe, reported by the
effects app as OUTBOUND_PATH_UNSAFE) when it is not text, is empty, contains a control or format character, or
when the text itself, any of its percent-decodings (repeated until nothing changes) or their NFKC normalisation
is "." or "..", or contains "/", "\\", "?" or "#". Many servers decode `%2F` (or fold a fullwidth solidus) into a
path separator before routing, so such values are refused outright rather than encoded. Everything else is
percent-encoded as UTF-8, every byte outside the unreserved set (so "%" becomes "%25", a space "%20").
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import quote, unquote

from connector.errors import CalloutTemplateInvalid

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_PLACEHOLDER = re.compile(r"\{(" + _NAME + r")\}")
_LITERAL_SEGMENT = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@]+")
_LITERAL_QUERY = re.compile(r"[A-Za-z0-9\-._~!$'()*+,;:@/]+")
_ENCODED = re.compile(r"(?:[A-Za-z0-9\-._~]|%[0-9A-F]{2})+")  # exactly what `_encode` produces
_STRUCTURAL = frozenset("/\\?#")
_DOT_SEGMENTS = (".", "..")
_MAX_DECODE_ROUNDS = 8


class PathValueUnsafe(ValueError):
    """A path or query value would change the request's structure (kernel error; callers translate it)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason
        super().__init__(f"value of {{{name}}} {reason}")


@dataclass(frozen=True)
class Part:
    """One path segment or query value: a literal, or the placeholder `name`."""

    literal: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class PathTemplate:
    template: str
    segments: tuple[Part, ...]
    trailing_slash: bool
    query: tuple[tuple[str, Part], ...]

    @property
    def names(self) -> tuple[str, ...]:
        parts = [*self.segments, *(p for _, p in self.query)]
        return tuple(p.name for p in parts if p.name is not None)


def _part(text: str, literal: re.Pattern, where: str, template: str) -> Part:
    match = _PLACEHOLDER.fullmatch(text)
    if match:
        return Part(name=match.group(1))
    if "{" in text or "}" in text:
        raise CalloutTemplateInvalid(f"path_template {template!r}: a placeholder must fill a whole {where}, "
                                     f"not part of {text!r}")
    if not literal.fullmatch(text) or text in _DOT_SEGMENTS:
        raise CalloutTemplateInvalid(f"path_template {template!r}: {where} {text!r} is not a plain literal")
    return Part(literal=text)


def parse_template(template: object) -> PathTemplate:
    """Parse and validate a callout's path template; raises CalloutTemplateInvalid."""
    if not isinstance(template, str) or not template.startswith("/") or template.startswith("//"):
        raise CalloutTemplateInvalid(f"path_template {template!r} must be an absolute path starting with one '/' "
                                     "(no scheme, host or port: the egress base URL supplies them)")
    if "#" in template or any(unicodedata.category(c)[0] in "CZ" for c in template):
        raise CalloutTemplateInvalid(f"path_template {template!r} has a fragment, a space or a control character")
    path, has_query, query = template.partition("?")
    raw_segments = path[1:].split("/")
    trailing = len(raw_segments) > 1 and raw_segments[-1] == ""
    if trailing:
        raw_segments = raw_segments[:-1]
    if raw_segments == [""]:
        raw_segments = []  # the template "/" itself
    segments = tuple(_part(s, _LITERAL_SEGMENT, "path segment", template) for s in raw_segments)
    pairs: list[tuple[str, Part]] = []
    if has_query:
        for pair in query.split("&"):
            name, eq, value = pair.partition("=")
            if not eq or not _LITERAL_QUERY.fullmatch(name) or "/" in name:
                raise CalloutTemplateInvalid(f"path_template {template!r}: query item {pair!r} is not name=value")
            pairs.append((name, _part(value, _LITERAL_QUERY, "query value", template)))
    parsed = PathTemplate(template, segments, trailing, tuple(pairs))
    if len(set(parsed.names)) != len(parsed.names):
        raise CalloutTemplateInvalid(f"path_template {template!r} uses a placeholder twice")
    return parsed


def _check_value(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise PathValueUnsafe(name, f"is {type(value).__name__}, not text")
    if value == "":
        raise PathValueUnsafe(name, "is empty (an empty segment changes the path)")
    seen, current = [value], value
    for _ in range(_MAX_DECODE_ROUNDS):
        decoded = unquote(current, errors="surrogateescape")
        if decoded == current:
            break
        seen.append(decoded)
        current = decoded
    else:
        raise PathValueUnsafe(name, "is percent-encoded too many times")
    for text in seen:
        for form in (text, unicodedata.normalize("NFKC", text)):
            if form in _DOT_SEGMENTS:
                raise PathValueUnsafe(name, f"is or decodes to the dot segment {form!r}")
            bad = sorted(_STRUCTURAL.intersection(form))
            if bad:
                raise PathValueUnsafe(name, f"contains or decodes to {', '.join(map(repr, bad))}")
            if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") for c in form):
                raise PathValueUnsafe(name, "contains or decodes to a control or format character")
    return value


def _encode(name: str, value: object) -> str:
    return quote(_check_value(name, value), safe="", encoding="utf-8", errors="strict")


def build_path(template: str | PathTemplate, params: dict[str, object], *, max_length: int | None = None) -> str:
    """The outbound request path (and query) of `template` filled with `params`: every value checked and
    percent-encoded into its one segment or query value. Missing values raise PathValueUnsafe; values the template
    does not name are ignored. Raises CalloutTemplateInvalid for a template outside the grammar."""
    parsed = template if isinstance(template, PathTemplate) else parse_template(template)

    def fill(part: Part) -> str:
        if part.literal is not None:
            return part.literal
        if part.name not in params:
            raise PathValueUnsafe(part.name, "is missing")
        return _encode(part.name, params[part.name])

    path = "/" + "/".join(fill(p) for p in parsed.segments) + ("/" if parsed.trailing_slash else "")
    if parsed.query:
        path += "?" + "&".join(f"{name}={fill(p)}" for name, p in parsed.query)
    if max_length is not None and len(path) > max_length:
        raise PathValueUnsafe(",".join(parsed.names) or "path", f"makes the path {len(path)} characters long "
                                                                 f"(at most {max_length})")
    return path


def path_fits_template(template: str | PathTemplate, path: str) -> str | None:
    """None when `path` has exactly the template's shape (same literals, one encoded value per placeholder, each
    value allowed by the value rule); otherwise the reason it does not. The egress adapter's last check: a row
    written by older code (raw interpolation) never leaves with a path outside its template."""
    parsed = template if isinstance(template, PathTemplate) else parse_template(template)
    if not isinstance(path, str) or not path.startswith("/") or "#" in path:
        return f"path {path!r} is not an absolute path without a fragment"
    raw_path, has_query, query = path.partition("?")
    segments = raw_path[1:].split("/")
    if parsed.trailing_slash:
        if segments[-1] != "":
            return "the template ends with '/' and the path does not"
        segments = segments[:-1]
    if segments == [""] and not parsed.segments:
        segments = []
    if len(segments) != len(parsed.segments):
        return f"path has {len(segments)} segments, the template {len(parsed.segments)}"
    pairs = [tuple(item.partition("=")[::2]) for item in query.split("&")] if has_query else []
    if bool(has_query) != bool(parsed.query) or len(pairs) != len(parsed.query):
        return "path query does not have the template's items"

    def fits(part: Part, got: str) -> str | None:
        if part.literal is not None:
            return None if got == part.literal else f"{got!r} is not the literal {part.literal!r}"
        if not _ENCODED.fullmatch(got):
            return f"{{{part.name}}} is {got!r}, not one percent-encoded value"
        try:
            _check_value(part.name, unquote(got, errors="strict"))
        except (PathValueUnsafe, UnicodeDecodeError) as exc:
            return str(exc)
        return None

    for part, got in zip(parsed.segments, segments):
        reason = fits(part, got)
        if reason:
            return reason
    for (name, part), (got_name, got) in zip(parsed.query, pairs):
        if got_name != name:
            return f"query item {got_name!r} is not {name!r}"
        reason = fits(part, got)
        if reason:
            return reason
    return None
