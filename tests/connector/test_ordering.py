"""Source ordering on real PostgreSQL: `latest_source_position` never executes below the lane high-water,
`strict_source_sequence` never crosses a gap, gap deadlines apply the frozen disposition, quarantine halts the
partition, and the high-water only grows (CV2-06, decisions 6, 8, 9)."""
from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.db import IntegrityError, ProgrammingError, connection, transaction
from django.utils import timezone

from connector.choices import ExecutionState, LaneState
from connector.models import (
    ApplicationResult,
    CrmRecord,
    Execution,
    GapDecision,
    OrderingLane,
    Projection,
    SupersededDecision,
)
from connector.services import execution, runtime, sweeper
from tests import dbroles
from tests.concurrency import raised, run_concurrently
from tests.conformance.packs import PACK_A, PACK_B, variant
from tests.connector.inbound_helpers import (
    BugReproduced,
    advance_lanes,
    build_inbound_world,
    deliver,
    drain,
    feed_body,
    feed_line,
    lane,
    run_ready,
    webhook_body,
    webhook_event,
)

WEBHOOK, SEQUENCED = "records.webhook", "ledger.sequenced"


def later(seconds: int):
    """Freeze `timezone.now` `seconds` into the future (time passing without sleeping)."""
    return mock.patch("django.utils.timezone.now", return_value=timezone.now() + timedelta(seconds=seconds))


def runtime_spy():
    return mock.patch.object(runtime, "runtime_command_apply", wraps=runtime.runtime_command_apply)


def position_of(execution_row: Execution) -> int:
    return int(Projection.objects.get(executions=execution_row).position)


def executed_positions(route: str, partition: str) -> list[int]:
    return [int(p) for p in Execution.objects.filter(projection__route=route, projection__lane__partition=partition,
                                                     state=ExecutionState.COMPLETED)
            .order_by("pk").values_list("projection__position", flat=True)]


def superseded(route: str, partition: str) -> dict[int, str]:
    return {int(d.position): d.reason for d in SupersededDecision.objects.filter(lane__route=route,
                                                                                lane__partition=partition)}


def send_webhook(world, evt_id: str, position: int, record: str = "rec-1", **kw) -> None:
    deliver(world, WEBHOOK, webhook_body(webhook_event(evt_id, record, position, **kw)))


def send_feed(world, line_id: str, position: int, member: str = "mem-1", **kw) -> None:
    deliver(world, SEQUENCED, feed_body(feed_line(line_id, position, member, **kw)))


@pytest.fixture
def webhook_world(db):
    return build_inbound_world("o-", [PACK_A])


@pytest.fixture
def feed_world(db):
    return build_inbound_world("s-", [PACK_B])


# -- latest_source_position ---------------------------------------------------------------------------------------

def test_out_of_order_latest_positions_never_execute_below_the_high_water(webhook_world):
    """Positions 5, 3, 9, 7 arrive in separate receipts, each followed by a lane step: only 5 and 9 reach
    Runtime; 3 and 7 get append-only SupersededDecision rows, no Execution and no ApplicationResult. Arrival
    order never decides application order. Proves: CV2-06-001, CV2-06-012, CV2-06-014, CV2-06-029"""
    with runtime_spy() as spy:
        for evt_id, position in (("evt-5", 5), ("evt-3", 3), ("evt-9", 9), ("evt-7", 7)):
            send_webhook(webhook_world, evt_id, position, full_name=f"v{position}")
            drain()
    assert executed_positions(WEBHOOK, "rec-1") == [5, 9]
    assert superseded(WEBHOOK, "rec-1") == {3: "at_or_below_high_water", 7: "at_or_below_high_water"}
    assert spy.call_count == 2
    assert ApplicationResult.objects.count() == 2
    assert not Execution.objects.filter(projection__position__in=[3, 7]).exists()
    assert set(Projection.objects.filter(position__in=[3, 7]).values_list("lane_status", flat=True)) == {"superseded"}
    assert lane(WEBHOOK, "rec-1").high_water == 9
    assert CrmRecord.objects.get(record_key="rec-1").fields["display_name"] == "v9"
    decision = SupersededDecision.objects.get(position=7)
    assert decision.high_water_at_decision == 9 and decision.selected_position is None


