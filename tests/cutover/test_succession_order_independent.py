"""V2 -> V2 succession of an `order_independent` route (D-310): it has no OrderingLane and so no OrderingHandoff;
the successor activation requires only its conformance proof, which it checks again."""
from __future__ import annotations

import pytest

from connector.choices import EpochState, ExecutionState
from connector.interpreters import ordering_proof
from connector.models import Execution, OrderingLane
from cutover.errors import SuccessorActivationRefused
from cutover.services import succession
from tests.conformance.packs import PACK_A, PACK_B
from tests.connector.inbound_helpers import deliver, feed_body, feed_line
from tests.cutover.succession_helpers import (
    ACTOR,
    WEBHOOK,
    build_succession_world,
    drain,
    halt_all,
    handoff_all,
    held_barrier,
    send,
    state_of,
)

GROUPED = "ledger.grouped"


@pytest.mark.django_db
def test_an_order_independent_route_crosses_with_its_proof_and_no_lane_handoff(monkeypatch):
    """With finished work on an ordered route and on an order-independent grouped route, the succession hands off
    only the ordered lane; the activation does not ask for a handoff of the order-independent route but checks
    its conformance proof again: a proof L0 no longer accepts refuses the activation and moves nothing; the
    checked proof activates the successor, which has no lane for that route either. Proves: CV2-11-017"""
    world = build_succession_world("soi-", [PACK_A, PACK_B])
    send(world, "evt-5", 5)
    for n in (1, 2, 3):  # the third member seals the window and mints one execution
        deliver(world, GROUPED, feed_body(feed_line(f"gl-{n}", n, f"mem-{n}", batch_tag="tag-1")))
    drain()
    grouped = Execution.objects.exclude(projection__window=None)
    assert [e.state for e in grouped] == [ExecutionState.COMPLETED]
    assert set(OrderingLane.objects.values_list("route", flat=True)) == {WEBHOOK}
    halt_all(world)
    barrier = held_barrier(world)
    assert [h.route for h in handoff_all(world, barrier)] == [WEBHOOK]
    before = state_of(world)
    monkeypatch.setattr(ordering_proof, "COMMUTING_OPERATIONS", ("set_union", "insert_if_absent"))
    with pytest.raises(SuccessorActivationRefused, match="ORDER_INDEPENDENCE_UNPROVEN"):
        succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert state_of(world) == before
    monkeypatch.undo()
    successor = succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert successor.state == EpochState.ACTIVE
    assert not OrderingLane.objects.filter(route=GROUPED).exists()
