"""L1 conformance: two structurally different external-application packs run end to end through the same L0
model (admit -> materialize -> lane_advance -> claim -> run), on real PostgreSQL."""
from __future__ import annotations

import json

import pytest

from connector.choices import ComponentDisposition, ExecutionState
from connector.models import (
    ApplicationResult,
    CrmRecord,
    Event,
    Execution,
    OrderingLane,
    Projection,
    ProjectionWindow,
    ReceiptComponent,
    SupersededDecision,
)
from tests.conformance.packs import PACK_A, PACK_B, pack_literals
from tests.connector.inbound_helpers import (
    build_inbound_world,
    deliver,
    drain,
    feed_body,
    feed_line,
    lane,
    webhook_body,
    webhook_event,
)


def crm(record_key: str) -> dict:
    return CrmRecord.objects.get(record_key=record_key).fields


def test_the_two_packs_are_structurally_different():
    """The fixtures differ in structure, not only in names: JSON document vs tab-separated lines, nested vs flat
    fields, disjoint source field names, different ordering contracts and a window only in pack B.
    Proves: CV2-02-005"""
    route_a, = PACK_A["routes"].values()
    routes_b = PACK_B["routes"]
    assert route_a["extract"]["format"] == "json"
    assert {d["extract"]["format"] for d in routes_b.values()} == {"lines"}
    assert route_a["normalize"]["payload"] == "/attributes"  # pack A nests its business fields
    assert all("payload" not in d["normalize"] for d in routes_b.values())  # pack B is flat
    names_a, _ = pack_literals(PACK_A)
    names_b, _ = pack_literals(PACK_B)
    assert names_a.isdisjoint(names_b)
    assert {route_a["ordering_contract"]} | {d["ordering_contract"] for d in routes_b.values()} == {
        "latest_source_position", "strict_source_sequence", "order_independent"}
    assert "window" not in route_a and any("window" in d for d in routes_b.values())


@pytest.mark.django_db
def test_pack_a_batched_json_webhook_runs_end_to_end():
    """Pack A: a batched JSON delivery becomes one Receipt, one Component and Event per item with typed
    source-order facts, one lane per record; each lane executes its greatest position; Runtime upserts the CRM
    record through the pack's nested field mapping and the lane high-water is the executed position.
    Proves: CV2-02-005, CV2-06-006, CV2-06-012, CV2-06-014, CV2-07-022, CV2-08-001"""
    world = build_inbound_world("a-", [PACK_A])
    first = deliver(world, "records.webhook", webhook_body(
        webhook_event("evt-1", "rec-1", 1, full_name="Ada", mail="ada@one.test"),
        webhook_event("evt-2", "rec-2", 1, full_name="Bob", mail="bob@one.test")))
    assert first.components == 2 and len(first.events) == 2 and len(first.lanes) == 2
    drain()
    deliver(world, "records.webhook", webhook_body(
        webhook_event("evt-3", "rec-1", 2, full_name="Ada King", mail="ada@two.test")))
    done = drain()

    assert [e.state for e in done] == [ExecutionState.COMPLETED]
    assert crm("rec-1") == {"display_name": "Ada King", "email": "ada@two.test"}
    assert crm("rec-2") == {"display_name": "Bob", "email": "bob@one.test"}
    assert CrmRecord.objects.get(record_key="rec-1").version == 2
    assert list(ApplicationResult.objects.values_list("outcome", flat=True)) == ["applied"] * 3
    assert lane("records.webhook", "rec-1").high_water == 2
    assert lane("records.webhook", "rec-2").high_water == 1
    assert all(l.active_execution_id is None for l in OrderingLane.objects.all())
    event = Event.objects.get(source_event_key="evt-3")
    assert (event.ordering_contract, event.partition, bytes(event.position_bytes), bytes(event.tie_breaker),
            event.event_kind, event.source_locator) == (
        "latest_source_position", "rec-1", b"2", b"evt-3", "contact.updated", "rec-1")
    assert json.loads(bytes(event.payload)) == {"full_name": "Ada King", "mail": "ada@two.test"}
    for execution in Execution.objects.all():
        result = ApplicationResult.objects.get(command_id=execution.command_id)
        assert bytes(execution.runtime_receipt) == bytes(result.receipt)
        assert bytes(execution.execution_ref_digest) == bytes(result.execution_ref_digest)


