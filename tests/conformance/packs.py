"""Two structurally different L1 conformance packs, as plain data (CV2-02-005).

Pack A, "batched JSON webhook": one JSON document per delivery, components at `/events`, the business fields
nested under `/attributes`; one `latest_source_position` route.

Pack B, "line-oriented feed": tab-separated lines of flat text fields; a `strict_source_sequence` route and an
`order_independent` route with a grouped window.

Nothing here is known to L0: the packs are installed through the owner services and reach the product only as
frozen binding definitions of an epoch. `tests/connector/test_l0_neutrality.py` scans L0 for every literal that
`pack_literals` derives from these definitions, plus the event vocabulary in `EVENT_VOCABULARY`."""
from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

FEED_FIELDS = ["line_id", "seq", "member_ref", "batch_tag", "payee_name", "payee_email"]


def versioned_writes(targets: list[str], source_version: str) -> dict[str, Any]:
    """An `order_independent` route's conformance proof (D-310): every mapped target is replaced only by a newer
    source version, so no older fact overwrites a newer one whatever the arrival order."""
    return {"writes": [{"target": t, "operation": "replace_if_newer_source_version"} for t in targets],
            "source_version": source_version}


#: The proof of a route mapped through pack A's `records.webhook.fields` (its components carry `/sequence`).
WEBHOOK_FIELDS_PROOF = versioned_writes(["display_name", "email"], "/sequence")

PACK_A: dict[str, Any] = {
    "owner_pack": "acme-hooks",
    "label": "batched JSON webhook",
    "credential_ref": "acme-hooks-signing",
    "runtime": ("runtime.acme.contact-apply", 1),
    "routes": {
        "records.webhook": {
            "ordering_contract": "latest_source_position",
            "extract": {"format": "json", "components": "/events"},
            "normalize": {"event_kind": "/evt_type", "source_event_key": "/evt_id", "source_locator": "/record_id",
                          "occurred_at": "/emitted_at", "payload": "/attributes"},
            "ordering": {"partition": "/record_id", "position": "/sequence", "position_kind": "integer",
                         "tie_breaker": "/evt_id"},
            "projection": {"record_key": "/record_id"},
            "mapping": "records.webhook.fields",
            "terminal_disposition": {"applied": "advance", "noop": "advance", "rejected": "advance",
                                     "failed": "quarantine"},
        },
    },
    "mappings": {
        "records.webhook.fields": {"fields": [{"source": "/full_name", "target": "display_name"},
                                              {"source": "/mail", "target": "email"}]},
    },
}

PACK_B: dict[str, Any] = {
    "owner_pack": "ledger-feed",
    "label": "line-oriented feed",
    "credential_ref": "ledger-feed-sftp",
    "runtime": ("runtime.ledger.line-apply", 1),
    "routes": {
        "ledger.sequenced": {
            "ordering_contract": "strict_source_sequence",
            "extract": {"format": "lines", "separator": "\t", "fields": FEED_FIELDS},
            "normalize": {"event_kind": {"const": "ledger.line"}, "source_event_key": "/line_id",
                          "source_locator": "/member_ref"},
            "ordering": {"partition": "/member_ref", "position": "/seq", "position_kind": "integer",
                         "tie_breaker": "/line_id", "first_position": 1, "gap_deadline_seconds": 30,
                         "gap_disposition": "quarantine_partition"},
            "projection": {"record_key": "/member_ref"},
            "mapping": "ledger.columns",
        },
        "ledger.grouped": {
            "ordering_contract": "order_independent",
            "extract": {"format": "lines", "separator": "\t", "fields": FEED_FIELDS},
            "normalize": {"event_kind": {"const": "ledger.group-line"}, "source_event_key": "/line_id",
                          "source_locator": "/member_ref"},
            "window": {"grouping_key": "/batch_tag", "max_members": 3, "max_age_seconds": 60},
            "projection": {"record_key": "/member_ref"},
            "mapping": "ledger.columns",
            "order_independence": versioned_writes(["display_name", "email"], "/seq"),
        },
    },
    "mappings": {
        "ledger.columns": {"fields": [{"source": "/payee_name", "target": "display_name"},
                                      {"source": "/payee_email", "target": "email"}]},
    },
}

CONFORMANCE_PACKS = (PACK_A, PACK_B)

#: Event vocabulary carried in the packs' bodies (pack A's event type values), not in their definitions.
EVENT_VOCABULARY = ("contact.updated", "contact.created")


def _pointers(node: Any) -> Iterator[str]:
    if isinstance(node, str) and node.startswith("/"):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            if key not in ("target",):  # a mapping target is the Runtime's (application) field, not the source's
                yield from _pointers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _pointers(value)


def pack_literals(pack: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(names, pointers) of one pack: pack, credential, Runtime command, route, mapping and event-kind names and
    every source field name; and every JSON pointer its definitions use."""
    names = {pack["owner_pack"], pack["credential_ref"], pack["runtime"][0], *pack["routes"], *pack["mappings"]}
    pointers: set[str] = set()
    for definition in [*pack["routes"].values(), *pack["mappings"].values()]:
        pointers |= set(_pointers(definition))
        names |= set(definition.get("extract", {}).get("fields", []))
        kind = definition.get("normalize", {}).get("event_kind")
        if isinstance(kind, dict):
            names.add(kind["const"])
    names |= {segment for p in pointers for segment in p.strip("/").split("/") if segment}
    return names, pointers


def variant(pack: dict[str, Any], route: str, **changes: Any) -> dict[str, Any]:
    """A deep copy of `pack` whose `route` definition has top-level keys replaced; `ordering` and `window`
    are merged (`ordering={"gap_disposition": "skip_with_evidence"}` changes one key); None removes a key."""
    copied = copy.deepcopy(pack)
    definition = copied["routes"][route]
    for key, value in changes.items():
        if key in ("ordering", "window") and isinstance(value, dict) and key in definition:
            definition[key] = {**definition[key], **value}
        elif value is None:
            definition.pop(key, None)
        else:
            definition[key] = value
    return copied


def with_route(pack: dict[str, Any], business_key: str, definition: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of `pack` with one more route (for tests that need a route the conformance shape lacks)."""
    copied = copy.deepcopy(pack)
    copied["routes"][business_key] = copy.deepcopy(definition)
    return copied
