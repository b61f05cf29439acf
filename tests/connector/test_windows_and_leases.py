"""ProjectionWindow sealing and succession, Execution leases and attempts, and Runtime result idempotency, on
real PostgreSQL with concurrent transactions on separate connections (CV2-07, CV2-08, CV2-15-015/016/017)."""
from __future__ import annotations

import hashlib
import json
import threading
from datetime import timedelta
from unittest import mock

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from connector.choices import ExecutionState
from connector.errors import TransitionRefused
from connector.models import (
    ApplicationResult,
    CrmRecord,
    Event,
    Execution,
    ExecutionAttempt,
    Projection,
    ProjectionWindow,
    WindowMember,
)
from connector.services import execution, materialize, runtime, sweeper
from tests.concurrency import raised, run_concurrently, start, wait_until
from tests.conformance.packs import PACK_A, PACK_B
from tests.connector.inbound_helpers import (
    BugReproduced,
    admit,
    advance_lanes,
    build_inbound_world,
    deliver,
    feed_body,
    feed_line,
    waiting_in_this_database,
    webhook_body,
    webhook_event,
)
from tests.support import scaled
from tests import dbroles

GROUPED = "ledger.grouped"


def later(seconds: int):
    return mock.patch("django.utils.timezone.now", return_value=timezone.now() + timedelta(seconds=seconds))


def group_line(n: int, tag: str = "tag-1") -> bytes:
    return feed_body(feed_line(f"gl-{n}", n, f"mem-{n}", batch_tag=tag, payee_name=f"H{n}",
                               payee_email=f"h{n}@x.test"))


def window_members(window: ProjectionWindow) -> list[str]:
    return list(WindowMember.objects.filter(window=window).order_by("ordinal")
                .values_list("event__source_event_key", flat=True))


def active_generations(projection: Projection) -> int:
    return Execution.objects.filter(projection=projection, state__in=["ready", "waiting_dependency"]).count()


@pytest.fixture
def feed_world(db):
    return build_inbound_world("wl-", [PACK_B])


@pytest.fixture
def webhook_world(db):
    return build_inbound_world("ls-", [PACK_A])


# -- windows -------------------------------------------------------------------------------------------------------

def test_third_member_seals_the_window_and_mints_one_execution(feed_world):
    """A grouped window stays open below max_members; the third member seals it in the same transaction and
    mints exactly one Execution whose Runtime input carries all three members in order; Runtime applies each.
    Proves: CV2-07-002, CV2-07-004, CV2-07-001, CV2-15-016"""
    assert deliver(feed_world, GROUPED, group_line(1)).executions == []
    assert deliver(feed_world, GROUPED, group_line(2)).executions == []
    window = ProjectionWindow.objects.get()
    assert (window.state, window.member_count) == ("open", 2)
    minted = deliver(feed_world, GROUPED, group_line(3)).executions
    assert len(minted) == 1
    window.refresh_from_db()
    assert (window.state, window.member_count, window.sealed_at is not None) == ("sealed", 3, True)
    projection = Projection.objects.get(window=window)
    data = json.loads(bytes(projection.input))
    assert data["grouping_key"] == "tag-1"
    assert [m["source_event_key"] for m in data["members"]] == ["gl-1", "gl-2", "gl-3"]
    assert [m["record_key"] for m in data["members"]] == ["mem-1", "mem-2", "mem-3"]
    assert Execution.objects.get().projection_id == projection.pk
    token = execution.execution_claim(holder="w")
    done = execution.execution_run(token=token)
    assert done.state == ExecutionState.COMPLETED
    assert ApplicationResult.objects.get().detail == "applied,applied,applied"
    assert CrmRecord.objects.count() == 3


def test_fourth_event_opens_a_successor_window(feed_world):
    """Input after the seal lands in a new open window of the same grouping key; a different key has its own
    window; the database allows one open window per (epoch, route, grouping key) and never changes a window's
    grouping key or close policy. Proves: CV2-07-002, CV2-07-006, CV2-15-015"""
    for n in (1, 2, 3, 4):
        deliver(feed_world, GROUPED, group_line(n))
    deliver(feed_world, GROUPED, group_line(5, tag="tag-2"))
    first, second, other = ProjectionWindow.objects.order_by("pk")
    assert (first.state, window_members(first)) == ("sealed", ["gl-1", "gl-2", "gl-3"])
    assert (second.state, second.grouping_key, window_members(second)) == ("open", "tag-1", ["gl-4"])
    assert (other.state, other.grouping_key, window_members(other)) == ("open", "tag-2", ["gl-5"])
    with pytest.raises(IntegrityError), transaction.atomic():
        ProjectionWindow.objects.create(account=second.account, epoch=second.epoch, route=GROUPED,
                                        grouping_key="tag-1", max_members=3, max_age_seconds=60,
                                        closes_at=timezone.now())
    for change in ("grouping_key='tag-9'", "closes_at=closes_at + interval '1 hour'", "max_members=10"):
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"UPDATE connector_projectionwindow SET {change} WHERE id=%s", [second.pk])


