"""The inbound-route interpreter: component extraction, event normalization, SourceEventKey, ordering facts,
projection and grouping keys, all from the route's declarative definition.

Route definition shape (JSON, frozen in a pack generation):

    {"ordering_contract": "order_independent" | "latest_source_position" | "strict_source_sequence",
     "extract": {"format": "json", "components": "/pointer/to/array"}
              | {"format": "lines", "separator": "\\t", "fields": ["name", ...]},
     "normalize": {"event_kind": ptr | {"const": text}, "source_event_key": ptr, "source_locator": ptr,
                   "occurred_at": ptr, "payload": ptr (default: the whole component)},
     "ordering": {"partition": ptr, "position": ptr, "position_kind": "integer", "tie_breaker": ptr,
                  "first_position": int, "gap_deadline_seconds": int,
                  "gap_disposition": "quarantine_partition" | "skip_with_evidence"},
     "window": {"grouping_key": ptr, "max_members": int, "max_age_seconds": int} | absent (immediate),
     "projection": {"record_key": ptr},
     "depends_on": {"source_event_key": ptr, "deadline_seconds": int} | absent (order_independent routes),
     "mapping": "<field_mapping business key>",
     "terminal_disposition": {"applied": "advance", "noop": "advance", "rejected": "advance",
                              "failed": "quarantine"}}

A pointer is an RFC 6901 JSON pointer into the component. Everything a pointer yields is validated as canonical
identity text where it becomes identity (keys, partitions, locators)."""
from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from connector.canonical import bounded_json
from connector.canonical.identity import IdentityRejected, canonical_identity
from connector.errors import ConnectorError
from connector.receipts import canonical_json

CONTRACTS = ("order_independent", "latest_source_position", "strict_source_sequence")
GAP_DISPOSITIONS = ("quarantine_partition", "skip_with_evidence")
DEFAULT_TERMINAL = {"applied": "advance", "noop": "advance", "rejected": "advance", "failed": "quarantine"}


class BodyUnparseable(ConnectorError):
    """The route's pack cannot parse this body; the receipt is refused as a whole and nothing is written."""

    code = "BODY_UNPARSEABLE"
    http_status = 400
    operator_action = "Fix the payload; nothing was written."


class RouteDefinitionInvalid(ConnectorError):
    """The frozen route definition does not have the closed generic shape."""

    code = "ROUTE_DEFINITION_INVALID"
    http_status = 500
    operator_action = "Install a corrected pack generation and mint a successor epoch."


def resolve_pointer(document: Any, pointer: str) -> Any:
    if pointer == "":
        return document
    if not pointer.startswith("/"):
        raise RouteDefinitionInvalid(f"pointer {pointer!r} must start with '/'")
    current = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict) and token in current:
            current = current[token]
        elif isinstance(current, list) and token.isdigit() and int(token) < len(current):
            current = current[int(token)]
        else:
            raise BodyUnparseable(f"component has no value at {pointer}")
    return current


@dataclass(frozen=True)
class NormalizedEvent:
    component: bytes
    event_kind: str
    source_event_key: str
    source_locator: str
    occurred_at: str
    payload: bytes
    partition: str
    position: Decimal | None
    position_bytes: bytes | None
    tie_breaker: bytes | None
    grouping_key: str
    record_key: str
    depends_on: str = ""


