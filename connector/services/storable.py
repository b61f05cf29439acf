"""Admission refuses what can never be stored (decisions D-165, D-166).

Every value a pack extracts from a body is later written to columns (Event, OrderingLane, ProjectionWindow,
WindowMember, ExecutionDependency, CrmRecord) or sent (an outbound path and body). A value a column cannot hold
would be accepted with a 201 and then fail every materialization; so `receipt_admit` checks each normalized event
here, inside its whole-body parse, and refuses the delivery as a whole with BODY_UNPARSEABLE and a precise detail
before anything is written.

One mechanism: `TARGETS` maps each normalized field to the model fields that store it, and the limit of each
check is read from those fields (`max_length`, `max_digits`, the JSON column's type), so a migration that
changes a column changes admission with it. Grammar beyond the column: `occurred_at` is an RFC 3339 date-time
(D-166). Values sent outbound are checked by the outbound owner through `connector.hooks.admission_problems`."""
from __future__ import annotations

import calendar
import re
from decimal import Decimal
from functools import lru_cache

from django.apps import apps
from django.db import models

from connector import hooks
from connector.interpreters.inbound import BodyUnparseable, NormalizedEvent, RouteProgram

__all__ = ["TARGETS", "events_check", "limits", "occurred_at_problem"]

#: normalized field -> "app_label.Model.field" of every column the value is stored in.
TARGETS: dict[str, tuple[str, ...]] = {
    "event_kind": ("connector.Event.event_kind",),
    "source_event_key": ("connector.Event.source_event_key",),
    "source_locator": ("connector.Event.source_locator",),
    "occurred_at": ("connector.Event.occurred_at",),
    "partition": ("connector.Event.partition", "connector.OrderingLane.partition"),
    "position": ("connector.Event.position", "connector.Projection.position", "connector.OrderingLane.high_water",
                 "connector.SupersededDecision.position", "connector.GapDecision.expected_position"),
    "tie_breaker": ("connector.Event.tie_breaker", "connector.Projection.tie_breaker",
                    "connector.OrderingLane.high_water_tie"),
    "grouping_key": ("connector.Event.grouping_key", "connector.ProjectionWindow.grouping_key"),
    "record_key": ("connector.WindowMember.record_key", "connector.CrmRecord.record_key"),
    "depends_on": ("connector.ExecutionDependency.requirement_key",),
    # The payload is stored as bytes, and Runtime stores its (mapped) values in a JSON column.
    "payload": ("connector.Event.payload", "connector.CrmRecord.fields"),
}


def _field(path: str) -> models.Field:
    app_label, model, name = path.split(".")
    return apps.get_model(app_label, model)._meta.get_field(name)


@lru_cache(maxsize=None)
def limits(name: str) -> dict[str, object]:
    """The tightest limits of one normalized field over every column it is stored in: `chars` (text length in
    code points), `bytes` (binary length), `digits` (integer digits), `json` (stored in a JSON column)."""
    out: dict[str, object] = {}
    for path in TARGETS[name]:
        field = _field(path)
        if isinstance(field, models.DecimalField):
            assert field.decimal_places == 0, f"{path} must hold integers"
            out["digits"] = min(out.get("digits", field.max_digits), field.max_digits)
        elif isinstance(field, models.JSONField):
            out["json"] = path
        elif isinstance(field, models.BinaryField):
            if field.max_length is not None:
                out["bytes"] = min(out.get("bytes", field.max_length), field.max_length)
        elif isinstance(field, models.CharField):
            out["chars"] = min(out.get("chars", field.max_length), field.max_length)
        else:  # pragma: no cover - a new column type needs its own check here
            raise TypeError(f"{path}: no storability check for {type(field).__name__}")
    return out


# RFC 3339 section 5.6 `date-time` (ABNF strings are case-insensitive: "t" and "z" are allowed).
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:[Zz]|[+-](\d{2}):(\d{2}))",
                      re.ASCII)


def occurred_at_problem(value: str) -> str | None:
    """Why `value` is not an RFC 3339 date-time (`2026-01-01T00:00:00Z`, `...T12:30:00.123+02:00`), or None."""
    match = _RFC3339.fullmatch(value)
    if match is None:
        return "is not an RFC 3339 date-time (YYYY-MM-DDThh:mm:ss[.fraction](Z|+hh:mm|-hh:mm))"
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    if not 1 <= month <= 12 or not 1 <= day <= calendar.monthrange(year, month)[1]:
        return "names no calendar date"
    if hour > 23 or minute > 59 or second > 60:  # 60: a leap second
        return "names no time of day"
    if match.group(8) is not None and (int(match.group(8)) > 23 or int(match.group(9)) > 59):
        return "has an offset outside -23:59..+23:59"
    return None


# A NUL escape in canonical JSON: an odd run of backslashes before `u0000` (an even run is escaped backslashes).
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def _problem(name: str, value: object) -> str | None:
    limit = limits(name)
    if value in (None, "", b""):
        return None  # the route does not extract this field
    if "chars" in limit and len(value) > limit["chars"]:
        return f"has {len(value)} characters; at most {limit['chars']} fit in {', '.join(TARGETS[name])}"
    if "bytes" in limit and len(value) > limit["bytes"]:
        return f"has {len(value)} bytes; at most {limit['bytes']} are stored"
    if "digits" in limit and abs(value) >= Decimal(10) ** limit["digits"]:
        return f"has more than {limit['digits']} digits"
    if "json" in limit and _JSON_NUL.search(value):
        return f"holds a U+0000 character, which {limit['json']} (PostgreSQL jsonb) cannot store"
    if name == "occurred_at":
        return occurred_at_problem(value)
    return None


def events_check(*, events: list[NormalizedEvent], route: RouteProgram, epoch_pk: int, epoch_digest: bytes) -> None:
    """Refuse the whole delivery (BodyUnparseable, nothing written) unless every value of every normalized event
    fits every column that stores it, and the outbound owner accepts the values it will send."""
    for ordinal, event in enumerate(events):
        for name in TARGETS:
            problem = _problem(name, getattr(event, name))
            if problem:
                raise BodyUnparseable(f"component {ordinal}: {name} {problem}", field=name, ordinal=ordinal)
        for problem in hooks.admission_problems(epoch_pk=epoch_pk, epoch_digest=bytes(epoch_digest),
                                                route_definition=route.definition, record_key=event.record_key):
            raise BodyUnparseable(f"component {ordinal}: {problem}", ordinal=ordinal)