def test_sweeper_seals_a_window_past_its_close_time(feed_world):
    """A window below max_members is sealed by the sweeper only after `closes_at` (max_age_seconds), with the
    membership it had; the seal mints one Execution. Proves: CV2-07-002, CV2-07-004"""
    deliver(feed_world, GROUPED, group_line(1))
    deliver(feed_world, GROUPED, group_line(2))
    window = ProjectionWindow.objects.get()
    assert sweeper.inbound_sweep(grace_seconds=0).windows_sealed == 0
    assert execution.window_seal_due(window_pk=window.pk) is None
    with later(61):
        report = sweeper.inbound_sweep(grace_seconds=0)
    assert report.windows_sealed == 1 and report.claimable == 1
    window.refresh_from_db()
    assert (window.state, window.member_count, window_members(window)) == ("sealed", 2, ["gl-1", "gl-2"])
    projection = Projection.objects.get(window=window)
    assert len(json.loads(bytes(projection.input))["members"]) == 2
    assert active_generations(projection) == 1
    with later(120):
        assert execution.window_seal_due(window_pk=window.pk) is None
    assert Execution.objects.count() == 1


def _held(fn, entered: threading.Event, release: threading.Event):
    """Run `fn` inside an outer transaction that stays open (locks held) until `release`."""
    def run():
        with transaction.atomic():
            result = fn()
            entered.set()
            assert release.wait(scaled(15))
            return result
    return run


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("first", ["seal", "input"])
def test_window_close_racing_new_input_loses_nothing(first):
    """Window close (window_seal_due) and new input race on separate connections. Whichever commits first
    decides: seal first -> the sealed window keeps its two members and the late input opens a successor window;
    input first -> the seal waits on the window row and seals the membership including the late input. Either way each Event is in exactly one
    window, each sealed window has one Projection with exactly one active Execution generation, and sealed
    membership never changes. Proves: CV2-07-006, CV2-07-007, CV2-15-015, CV2-15-016, CV2-15-024"""
    world = build_inbound_world(f"wr{first}-", [PACK_B])
    early = [1, 2] if first == "seal" else [1]  # below max_members (3) even with the late input
    for n in early:
        deliver(world, GROUPED, group_line(n))
    window = ProjectionWindow.objects.get()
    late = admit(world, GROUPED, group_line(3))
    seal = lambda: execution.window_seal_due(window_pk=window.pk)
    add = lambda: materialize.receipt_materialize(receipt_pk=late.pk)
    entered, release = threading.Event(), threading.Event()
    with later(61):  # the window is due; the patch is process-wide, so both threads see it
        holder = start(_held(seal if first == "seal" else add, entered, release), "first")
        assert entered.wait(scaled(15))
        other = start(add if first == "seal" else seal, "second")
        assert wait_until(lambda: waiting_in_this_database() >= 1), "the second transaction never waited"
        assert other.is_alive()
        release.set()
        holder.join(scaled(20))
        other.join(scaled(20))
    assert holder.error is None and other.error is None, (holder.error, other.error)
    windows = list(ProjectionWindow.objects.order_by("pk"))
    if first == "seal":
        assert [(w.state, window_members(w)) for w in windows] == [
            ("sealed", ["gl-1", "gl-2"]), ("open", ["gl-3"])]
    else:
        assert [(w.state, window_members(w)) for w in windows] == [("sealed", ["gl-1", "gl-3"])]
    assert Event.objects.count() == WindowMember.objects.count() == len(early) + 1
    for w in windows:
        assert w.member_count == len(window_members(w))
        if w.state == "sealed":
            projection = Projection.objects.get(window=w)
            assert len(json.loads(bytes(projection.input))["members"]) == w.member_count
            assert active_generations(projection) == 1
    assert Execution.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_free_running_window_traffic_loses_nothing():
    """Eight deliveries of one grouping key and repeated close attempts run at once on separate connections;
    after the sweeper re-materializes any receipt whose transaction failed, every Event is a member of exactly
    one window, at most one window stays open, every sealed window has between one and max_members members and
    exactly one active Execution generation. (A worker may currently fail with the successor-window race shown
    by `test_successor_window_creation_race_does_not_fail`; no other error is tolerated.)
    Proves: CV2-07-006, CV2-07-007, CV2-15-015, CV2-15-016, CV2-15-024"""
    world = build_inbound_world("wf-", [PACK_B])
    deliver(world, GROUPED, group_line(0))
    first_window = ProjectionWindow.objects.get().pk
    receipts = [admit(world, GROUPED, group_line(n)) for n in range(1, 9)]
    jobs = [lambda pk=r.pk: materialize.receipt_materialize(receipt_pk=pk) for r in receipts]
    jobs += [lambda: execution.window_seal_due(window_pk=first_window)] * 2
    with later(61):
        results = run_concurrently(jobs)
    errors = raised(results)
    assert all(isinstance(e, AttributeError) and "'pk'" in str(e) for e in errors), errors
    sweeper.inbound_sweep(grace_seconds=0)
    assert Event.objects.count() == WindowMember.objects.count() == 9
    assert ProjectionWindow.objects.filter(state="open").count() <= 1
    for w in ProjectionWindow.objects.all():
        assert w.member_count == len(window_members(w))
        if w.state == "sealed":
            assert 1 <= w.member_count <= 3
            assert active_generations(Projection.objects.get(window=w)) == 1
    assert Execution.objects.count() == ProjectionWindow.objects.filter(state="sealed").count()