@dataclass(frozen=True)
class RouteProgram:
    """A compiled, immutable inbound route (cached by exact definition identity)."""

    business_key: str
    version: int
    definition: dict
    definition_digest: bytes
    pack_generation_id: str = ""

    @property
    def contract(self) -> str:
        return self.definition["ordering_contract"]

    @property
    def windowed(self) -> bool:
        return bool(self.definition.get("window"))

    @property
    def ordered(self) -> bool:
        return self.contract != "order_independent"

    @property
    def mapping_key(self) -> str | None:
        return self.definition.get("mapping")

    def terminal_disposition(self, outcome: str) -> str:
        return {**DEFAULT_TERMINAL, **self.definition.get("terminal_disposition", {})}[outcome]

    @property
    def ordering(self) -> dict:
        return self.definition.get("ordering", {})

    # -- extraction ---------------------------------------------------------------------------------------

    def extract_components(self, body: bytes) -> list[Any]:
        spec = self.definition["extract"]
        try:
            text = bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BodyUnparseable("body is not UTF-8") from exc
        if spec["format"] == "json":
            try:
                document = bounded_json.loads(text)
            except bounded_json.JsonRefused as exc:
                raise BodyUnparseable(f"body is not JSON: {exc.detail}") from exc
            items = resolve_pointer(document, spec.get("components", ""))
            if not isinstance(items, list):
                raise BodyUnparseable(f"{spec.get('components')} is not a list")
        elif spec["format"] == "lines":
            fields, separator = spec["fields"], spec.get("separator", "\t")
            items = []
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                values = line.split(separator)
                if len(values) != len(fields):
                    raise BodyUnparseable(f"line {number} has {len(values)} fields, the route expects {len(fields)}")
                items.append(dict(zip(fields, values)))
        else:
            raise RouteDefinitionInvalid(f"extract format {spec['format']!r} is not closed")
        if not items:
            raise BodyUnparseable("the body holds no component")
        return items

    # -- normalization ------------------------------------------------------------------------------------

    def _text(self, component: Any, spec: Any, field: str, *, identity: bool = True) -> str:
        value = spec["const"] if isinstance(spec, dict) and "const" in spec else resolve_pointer(component, spec)
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise BodyUnparseable(f"{field} must be text or an integer")
        value = str(value)
        if identity:
            try:
                canonical_identity(value, field=field)
            except IdentityRejected as exc:
                raise BodyUnparseable(f"{field} is not canonical: {exc.code}") from exc
        return value

    def normalize(self, component: Any) -> NormalizedEvent:
        n = self.definition["normalize"]
        try:
            component_bytes = canonical_json(component)
            payload = canonical_json(resolve_pointer(component, n["payload"]) if "payload" in n else component)
        except ValueError as exc:
            raise BodyUnparseable(f"component is not canonical JSON: {exc}") from exc
        ordering = self.ordering
        partition, position, position_bytes, tie = "", None, None, None
        if self.ordered:
            partition = self._text(component, ordering["partition"], "partition")
            raw = resolve_pointer(component, ordering["position"])
            try:
                if isinstance(raw, bool):
                    raise ValueError
                position = Decimal(int(raw, 10) if isinstance(raw, str) else int(raw))
                if isinstance(raw, float) or (isinstance(raw, str) and str(int(raw, 10)) != raw):
                    raise ValueError
            except (TypeError, ValueError) as exc:
                raise BodyUnparseable("source position must be a canonical integer") from exc
            if position < 0 or position >= Decimal(10) ** 38:
                raise BodyUnparseable("source position out of range")
            position_bytes = str(position).encode()
            tie = self._text(component, ordering.get("tie_breaker", n["source_event_key"]), "tie_breaker").encode()
        grouping = ""
        if self.windowed:
            grouping = self._text(component, self.definition["window"]["grouping_key"], "grouping_key")
        record_key = ""
        if "projection" in self.definition:
            record_key = self._text(component, self.definition["projection"]["record_key"], "record_key")
        depends_on = ""
        spec = self.definition.get("depends_on")
        if spec:
            pointer = spec["source_event_key"]
            try:
                if not isinstance(pointer, dict):
                    resolve_pointer(component, pointer)
            except BodyUnparseable:
                pass  # the component declares no prerequisite
            else:  # a declared prerequisite must be a canonical key: an invalid one is refused, never ignored
                depends_on = self._text(component, pointer, "depends_on")
        return NormalizedEvent(
            depends_on=depends_on,
            component=component_bytes,
            event_kind=self._text(component, n["event_kind"], "event_kind"),
            source_event_key=self._text(component, n["source_event_key"], "source_event_key"),
            source_locator=self._text(component, n.get("source_locator", n["source_event_key"]), "source_locator"),
            occurred_at=self._text(component, n["occurred_at"], "occurred_at") if "occurred_at" in n else "",
            payload=payload, partition=partition, position=position, position_bytes=position_bytes,
            tie_breaker=tie, grouping_key=grouping, record_key=record_key)

    def parse(self, body: bytes) -> list[NormalizedEvent]:
        """Whole-body parse: every component must normalize, or the receipt is refused as a whole (the detail
        names the first component that did not).

        A parse is a pure function of the route and the body bytes, so the last successful parses are kept in
        this process (`_PARSED`, D-262) and handed back when the same route parses the very same bytes again:
        materialization in the process that admitted the receipt reuses admission's parse instead of redoing it.
        An entry is served only when the route is equal to the one that parsed it (every field, the definition
        included) and the body is byte-for-byte the stored one; the digest only finds the entry."""
        body = bytes(body)
        key = (self.business_key, self.version, self.definition_digest, hashlib.sha256(body).digest())
        held = _parsed_get(key)
        if held is not None and held[0] == self and held[1] == body:
            return list(held[2])
        events = []
        for ordinal, component in enumerate(self.extract_components(body)):
            try:
                events.append(self.normalize(component))
            except BodyUnparseable as exc:
                raise BodyUnparseable(f"component {ordinal}: {exc.detail}") from exc
        _parsed_put(key, (self, body, tuple(events)))
        return events