def test_latest_selects_only_the_greatest_ready_position(webhook_world):
    """Four positions pending together in one lane: one lane step selects the greatest (9) and supersedes the
    lower ones as `lower_than_selected`, naming the selected position. Proves: CV2-06-012, CV2-06-009"""
    for evt_id, position in (("evt-5", 5), ("evt-3", 3), ("evt-9", 9), ("evt-7", 7)):
        send_webhook(webhook_world, evt_id, position)
    minted = advance_lanes()
    assert [position_of(e) for e in minted] == [9]
    assert superseded(WEBHOOK, "rec-1") == {3: "lower_than_selected", 5: "lower_than_selected",
                                            7: "lower_than_selected"}
    assert set(SupersededDecision.objects.values_list("selected_position", flat=True)) == {9}
    assert Execution.objects.count() == 1
    assert lane(WEBHOOK, "rec-1").active_execution_id == minted[0].pk


def test_position_99_after_high_water_100_is_superseded_without_runtime(webhook_world):
    """The high-water moves only when the Runtime result receipt is recorded (not at mint or claim); a later
    position 99 is superseded without an Execution or a Runtime call. Proves: CV2-06-012, CV2-06-014,
    CV2-07-015, CV2-07-022"""
    send_webhook(webhook_world, "evt-100", 100)
    minted, = advance_lanes()
    assert lane(WEBHOOK, "rec-1").high_water is None
    token = execution.execution_claim(holder="w1")
    assert token.execution_pk == minted.pk and lane(WEBHOOK, "rec-1").high_water is None
    fence_before = lane(WEBHOOK, "rec-1").fence
    done = execution.execution_run(token=token)
    assert done.state == ExecutionState.COMPLETED
    after = lane(WEBHOOK, "rec-1")
    assert (after.high_water, bytes(after.high_water_tie), after.active_execution_id) == (100, b"evt-100", None)
    assert after.fence == fence_before + 1

    with runtime_spy() as spy:
        send_webhook(webhook_world, "evt-99", 99)
        assert advance_lanes() == [] and run_ready() == []
    assert spy.call_count == 0
    assert superseded(WEBHOOK, "rec-1") == {99: "at_or_below_high_water"}
    assert ApplicationResult.objects.count() == 1 and lane(WEBHOOK, "rec-1").high_water == 100


@pytest.mark.parametrize("route", [WEBHOOK, SEQUENCED])
def test_same_position_with_new_source_event_key_is_superseded(db, route):
    """A position re-sent under a new SourceEventKey after it completed is a new Event, but at or below the
    high-water: it is superseded, never executed. Proves: CV2-06-012, CV2-06-013, CV2-06-014"""
    world = build_inbound_world("d-", [PACK_A, PACK_B])
    send = send_webhook if route == WEBHOOK else send_feed
    partition = "rec-1" if route == WEBHOOK else "mem-1"
    send(world, "first-1", 1)
    drain()
    with runtime_spy() as spy:
        send(world, "again-1", 1)
        drain()
    assert spy.call_count == 0
    assert superseded(route, partition) == {1: "at_or_below_high_water"}
    assert executed_positions(route, partition) == [1]
    assert ApplicationResult.objects.count() == 1


# -- strict_source_sequence ---------------------------------------------------------------------------------------

def test_strict_sequence_never_crosses_a_gap(feed_world):
    """1, 2, 4 arrive: 1 and 2 execute, 4 waits behind the gap with no Execution and no lease, and the lane
    records when the gap began; when 3 arrives, 3 then 4 execute in sequence. Proves: CV2-06-013, CV2-06-029,
    CV2-06-001"""
    deliver(feed_world, SEQUENCED, feed_body(feed_line("ln-1", 1, "mem-1"), feed_line("ln-2", 2, "mem-1"),
                                             feed_line("ln-4", 4, "mem-1")))
    drain()
    waiting = lane(SEQUENCED, "mem-1")
    assert executed_positions(SEQUENCED, "mem-1") == [1, 2]
    assert waiting.high_water == 2 and waiting.gap_since is not None and waiting.active_execution_id is None
    assert Projection.objects.get(position=4).lane_status == "pending"
    assert not Execution.objects.filter(projection__position=4).exists()
    assert not Execution.objects.exclude(lease_holder="").exists()
    assert execution.execution_claim(holder="idle") is None
    assert execution.lane_advance(lane_pk=waiting.pk) is None

    send_feed(feed_world, "ln-3", 3)
    drain()
    assert executed_positions(SEQUENCED, "mem-1") == [1, 2, 3, 4]
    done = lane(SEQUENCED, "mem-1")
    assert (done.high_water, done.gap_since) == (4, None)
    assert not SupersededDecision.objects.exists() and not GapDecision.objects.exists()


