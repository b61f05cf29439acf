"""The OrderingContract a route freezes in its epoch: one of three closed values per exact route, carried by every
Event of that route; a `latest_source_position` route must declare its partition and a typed integer position, and
gets a deterministic tie-breaker and a settle policy (CV2-06)."""
from __future__ import annotations

import copy
import hashlib
import json

import pytest

from connector.interpreters.inbound import RouteDefinitionInvalid, compile_route
from connector.models import Event, OrderingLane
from tests.conformance.packs import PACK_A, PACK_B
from tests.connector.inbound_helpers import build_inbound_world, deliver, feed_body, feed_line, webhook_body, \
    webhook_event

WEBHOOK, SEQUENCED = "records.webhook", "ledger.sequenced"


def _compile(definition: dict):
    raw = json.dumps(definition, sort_keys=True).encode()
    return compile_route(business_key="r", version=1, definition_bytes=raw,
                         definition_digest=hashlib.sha256(raw).digest())


@pytest.mark.django_db
def test_each_route_freezes_exactly_one_closed_ordering_contract():
    """Three routes of two packs, one per contract: every Event of a route carries that route's one frozen
    contract and contract digest, an ordered route's lane carries the same contract, and the order-independent
    route has no lane. Proves: CV2-06-002"""
    world = build_inbound_world("oc-", [PACK_A, PACK_B])
    deliver(world, WEBHOOK, webhook_body(webhook_event("E-1", "rec-1", 1), webhook_event("E-2", "rec-2", 1)))
    deliver(world, SEQUENCED, feed_body(feed_line("L-1", 1, "mem-1"), feed_line("L-2", 1, "mem-2")))
    unordered = next(k for k, r in PACK_B["routes"].items() if r["ordering_contract"] == "order_independent")
    deliver(world, unordered, feed_body(feed_line("L-3", 1, "mem-3", batch_tag="b-9")))
    frozen = {}
    for route, contract, digest in Event.objects.values_list("route", "ordering_contract", "contract_digest"):
        frozen.setdefault(route, set()).add((contract, bytes(digest)))
    assert {route: {c for c, _ in pairs} for route, pairs in frozen.items()} == {
        WEBHOOK: {"latest_source_position"}, SEQUENCED: {"strict_source_sequence"}, unordered: {"order_independent"}}
    assert all(len(pairs) == 1 for pairs in frozen.values())
    assert len({d for pairs in frozen.values() for _, d in pairs}) == 3
    lanes = set(OrderingLane.objects.values_list("route", "contract"))
    assert lanes == {(WEBHOOK, "latest_source_position"), (SEQUENCED, "strict_source_sequence")}


@pytest.mark.parametrize("change,detail", [
    (lambda o: o.pop("partition"), "ordering.partition"),
    (lambda o: o.pop("position"), "ordering.position"),
    (lambda o: o.update(position_kind="text"), "position_kind must be integer"),
])
def test_latest_source_position_needs_partition_and_a_typed_position(change, detail):
    """A `latest_source_position` route without a partition pointer, without a position pointer, or with a
    position that is not the typed integer kind is not a route: ROUTE_DEFINITION_INVALID. Proves: CV2-06-004"""
    definition = copy.deepcopy(PACK_A["routes"][WEBHOOK])
    change(definition["ordering"])
    with pytest.raises(RouteDefinitionInvalid, match=detail) as refused:
        _compile(definition)
    assert refused.value.code == "ROUTE_DEFINITION_INVALID"


def test_latest_source_position_has_a_deterministic_tie_breaker_and_a_settle_policy():
    """Positions are canonical integers (a non-canonical spelling is refused); without an explicit tie-breaker
    pointer the tie-breaker is the event's SourceEventKey, so the same component always yields the same
    (partition, position, tie-breaker); the settle policy maps every Runtime outcome to advance or quarantine.
    Proves: CV2-06-004"""
    definition = copy.deepcopy(PACK_A["routes"][WEBHOOK])
    program = _compile(definition)
    component = webhook_event("E-7", "rec-1", 12)
    first, again = program.normalize(component), program.normalize(copy.deepcopy(component))
    assert (first.partition, first.position, first.tie_breaker) == ("rec-1", 12, b"E-7")
    assert (again.partition, again.position, again.tie_breaker) == (first.partition, first.position,
                                                                    first.tie_breaker)
    del definition["ordering"]["tie_breaker"]
    defaulted = _compile(definition).normalize(webhook_event("E-8", "rec-1", 12))
    assert defaulted.tie_breaker == b"E-8"
    with pytest.raises(Exception, match="canonical integer"):
        program.normalize(webhook_event("E-9", "rec-1", "012"))
    assert {o: program.terminal_disposition(o) for o in ("applied", "noop", "rejected", "failed")} == {
        "applied": "advance", "noop": "advance", "rejected": "advance", "failed": "quarantine"}


def test_invocation_behaviour_is_orthogonal_dimensions_not_mode_names():
    """How a route is invoked is read from independent metadata dimensions of its definition (ordering contract,
    grouping window, dependency, settle policy) plus the replay's external-effects flag, never from a mode name:
    changing one dimension changes only that property of the compiled program; a definition carrying a mode name
    does not change the program; no inbound model has a mode column. Proves: CV2-07-003"""
    base = copy.deepcopy(PACK_B["routes"]["ledger.grouped"])
    base.pop("window")

    def shape(definition):
        p = _compile(definition)
        return {"contract": p.contract, "windowed": p.windowed, "ordered": p.ordered,
                "depends": bool(p.definition.get("depends_on")), "failed": p.terminal_disposition("failed")}

    immediate = shape(base)
    assert immediate == {"contract": "order_independent", "windowed": False, "ordered": False, "depends": False,
                         "failed": "quarantine"}
    variants = {
        "windowed": {**base, "window": PACK_B["routes"]["ledger.grouped"]["window"]},
        "depends": {**base, "depends_on": {"source_event_key": "/batch_tag", "deadline_seconds": 30}},
        "failed": {**base, "terminal_disposition": {"failed": "advance"}},
    }
    for dimension, definition in variants.items():
        changed = shape(definition)
        assert {k for k in changed if changed[k] != immediate[k]} == {dimension}, dimension
    assert shape({**base, "invocation_mode": "batch"}) == immediate
    from connector.models import Execution, Projection, ProjectionWindow
    for model in (Event, Projection, ProjectionWindow, Execution):
        assert [f.name for f in model._meta.concrete_fields if "mode" in f.name] == [], model.__name__