#: The last successful parses (D-262): (business key, version, definition digest, body sha256) -> (route, body,
#: events). Bounded by entries and by bytes (each entry is counted as three times its body: the body, and the
#: components and payloads its events hold); a body larger than the byte bound is never kept. NormalizedEvent is
#: frozen and its fields immutable, and each hit returns a new list, so no caller can change an entry.
_PARSED: OrderedDict[tuple, tuple[RouteProgram, bytes, tuple[NormalizedEvent, ...]]] = OrderedDict()
PARSED_MAX_ENTRIES = 64
PARSED_MAX_BYTES = 16 * 1024 * 1024
_parsed_lock = threading.Lock()
_parsed_size = [0]


def _parsed_get(key: tuple):
    with _parsed_lock:
        held = _PARSED.get(key)
        if held is not None:
            _PARSED.move_to_end(key)
        return held


def _parsed_put(key: tuple, entry: tuple) -> None:
    size = 3 * len(entry[1])
    if size > PARSED_MAX_BYTES:
        return
    with _parsed_lock:
        old = _PARSED.pop(key, None)
        if old is not None:
            _parsed_size[0] -= 3 * len(old[1])
        _PARSED[key] = entry
        _parsed_size[0] += size
        while len(_PARSED) > PARSED_MAX_ENTRIES or _parsed_size[0] > PARSED_MAX_BYTES:
            _, dropped = _PARSED.popitem(last=False)
            _parsed_size[0] -= 3 * len(dropped[1])


def parsed_clear() -> None:
    """Forget every kept parse (tests)."""
    with _parsed_lock:
        _PARSED.clear()
        _parsed_size[0] = 0


def compile_route(*, business_key: str, version: int, definition_bytes: bytes, definition_digest: bytes,
                  pack_generation_id: str = "") -> RouteProgram:
    definition = json.loads(definition_bytes)
    if definition.get("ordering_contract") not in CONTRACTS:
        raise RouteDefinitionInvalid("ordering_contract is not closed")
    if "extract" not in definition or "normalize" not in definition:
        raise RouteDefinitionInvalid("extract and normalize are required")
    ordering = definition.get("ordering", {})
    if definition["ordering_contract"] != "order_independent":
        for key in ("partition", "position"):
            if key not in ordering:
                raise RouteDefinitionInvalid(f"an ordered route needs ordering.{key}")
        if ordering.get("position_kind", "integer") != "integer":
            raise RouteDefinitionInvalid("position_kind must be integer")
    if definition["ordering_contract"] == "strict_source_sequence":
        if ordering.get("gap_disposition", "quarantine_partition") not in GAP_DISPOSITIONS:
            raise RouteDefinitionInvalid("gap_disposition is not closed")
    if definition.get("depends_on") and (definition["ordering_contract"] != "order_independent"
                                         or definition.get("window")):
        raise RouteDefinitionInvalid("dependencies are supported on immediate order_independent routes")
    if definition.get("window") and definition["ordering_contract"] != "order_independent":
        raise RouteDefinitionInvalid("grouped windows are supported on order_independent routes")
    return RouteProgram(business_key, version, definition, bytes(definition_digest), pack_generation_id)