@pytest.mark.django_db
def test_pack_b_line_feed_runs_end_to_end():
    """Pack B: tab-separated lines feed a strict-sequence route (one lane per member, every position executes in
    order) and a grouped order-independent route (three lines of one batch seal one window whose single
    Execution carries all three members); Runtime maps the flat columns.
    Proves: CV2-02-005, CV2-06-011, CV2-06-013, CV2-07-002, CV2-07-004, CV2-08-001"""
    world = build_inbound_world("b-", [PACK_B])
    deliver(world, "ledger.sequenced", feed_body(
        feed_line("ln-1", 1, "mem-1", payee_name="Grace"),
        feed_line("ln-2", 1, "mem-2", payee_name="Alan"),
        feed_line("ln-3", 2, "mem-1", payee_name="Grace Hopper", payee_email="grace@navy.test")))
    done = drain()
    assert len(done) == 3 and {e.state for e in done} == {ExecutionState.COMPLETED}
    positions = [Execution.objects.get(pk=e.pk).projection.position for e in done
                 if e.projection.lane.partition == "mem-1"]
    assert positions == [1, 2]
    assert lane("ledger.sequenced", "mem-1").high_water == 2
    assert lane("ledger.sequenced", "mem-2").high_water == 1
    assert crm("mem-1") == {"display_name": "Grace Hopper", "email": "grace@navy.test"}

    grouped = deliver(world, "ledger.grouped", feed_body(
        feed_line("gl-1", 7, "mem-3", batch_tag="tag-9", payee_name="Ann", payee_email="ann@x.test"),
        feed_line("gl-2", 8, "mem-4", batch_tag="tag-9", payee_name="Ben", payee_email="ben@x.test"),
        feed_line("gl-3", 9, "mem-5", batch_tag="tag-9", payee_name="Cy", payee_email="cy@x.test")))
    assert len(grouped.executions) == 1 and not grouped.lanes
    assert not OrderingLane.objects.filter(route="ledger.grouped").exists()
    window = ProjectionWindow.objects.get()
    assert (window.state, window.member_count, window.grouping_key) == ("sealed", 3, "tag-9")
    members = json.loads(bytes(Projection.objects.get(window=window).input))["members"]
    assert [m["source_event_key"] for m in members] == ["gl-1", "gl-2", "gl-3"]
    ran = drain()
    assert len(ran) == 1
    result = ApplicationResult.objects.get(command_id=ran[0].command_id)
    assert (result.outcome, result.detail) == ("applied", "applied,applied,applied")
    assert crm("mem-4") == {"display_name": "Ben", "email": "ben@x.test"}
    assert ApplicationResult.objects.count() == 4


@pytest.mark.django_db
def test_both_packs_share_one_world_and_one_l0_model():
    """Both packs installed in one epoch write the same L0 tables with the same generic shape; neither pack's
    delivery is interpreted by the other's route, and a body the route cannot parse is refused as a whole.
    Proves: CV2-02-003, CV2-02-005, CV2-06-007"""
    from connector.interpreters.inbound import BodyUnparseable

    world = build_inbound_world("ab-", [PACK_A, PACK_B])
    deliver(world, "records.webhook", webhook_body(webhook_event("evt-1", "rec-1", 4)))
    deliver(world, "ledger.sequenced", feed_body(feed_line("ln-1", 1, "mem-1")))
    drain()
    assert set(Event.objects.values_list("route", "ordering_contract")) == {
        ("records.webhook", "latest_source_position"), ("ledger.sequenced", "strict_source_sequence")}
    assert set(ReceiptComponent.objects.values_list("disposition", flat=True)) == {ComponentDisposition.EVENT}
    assert ApplicationResult.objects.count() == 2 and not SupersededDecision.objects.exists()
    with pytest.raises(BodyUnparseable):
        deliver(world, "ledger.sequenced", webhook_body(webhook_event("evt-2", "rec-1", 5)))
    with pytest.raises(BodyUnparseable):
        deliver(world, "records.webhook", feed_body(feed_line("ln-2", 2, "mem-1")))
    assert Event.objects.count() == 2