@pytest.mark.django_db(transaction=True)
def test_successor_window_creation_race_does_not_fail():
    """Two first inputs of a grouping key race to open its window while a close seals the winner's window in
    between: the loser lands in a successor window and its materialization succeeds. Proves: CV2-07-006,
    CV2-15-015, CV2-15-024"""
    world = build_inbound_world("ws-", [PACK_B])
    ra, rb = admit(world, GROUPED, group_line(1)), admit(world, GROUPED, group_line(2))
    entered, release = threading.Event(), threading.Event()
    reselecting, sealed = threading.Event(), threading.Event()
    real = materialize.locks.open_window_for_update
    calls = {"b": 0}

    def instrumented(**kwargs):
        if threading.current_thread().name == "loser":
            calls["b"] += 1
            if calls["b"] == 2:  # after its INSERT lost on the unique index
                reselecting.set()
                assert sealed.wait(scaled(15))
        return real(**kwargs)

    with mock.patch.object(materialize.locks, "open_window_for_update", side_effect=instrumented):
        winner = start(_held(lambda: materialize.receipt_materialize(receipt_pk=ra.pk), entered, release), "winner")
        assert entered.wait(scaled(15))
        loser = start(lambda: materialize.receipt_materialize(receipt_pk=rb.pk), "loser")
        assert wait_until(lambda: waiting_in_this_database() >= 1), "the loser never waited on the unique index"
        release.set()
        winner.join(scaled(20))
        assert reselecting.wait(scaled(15)), "the loser never lost the INSERT race"
        window = ProjectionWindow.objects.get(state="open")
        with later(61):
            assert execution.window_seal_due(window_pk=window.pk) is not None
        sealed.set()
        loser.join(scaled(20))
    assert winner.error is None
    if loser.error is not None:
        raise BugReproduced(repr(loser.error))
    assert [(w.state, window_members(w)) for w in ProjectionWindow.objects.order_by("pk")] == [
        ("sealed", ["gl-1"]), ("open", ["gl-2"])]


# -- leases and attempts ------------------------------------------------------------------------------------------

