"""The conformance proof an `order_independent` inbound route must carry (seed "Durable source ordering";
CV2-06-003/018, D-310). L0 checks it; it never takes the contract on the definition's word.

An `order_independent` route bypasses the OrderingLane, so applying its events in any order must leave the same
state, or at least never let an older source fact overwrite a newer one. The route definition therefore carries

    "order_independence": {"writes": [{"target": "<application field>" | "*", "operation": <closed kind>}, ...],
                           "source_version": ptr (required when any write is `replace_if_newer_source_version`)}

with one write per application field the route's mapping targets ("*" = every field of an unmapped route), each of
a closed kind that commutes or cannot overwrite newer state:

- `set_union`: the field is a set and each event adds members (commutes);
- `insert_if_absent`: the first value is kept, later ones never replace it (no overwrite);
- `append_by_source_key`: each event appends one member keyed by its SourceEventKey, idempotently (commutes);
- `replace_if_newer_source_version`: the write compares the route's `source_version` with the stored one and
  replaces only a strictly older value (cannot overwrite newer source state).

Any other kind (an unconditional replace is last-arrival-wins) is refused. The proof's digest is sha256 of its
canonical JSON with the route's mapping key; the cutover certificate attaches exactly this digest to the route's
`order_independent` disposition. The checks that need the mapping (every mapped target covered) run where the
epoch candidate sees the mapping binding (`check_mapping_coverage`)."""
from __future__ import annotations

import hashlib

from connector.errors import OwnerFactInvalid
from connector.receipts import canonical_json

COMMUTING_OPERATIONS = ("set_union", "insert_if_absent", "append_by_source_key", "replace_if_newer_source_version")
VERSIONED = "replace_if_newer_source_version"
EVERY_FIELD = "*"


class OrderIndependenceUnproven(OwnerFactInvalid):
    """An `order_independent` route lacks its conformance proof, or the proof does not show that the route's writes
    commute or cannot overwrite newer source state."""

    code = "ORDER_INDEPENDENCE_UNPROVEN"
    operator_action = ("Declare the route's writes with commuting or source-version-guarded operations, or give it "
                       "an ordered contract; install a new pack generation.")


def check_order_independence(definition: dict) -> bytes:
    """Check an `order_independent` route's proof; returns its digest. Raises OrderIndependenceUnproven."""
    route = definition.get("mapping") or ""
    proof = definition.get("order_independence")
    if not isinstance(proof, dict):
        raise OrderIndependenceUnproven("an order_independent route carries no order_independence proof")
    unknown = sorted(set(proof) - {"writes", "source_version"})
    if unknown:
        raise OrderIndependenceUnproven(f"order_independence has keys outside the closed shape: {unknown}")
    writes = proof.get("writes")
    if not isinstance(writes, list) or not writes:
        raise OrderIndependenceUnproven("order_independence.writes must list every write of the route")
    targets = []
    for write in writes:
        if not isinstance(write, dict) or set(write) != {"target", "operation"} or not isinstance(
                write["target"], str) or not write["target"]:
            raise OrderIndependenceUnproven(f"write {write!r} must be exactly {{target, operation}}")
        if write["operation"] not in COMMUTING_OPERATIONS:
            raise OrderIndependenceUnproven(
                f"write to {write['target']}: operation {write['operation']!r} neither commutes nor compares a "
                f"source version (closed kinds: {', '.join(COMMUTING_OPERATIONS)})")
        targets.append(write["target"])
    if len(set(targets)) != len(targets):
        raise OrderIndependenceUnproven("order_independence.writes names a target twice")
    if EVERY_FIELD in targets and len(targets) != 1:
        raise OrderIndependenceUnproven(f"a write to {EVERY_FIELD!r} must be the route's only write")
    if (EVERY_FIELD in targets) != (not route):
        raise OrderIndependenceUnproven(f"an unmapped route writes every field ({EVERY_FIELD!r}); a mapped route "
                                        "names each mapped target")
    version = proof.get("source_version")
    if any(w["operation"] == VERSIONED for w in writes):
        if not isinstance(version, str) or not version.startswith("/"):
            raise OrderIndependenceUnproven(f"{VERSIONED} needs the route's source_version pointer")
    elif version is not None:
        raise OrderIndependenceUnproven("source_version is declared but no write compares it")
    return proof_digest(definition)


def proof_digest(definition: dict) -> bytes:
    return hashlib.sha256(canonical_json({"mapping": definition.get("mapping") or "",
                                          "order_independence": definition.get("order_independence")})).digest()


def check_mapping_coverage(route_key: str, definition: dict, mapping: dict | None) -> None:
    """Every target the route's mapping writes is a write of the proof, and the proof names no other."""
    if mapping is None:
        raise OrderIndependenceUnproven(f"route {route_key}: its mapping {definition.get('mapping')} is not bound")
    mapped = {f.get("target") for f in mapping.get("fields", []) if isinstance(f, dict)}
    proved = {w["target"] for w in definition["order_independence"]["writes"]}
    if mapped != proved:
        raise OrderIndependenceUnproven(
            f"route {route_key}: the proof's writes {sorted(proved)} are not exactly the mapped targets "
            f"{sorted(mapped)}")