def test_strict_gap_past_deadline_quarantines_the_partition(feed_world):
    """A gap that outlives the frozen deadline with `quarantine_partition` appends a GapDecision and halts the
    lane with GAP_DEADLINE; before the deadline nothing happens; the missing position arriving later does not
    restart the halted lane. Proves: CV2-06-005, CV2-06-013, decision 9"""
    send_feed(feed_world, "ln-1", 1)
    send_feed(feed_world, "ln-3", 3)
    drain()
    gap = lane(SEQUENCED, "mem-1")
    assert gap.gap_since is not None
    assert execution.lane_gap_deadline(lane_pk=gap.pk) is None
    with later(29):
        assert execution.lane_gap_deadline(lane_pk=gap.pk) is None
    assert not GapDecision.objects.exists()
    with later(31):
        assert execution.lane_gap_deadline(lane_pk=gap.pk) == "quarantine_partition"
    halted = lane(SEQUENCED, "mem-1")
    assert (halted.state, halted.halt_reason, halted.high_water) == (LaneState.HALTED, "GAP_DEADLINE", 1)
    decision = GapDecision.objects.get()
    assert (decision.expected_position, decision.next_available, decision.disposition) == (
        2, 3, "quarantine_partition")
    send_feed(feed_world, "ln-2", 2)
    assert drain() == []
    assert executed_positions(SEQUENCED, "mem-1") == [1]
    with later(3600):
        assert execution.lane_gap_deadline(lane_pk=gap.pk) is None
    assert GapDecision.objects.count() == 1


def test_strict_gap_past_deadline_skips_with_evidence(db):
    """With `skip_with_evidence`, the sweeper finds the expired gap, appends a GapDecision and moves the lane
    past the gap; the next available position then executes. Proves: CV2-06-005, CV2-06-013, decision 9"""
    world = build_inbound_world("k-", [variant(PACK_B, SEQUENCED, ordering={"gap_disposition": "skip_with_evidence"})])
    send_feed(world, "ln-1", 1)
    send_feed(world, "ln-4", 4)
    drain()
    assert sweeper.inbound_sweep(grace_seconds=0).gaps_decided == 0
    with later(31):
        assert sweeper.inbound_sweep(grace_seconds=0).gaps_decided == 1
    decision = GapDecision.objects.get()
    assert (decision.expected_position, decision.next_available, decision.disposition) == (
        2, 4, "skip_with_evidence")
    skipped = lane(SEQUENCED, "mem-1")
    assert (skipped.state, skipped.high_water, skipped.gap_since) == (LaneState.OPEN, 3, None)
    drain()
    assert executed_positions(SEQUENCED, "mem-1") == [1, 4]
    assert lane(SEQUENCED, "mem-1").high_water == 4


def test_stale_duplicate_does_not_open_a_gap(feed_world):
    """A stale duplicate of a completed position (superseded) leaves a strict lane without a gap: no gap
    timer starts and the gap deadline never halts the partition. Proves: CV2-06-013, decision 9"""
    send_feed(feed_world, "ln-1", 1)
    drain()
    send_feed(feed_world, "ln-1-again", 1)
    drain()
    assert superseded(SEQUENCED, "mem-1") == {1: "at_or_below_high_water"}
    with later(31):
        execution.lane_gap_deadline(lane_pk=lane(SEQUENCED, "mem-1").pk)
    after = lane(SEQUENCED, "mem-1")
    if (after.state, after.gap_since, GapDecision.objects.count()) != (LaneState.OPEN, None, 0):
        raise BugReproduced(f"lane {after.state} {after.halt_reason}, gap_since={after.gap_since}")


# -- quarantine and lease expiry ----------------------------------------------------------------------------------