def test_expired_lease_retakes_the_same_execution_as_a_new_attempt(webhook_world):
    """A claim not run within its lease: while the lease is live nobody else claims; after expiry the next
    claim takes the SAME Execution (same pk and command ID) as Attempt 2 with a higher lease fence; running it
    yields exactly one ApplicationResult, and the first holder's late run returns the same completion.
    Proves: CV2-07-016, CV2-07-017, CV2-07-020, CV2-07-021, CV2-08-005, CV2-08-010"""
    deliver(webhook_world, "records.webhook", webhook_body(webhook_event("evt-1", "rec-1", 1)))
    minted, = advance_lanes()
    first = execution.execution_claim(holder="worker-a", lease_seconds=1)
    assert first.execution_pk == minted.pk
    assert execution.execution_claim(holder="worker-b") is None
    with later(5):
        second = execution.execution_claim(holder="worker-b", lease_seconds=60)
    assert second.execution_pk == minted.pk and second.lease_fence > first.lease_fence
    row = Execution.objects.get(pk=minted.pk)
    assert (row.command_id, row.attempt_count, row.lease_holder) == (minted.command_id, 2, "worker-b")
    attempts = list(ExecutionAttempt.objects.filter(execution=row).values_list("ordinal", "holder", "lease_fence"))
    assert attempts == [(1, "worker-a", first.lease_fence), (2, "worker-b", second.lease_fence)]
    assert execution.execution_claim(holder="worker-c") is None
    done = execution.execution_run(token=second)
    late = execution.execution_run(token=first)
    assert done.state == late.state == ExecutionState.COMPLETED
    assert Execution.objects.count() == 1 and ApplicationResult.objects.count() == 1
    assert CrmRecord.objects.get().version == 1
    assert bytes(Execution.objects.get().runtime_receipt) == bytes(ApplicationResult.objects.get().receipt)


def test_dependency_free_execution_completes_only_from_the_runtime_receipt(webhook_world):
    """A worker's word is not a result: recording a result for a command Runtime never committed, or under
    another command ID, is refused and the Execution stays ready. Proves: CV2-07-014, CV2-07-022, CV2-08-006,
    CV2-08-008"""
    deliver(webhook_world, "records.webhook", webhook_body(webhook_event("evt-1", "rec-1", 1)))
    minted, = advance_lanes()
    with pytest.raises(TransitionRefused, match="no Runtime result"):
        execution.execution_record_result(execution_pk=minted.pk, command_id=minted.command_id,
                                          execution_ref_digest=bytes(minted.execution_ref_digest))
    with pytest.raises(TransitionRefused, match="another command"):
        execution.execution_record_result(execution_pk=minted.pk, command_id="cmd-other",
                                          execution_ref_digest=bytes(minted.execution_ref_digest))
    assert Execution.objects.get(pk=minted.pk).state == ExecutionState.READY
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE connector_execution SET state='completed' WHERE id=%s", [minted.pk])


@pytest.mark.django_db(transaction=True)
def test_eight_concurrent_claimers_take_each_ready_execution_once():
    """Eight workers claim at the same moment with three ready Executions: each Execution is claimed exactly
    once (FOR UPDATE SKIP LOCKED plus the lease check), five workers get nothing, no error or deadlock.
    Proves: CV2-07-016, CV2-07-018, CV2-15-024"""
    world = build_inbound_world("cc-", [PACK_A])
    deliver(world, "records.webhook", webhook_body(*(webhook_event(f"evt-{n}", f"rec-{n}", 1) for n in (1, 2, 3))))
    assert len(advance_lanes()) == 3
    results = run_concurrently([lambda i=i: execution.execution_claim(holder=f"worker-{i}", lease_seconds=60)
                                for i in range(8)])
    assert raised(results) == []
    tokens = [r for r in results if r is not None]
    assert len(tokens) == 3 and len({t.execution_pk for t in tokens}) == 3
    assert ExecutionAttempt.objects.count() == 3
    assert set(Execution.objects.values_list("attempt_count", flat=True)) == {1}
    assert {e.lease_holder for e in Execution.objects.all()} == {t.holder for t in tokens}


# -- Runtime result ------------------------------------------------------------------------------------------------

def test_repeated_run_returns_the_same_result_once(webhook_world):
    """Running the same claim twice returns the same completed Execution and Runtime result receipt; Runtime
    applied the CRM change once. Proves: CV2-08-001, CV2-08-005, CV2-08-010, CV2-08-012, CV2-15-017"""
    deliver(webhook_world, "records.webhook", webhook_body(webhook_event("evt-1", "rec-1", 1)))
    advance_lanes()
    token = execution.execution_claim(holder="w")
    first = execution.execution_run(token=token)
    second = execution.execution_run(token=token)
    assert (first.pk, first.state, bytes(first.runtime_receipt)) == (
        second.pk, second.state, bytes(second.runtime_receipt))
    assert ApplicationResult.objects.count() == 1 and CrmRecord.objects.get().version == 1