@pytest.mark.parametrize("route", [WEBHOOK, SEQUENCED])
def test_quarantined_result_halts_the_lane_and_lease_expiry_releases_nothing(db, route):
    """Under a frozen terminal-disposition policy mapping `rejected` to `quarantine`, a rejected Runtime
    result quarantines the Execution (RESULT_REJECTED), leaves the high-water where it was and halts the
    partition; later positions are never minted, claimed or run, however much time passes.
    Proves: CV2-06-015, CV2-06-014, decision 6"""
    quarantine = {"applied": "advance", "noop": "advance", "rejected": "quarantine", "failed": "quarantine"}
    pack = variant(PACK_A, WEBHOOK, terminal_disposition=quarantine) if route == WEBHOOK else \
        variant(PACK_B, SEQUENCED, terminal_disposition=quarantine)
    world = build_inbound_world("q-", [pack])
    if route == WEBHOOK:
        send_webhook(world, "evt-1", 1)
        send_webhook(world, "evt-2", 2, mail="not-an-address")
        send_3 = lambda: send_webhook(world, "evt-3", 3)
        partition = "rec-1"
    else:
        send_feed(world, "ln-1", 1)
        send_feed(world, "ln-2", 2, payee_email="not-an-address")
        send_3 = lambda: send_feed(world, "ln-3", 3)
        partition = "mem-1"
    drain()  # latest: only 2 executes (1 superseded); strict: 1 then 2
    bad = Execution.objects.get(projection__position=2)
    assert (bad.state, bad.quarantine_reason, bad.result_outcome) == (
        ExecutionState.QUARANTINED, "RESULT_REJECTED", "rejected")
    halted = lane(route, partition)
    assert (halted.state, halted.halt_reason, halted.active_execution_id) == (
        LaneState.HALTED, "RESULT_REJECTED", None)
    high_water = halted.high_water
    assert high_water == (None if route == WEBHOOK else 1)
    send_3()
    with later(3600):
        assert drain() == []
        assert execution.execution_claim(holder="late", lease_seconds=1) is None
        sweeper.inbound_sweep(grace_seconds=0)
    assert Projection.objects.get(position=3).lane_status == "pending"
    assert not Execution.objects.filter(projection__position=3).exists()
    assert lane(route, partition).high_water == high_water
    assert ApplicationResult.objects.filter(outcome="rejected").count() == 1


def test_lease_expiry_or_runtime_error_never_releases_a_later_position(feed_world):
    """An Execution whose worker vanished (lease expired) or whose Runtime call raised stays the lane's active
    Execution: the next position is not minted, and the expired claim is retaken for the same Execution.
    Proves: CV2-06-015, CV2-07-017, CV2-07-020, CV2-08-006"""
    send_feed(feed_world, "ln-1", 1)
    send_feed(feed_world, "ln-2", 2)
    first, = advance_lanes()
    token = execution.execution_claim(holder="vanished", lease_seconds=1)
    assert token.execution_pk == first.pk
    with later(5):
        assert advance_lanes() == []
        retry = execution.execution_claim(holder="second", lease_seconds=60)
    assert retry.execution_pk == first.pk and retry.lease_fence > token.lease_fence
    with mock.patch.object(runtime, "runtime_command_apply", side_effect=RuntimeError("runtime unreachable")), \
            pytest.raises(RuntimeError):
        execution.execution_run(token=retry)
    with later(120):
        assert advance_lanes() == []
    assert Execution.objects.get(pk=first.pk).state == ExecutionState.READY
    assert not Execution.objects.filter(projection__position=2).exists()
    assert lane(SEQUENCED, "mem-1").high_water is None and ApplicationResult.objects.count() == 0
    with later(120):
        assert [position_of(e) for e in drain()] == [1, 2]


# -- database rules -----------------------------------------------------------------------------------------------

def _raw(sql: str, params: list) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


def test_database_refuses_to_lower_the_high_water(webhook_world):
    """A raw UPDATE that lowers or clears a lane high-water fails in PostgreSQL; raising it is allowed.
    Proves: CV2-06-009, CV2-06-014"""
    send_webhook(webhook_world, "evt-7", 7)
    drain()
    pk = lane(WEBHOOK, "rec-1").pk
    for value in (6, None):
        with pytest.raises(IntegrityError, match="never decreases"):
            _raw("UPDATE connector_orderinglane SET high_water=%s WHERE id=%s", [value, pk])
    assert lane(WEBHOOK, "rec-1").high_water == 7
    _raw("UPDATE connector_orderinglane SET high_water=8 WHERE id=%s", [pk])
    assert lane(WEBHOOK, "rec-1").high_water == 8