def test_result_lookup_with_another_execution_ref_fails_closed(webhook_world):
    """A command ID presented with a different ExecutionRef digest is a missing result: the query and a
    repeated apply both raise RuntimeResultMismatch and nothing is applied; an ApplicationResult is immutable
    and one per command. Proves: CV2-08-001, CV2-08-003, CV2-08-005, CV2-15-017"""
    deliver(webhook_world, "records.webhook", webhook_body(webhook_event("evt-1", "rec-1", 1)))
    advance_lanes()
    done = execution.execution_run(token=execution.execution_claim(holder="w"))
    assert runtime.runtime_result_get(command_id=done.command_id,
                                      execution_ref_digest=bytes(done.execution_ref_digest)) is not None
    with pytest.raises(runtime.RuntimeResultMismatch):
        runtime.runtime_result_get(command_id=done.command_id, execution_ref_digest=b"\x00" * 32)
    with pytest.raises(runtime.RuntimeResultMismatch):
        runtime.runtime_command_apply(command_id=done.command_id, execution_ref=bytes(done.execution_ref) + b"x",
                                      input=bytes(done.projection.input), account_id=done.account_id)
    assert runtime.runtime_result_get(command_id="cmd-unknown", execution_ref_digest=b"\x00" * 32) is None
    assert ApplicationResult.objects.count() == 1 and CrmRecord.objects.get().version == 1
    result = ApplicationResult.objects.get()
    with dbroles.as_admin(), pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE connector_applicationresult SET outcome='failed' WHERE id=%s", [result.pk])
    with pytest.raises(IntegrityError), transaction.atomic():
        ApplicationResult.objects.create(command_id=result.command_id, execution_ref_digest=b"\x01" * 32,
                                         outcome="applied", result_digest=b"\x01" * 32, receipt=b"x")
    assert hashlib.sha256(bytes(done.execution_ref)).digest() == bytes(result.execution_ref_digest)


def test_result_committed_before_local_completion_closes_from_the_receipt(webhook_world):
    """Runtime commits (the response is lost before the Connector records it); recording afterwards closes the
    same Execution from the stored result receipt without a second Runtime apply, and a later run by a worker
    changes nothing. Proves: CV2-08-008, CV2-08-010, CV2-08-011, CV2-08-012"""
    deliver(webhook_world, "records.webhook", webhook_body(webhook_event("evt-1", "rec-1", 4)))
    minted, = advance_lanes()
    token = execution.execution_claim(holder="w")
    receipt = runtime.runtime_command_apply(command_id=minted.command_id, execution_ref=bytes(minted.execution_ref),
                                            input=bytes(minted.projection.input), account_id=minted.account_id)
    record = CrmRecord.objects.get()
    assert record.version == 1 and Execution.objects.get(pk=minted.pk).state == ExecutionState.READY
    with mock.patch.object(runtime, "_apply_record", side_effect=AssertionError("applied twice")):
        done = execution.execution_record_result(execution_pk=minted.pk, command_id=receipt.command_id,
                                                 execution_ref_digest=receipt.execution_ref_digest)
        again = execution.execution_run(token=token)
    assert done.state == again.state == ExecutionState.COMPLETED
    assert bytes(done.runtime_receipt) == receipt.receipt
    assert CrmRecord.objects.get().version == 1 and ApplicationResult.objects.count() == 1
    assert Execution.objects.get(pk=minted.pk).lane.high_water == 4


def test_one_active_execution_generation_per_projection(webhook_world):
    """The database refuses a second active Execution generation of one Projection and a repeated generation
    number. Proves: CV2-15-016, CV2-07-008"""
    deliver(webhook_world, "records.webhook", webhook_body(webhook_event("evt-1", "rec-1", 1)))
    minted, = advance_lanes()
    fields = {"projection": minted.projection, "account": minted.account, "epoch": minted.epoch,
              "execution_ref": b"ref", "execution_ref_digest": b"\x00" * 32}
    with pytest.raises(IntegrityError, match="one_active_per_projection"), transaction.atomic():
        Execution.objects.create(generation=2, command_id="cmd-second", **fields)
    with pytest.raises(IntegrityError, match="unique_generation"), transaction.atomic():
        Execution.objects.create(generation=1, command_id="cmd-third", state="quarantined", **fields)