def test_database_enforces_one_lane_per_partition_and_append_only_decisions(webhook_world):
    """One OrderingLane per (epoch, account, route, version, partition); no lane for an order-independent
    contract; SupersededDecision and GapDecision rows are never updated or deleted.
    Proves: CV2-15-013, CV2-06-011, decision 8"""
    send_webhook(webhook_world, "evt-2", 2)
    send_webhook(webhook_world, "evt-1", 1)
    drain()
    existing = lane(WEBHOOK, "rec-1")
    with pytest.raises(IntegrityError), transaction.atomic():
        OrderingLane.objects.create(epoch=existing.epoch, account=existing.account, route=WEBHOOK, route_version=1,
                                    partition="rec-1", contract="latest_source_position")
    with pytest.raises(IntegrityError), transaction.atomic():
        OrderingLane.objects.create(epoch=existing.epoch, account=existing.account, route=WEBHOOK, route_version=1,
                                    partition="rec-other", contract="order_independent")
    decision = SupersededDecision.objects.get()
    with pytest.raises(ProgrammingError, match="permission denied"):  # the application role: no privilege
        _raw("UPDATE connector_supersededdecision SET reason='x' WHERE id=%s", [decision.pk])
    with dbroles.as_admin(), pytest.raises(IntegrityError, match="append-only"):  # anyone else: the trigger
        _raw("UPDATE connector_supersededdecision SET reason='x' WHERE id=%s", [decision.pk])
    with dbroles.as_admin(), pytest.raises(IntegrityError, match="append-only"):
        _raw("DELETE FROM connector_supersededdecision WHERE id=%s", [decision.pk])
    GapDecision.objects.create(lane=existing, expected_position=3, next_available=None, disposition="probe")
    with dbroles.as_admin(), pytest.raises(IntegrityError, match="append-only"):
        _raw("UPDATE connector_gapdecision SET disposition='other'", [])


# -- races ---------------------------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_concurrent_lane_steps_mint_one_execution():
    """Six workers step one lane with four pending positions at the same moment (separate connections): exactly
    one Execution is minted (the greatest), the rest are superseded once each, with no error or deadlock.
    Proves: CV2-06-009, CV2-06-010, CV2-06-029, CV2-15-013, CV2-15-024"""
    world = build_inbound_world("rl-", [PACK_A])
    for evt_id, position in (("evt-4", 4), ("evt-2", 2), ("evt-8", 8), ("evt-6", 6)):
        send_webhook(world, evt_id, position)
    pk = lane(WEBHOOK, "rec-1").pk
    results = run_concurrently([lambda: execution.lane_advance(lane_pk=pk)] * 6)
    assert raised(results) == []
    minted = [r for r in results if r is not None]
    assert len(minted) == 1 and position_of(minted[0]) == 8
    assert Execution.objects.count() == 1
    assert superseded(WEBHOOK, "rec-1") == {2: "lower_than_selected", 4: "lower_than_selected",
                                            6: "lower_than_selected"}
    assert lane(WEBHOOK, "rec-1").active_execution_id == minted[0].pk


@pytest.mark.django_db(transaction=True)
def test_concurrent_result_recording_advances_the_high_water_once():
    """Two workers holding the same claim run and record one Execution at the same moment: Runtime applies
    once, one ApplicationResult exists, the Execution completes once and the lane high-water and fence advance
    in one fenced transaction. Proves: CV2-06-010, CV2-06-029, CV2-07-015, CV2-08-012, CV2-15-017"""
    world = build_inbound_world("rr-", [PACK_A])
    send_webhook(world, "evt-3", 3)
    advance_lanes()
    token = execution.execution_claim(holder="w")
    fence = lane(WEBHOOK, "rec-1").fence
    results = run_concurrently([lambda: execution.execution_run(token=token)] * 2)
    assert raised(results) == []
    assert {r.state for r in results} == {ExecutionState.COMPLETED}
    assert ApplicationResult.objects.count() == 1
    assert CrmRecord.objects.get(record_key="rec-1").version == 1
    done = lane(WEBHOOK, "rec-1")
    assert (done.high_water, done.active_execution_id, done.fence) == (3, None, fence + 1)
