"""The way out of a halted ordering lane, on real PostgreSQL: a GAP_DEADLINE halt resumes only by an operator
after the missing event arrived (or with authoritative evidence), under a new fence, and the late events apply
in order; a halt caused by a quarantined execution resumes through a replay of that execution, which runs first;
time never resumes anything; the board times a halt by the fact that caused it (D-192, D-193)."""
from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.contrib.auth.models import Group, User
from django.db import IntegrityError, transaction
from django.utils import timezone

from connector.actors import Actor
from connector.choices import ExecutionState, LaneState
from connector.errors import FenceStale, PermissionRefused, TransitionRefused
from connector.models import ApplicationResult, Execution, GapDecision, LaneResumption, Projection
from connector.selectors.lanes import lane_halt_fact, replay_outlook
from connector.services import execution, lanes, replay, runtime, sweeper
from governance import selectors
from tests.conformance.packs import PACK_B, variant
from tests.connector.inbound_helpers import build_inbound_world, deliver, drain, feed_body, feed_line, lane
from tests.dbroles import assert_append_only

SEQUENCED = "ledger.sequenced"


def later(seconds: int):
    return mock.patch("django.utils.timezone.now", return_value=timezone.now() + timedelta(seconds=seconds))


def send(world, seq: int, member: str = "mem-1", **kw) -> None:
    deliver(world, SEQUENCED, feed_body(feed_line(f"ln-{member}-{seq}", seq, member, **kw)))


def applied(member: str = "mem-1") -> list[int]:
    return [int(p) for p in Execution.objects.filter(projection__lane__partition=member, state="completed")
            .order_by("pk").values_list("projection__position", flat=True)]


def person(name: str, *groups: str) -> User:
    user = User.objects.create_user(name, password="pw")
    for group in groups:
        user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


@pytest.fixture
def operator(db):
    return Actor.for_user(person("oscar-operator", "operator"))


@pytest.fixture
def world(db):
    return build_inbound_world("lr-", [PACK_B])


def halt_at_gap(world) -> object:
    """1..4 applied, 6 arrives without 5, the frozen 30 s deadline passes: the lane halts (GAP_DEADLINE)."""
    for seq in (1, 2, 3, 4, 6):
        send(world, seq)
    drain()
    with later(31):
        assert sweeper.inbound_sweep(grace_seconds=0).gaps_decided == 1
    halted = lane(SEQUENCED, "mem-1")
    assert (halted.state, halted.halt_reason, halted.high_water) == (LaneState.HALTED, "GAP_DEADLINE", 4)
    return halted


def test_gap_halt_resumes_only_after_the_late_event_and_applies_5_6_7_once_in_order(world, operator):
    """Gap -> halt -> 7 arrives -> an operator's resume is refused while 5 is missing (nothing changes) -> 5
    arrives, and still nothing moves however much time passes -> the operator resumes with evidence under the
    fence the page showed: one LaneResumption, fence + 1, and the lane applies 5, 6, 7 once each, in order.
    Proves: CV2-13-001, CV2-13-002, CV2-13-005, CV2-06-013, CV2-06-029"""
    halted = halt_at_gap(world)
    send(world, 7)
    with pytest.raises(lanes.LaneGapOpen, match="position 5 has not arrived"):
        lanes.lane_resume(lane_pk=halted.pk, mode="missing_arrived", evidence="provider resent [T-1]",
                          actor=operator, expected_fence=halted.fence)
    assert lane(SEQUENCED, "mem-1").fence == halted.fence and not LaneResumption.objects.exists()
    send(world, 5)
    with later(3600):
        assert drain() == []
        sweeper.inbound_sweep(grace_seconds=0)
    assert lane(SEQUENCED, "mem-1").state == LaneState.HALTED and applied() == [1, 2, 3, 4]
    with pytest.raises(FenceStale):
        lanes.lane_resume(lane_pk=halted.pk, mode="missing_arrived", evidence="x [T-2]", actor=operator,
                          expected_fence=halted.fence - 1)
    resumption = lanes.lane_resume(lane_pk=halted.pk, mode="missing_arrived",
                                   evidence="provider resent sequence 5 [T-2]", actor=operator,
                                   expected_fence=halted.fence)
    assert (resumption.mode, resumption.halt_reason, resumption.blocking_position) == (
        "missing_arrived", "GAP_DEADLINE", 5)
    assert (resumption.fence_before, resumption.fence_after) == (halted.fence, halted.fence + 1)
    reopened = lane(SEQUENCED, "mem-1")
    assert (reopened.state, reopened.halt_reason, reopened.high_water, reopened.fence) == (
        LaneState.OPEN, "", 4, halted.fence + 1)
    with mock.patch.object(runtime, "runtime_command_apply", wraps=runtime.runtime_command_apply) as spy:
        drain()
    assert applied() == [1, 2, 3, 4, 5, 6, 7]
    assert spy.call_count == 3 and ApplicationResult.objects.count() == 7
    assert lane(SEQUENCED, "mem-1").high_water == 7


def test_a_resume_needs_the_permission_evidence_and_a_halt_it_remedies(world, operator):
    """An auditor may not resume; a resume without evidence, with an unknown mode, or of an open lane is refused
    and changes nothing. Proves: CV2-13-004"""
    halted = halt_at_gap(world)
    send(world, 5)
    with pytest.raises(PermissionRefused):
        lanes.lane_resume(lane_pk=halted.pk, mode="missing_arrived", evidence="x [T]",
                          actor=Actor.for_user(person("ann-auditor", "auditor")), expected_fence=halted.fence)
    with pytest.raises(lanes.LaneResumeRefused, match="evidence"):
        lanes.lane_resume(lane_pk=halted.pk, mode="missing_arrived", evidence="  ", actor=operator,
                          expected_fence=halted.fence)
    with pytest.raises(lanes.LaneResumeRefused, match="mode"):
        lanes.lane_resume(lane_pk=halted.pk, mode="timer", evidence="x", actor=operator, expected_fence=halted.fence)
    assert lane(SEQUENCED, "mem-1").fence == halted.fence and not LaneResumption.objects.exists()
    lanes.lane_resume(lane_pk=halted.pk, mode="missing_arrived", evidence="resent [T-3]", actor=operator,
                      expected_fence=halted.fence)
    with pytest.raises(TransitionRefused, match="only a halted lane"):
        lanes.lane_resume(lane_pk=halted.pk, mode="missing_arrived", evidence="again", actor=operator,
                          expected_fence=halted.fence + 1)


def test_skip_with_evidence_moves_the_lane_past_a_gap_that_will_never_fill(world, operator):
    """The provider confirms sequence 5 was never issued: the operator resumes with `skip_with_evidence`; a
    GapDecision records the skip, the high-water moves to 5 and 6 then applies. Proves: CV2-13-002"""
    halted = halt_at_gap(world)
    lanes.lane_resume(lane_pk=halted.pk, mode="skip_with_evidence", evidence="provider: 5 never issued [T-4]",
                      actor=operator, expected_fence=halted.fence)
    skip = GapDecision.objects.order_by("pk").last()
    assert (skip.disposition, skip.expected_position, skip.next_available) == ("operator_skip_with_evidence", 5, 6)
    assert lane(SEQUENCED, "mem-1").high_water == 5
    drain()
    assert applied() == [1, 2, 3, 4, 6]


def test_the_board_times_a_halt_by_the_fact_that_caused_it(world, operator):
    """The lane was created at 1's arrival; the board's "since" and alert deadline of its GAP_DEADLINE halt come
    from the GapDecision, and the item links to the lane's page with its remedy. Proves: CV2-13-001, CV2-13-007"""
    halted = halt_at_gap(world)
    decision = GapDecision.objects.get()
    item, = selectors.board()["GAP_DEADLINE"]
    assert item.since == decision.decided_at and item.since != halted.changed_at
    assert item.deadline == decision.decided_at + timedelta(minutes=60)
    assert item.decide_url == f"/queue/lane/{halted.pk}/" and item.remedy.kind == "resume_lane"
    assert item in selectors.queue()
    assert lane_halt_fact(halted).blocking_position == 5


# -- a lane halted by a quarantined execution ----------------------------------------------------------------------

@pytest.fixture
def failed(world):
    """2 fails in Runtime (a transient failure reported as `failed`): its execution is quarantined RESULT_FAILED
    and halts the strict lane; 3 arrives and waits."""
    send(world, 1)
    drain()
    original = runtime._apply_record
    with mock.patch.object(runtime, "_apply_record",
                           side_effect=lambda *a: "failed" if a[1] == "mem-1" else original(*a)):
        send(world, 2)
        drain()
    send(world, 3)
    assert drain() == []
    bad = Execution.objects.get(projection__position=2, projection__event__replay_request__isnull=True)
    assert (bad.state, bad.quarantine_reason) == (ExecutionState.QUARANTINED, "RESULT_FAILED")
    assert (lane(SEQUENCED, "mem-1").state, lane(SEQUENCED, "mem-1").halt_reason) == (LaneState.HALTED,
                                                                                      "RESULT_FAILED")
    return bad


def test_replay_of_the_failed_execution_runs_first_and_resumes_the_partition(failed, operator):
    """The high-water counts completed positions only, so the failed position 2 stays above it: the board
    recommends replay, the operator's replay runs as a new execution generation with external effects suppressed,
    the lane resumes under a new fence (a `replay` LaneResumption naming the request), 2 completes and 3 follows.
    The quarantined execution is untouched. Proves: CV2-06-014, CV2-06-025, CV2-09-015, CV2-09-017, CV2-13-003"""
    halted = lane(SEQUENCED, "mem-1")
    assert halted.high_water == 1
    outlook = replay_outlook(failed)
    assert outlook.runs and "resumes the halted partition" in outlook.why
    admission = replay.execution_replay(execution_pk=failed.pk, reason="runtime fixed [T-5]", actor=operator,
                                        expected_changed_at=failed.changed_at)
    resumption = LaneResumption.objects.get()
    assert (resumption.mode, resumption.replay_request_id, resumption.halt_reason) == (
        "replay", admission.request.pk, "RESULT_FAILED")
    drain()
    assert applied() == [1, 2, 3]
    rerun = Execution.objects.get(projection__event__replay_request=admission.request)
    assert rerun.state == "completed" and rerun.projection.suppress_external_effects
    assert rerun.generation == 1 and rerun.projection_id != failed.projection_id
    assert Execution.objects.get(pk=failed.pk).state == ExecutionState.QUARANTINED
    assert lane(SEQUENCED, "mem-1").high_water == 3
    again = replay.execution_replay(execution_pk=failed.pk, reason="double click", actor=operator,
                                    expected_changed_at=failed.changed_at)
    assert again.outcome == "duplicate" and again.request.pk == admission.request.pk


def test_skip_past_a_quarantined_execution_keeps_it_and_continues(failed, operator):
    """Instead of a replay, the source's evidence that 2 is obsolete lets the operator resume past it: the strict
    lane's high-water moves to 2, 3 applies, a replay of 2 would now be superseded, and neither the execution
    nor the lane waits on the board any more. Proves: CV2-13-002, CV2-13-003"""
    halted = lane(SEQUENCED, "mem-1")
    lanes.lane_resume(lane_pk=halted.pk, mode="skip_with_evidence", evidence="source: 2 superseded [T-6]",
                      actor=operator, expected_fence=halted.fence)
    drain()
    assert applied() == [1, 3]
    assert Execution.objects.get(pk=failed.pk).state == ExecutionState.QUARANTINED
    outlook = replay_outlook(Execution.objects.get(pk=failed.pk))
    assert not outlook.runs and "superseded" in outlook.why
    assert "RESULT_FAILED" not in selectors.board()  # remedied: the resumption passed it; nothing waits


def test_a_replay_while_another_halt_holds_the_lane_is_not_recommended(world, operator):
    """A quarantined execution whose lane is now halted by a gap: the board says a replay would not run yet."""
    send(world, 1)
    drain()
    with mock.patch.object(runtime, "_apply_record", return_value="failed"):
        send(world, 2)
        drain()
    bad = Execution.objects.get(projection__position=2)
    halted = lane(SEQUENCED, "mem-1")
    lanes.lane_resume(lane_pk=halted.pk, mode="skip_with_evidence", evidence="obsolete [T]", actor=operator,
                      expected_fence=halted.fence)
    send(world, 4)
    drain()
    with later(31):
        sweeper.inbound_sweep(grace_seconds=0)
    assert lane(SEQUENCED, "mem-1").halt_reason == "GAP_DEADLINE"
    outlook = replay_outlook(Execution.objects.get(pk=bad.pk))
    assert not outlook.runs


def test_postgres_keeps_lane_resumptions_append_only_and_fenced(world, operator):
    """Around the services: a resumption cannot be updated or deleted, and one that does not advance the fence by
    exactly one is refused by its CHECK. Proves: CV2-13-004"""
    halted = halt_at_gap(world)
    send(world, 5)
    row = lanes.lane_resume(lane_pk=halted.pk, mode="missing_arrived", evidence="resent [T]", actor=operator,
                            expected_fence=halted.fence)
    assert_append_only("connector_laneresumption", row.pk, "connector_laneresumption_append_only")
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        LaneResumption.objects.create(lane=halted, halt_reason="GAP_DEADLINE", mode="missing_arrived",
                                      blocking_position=5, fence_before=100, fence_after=102, evidence="x",
                                      actor="user:x")
    assert info.value.__cause__.diag.constraint_name == "connector_laneresumption_new_fence"
    assert Projection.objects.filter(lane=halted, lane_status="pending").count() == 2


def test_the_gap_deadline_default_is_frozen_in_the_route(db):
    """A strict route without `gap_deadline_seconds` waits the documented default (300 s) before its frozen
    disposition applies. Proves: CV2-06-005"""
    ordering = {k: v for k, v in PACK_B["routes"][SEQUENCED]["ordering"].items() if k != "gap_deadline_seconds"}
    pack = variant(PACK_B, SEQUENCED, ordering=None)
    pack["routes"][SEQUENCED]["ordering"] = ordering
    world = build_inbound_world("gd-", [pack])
    send(world, 1)
    send(world, 3)
    drain()
    with later(299):
        assert sweeper.inbound_sweep(grace_seconds=0).gaps_decided == 0
    with later(301):
        assert sweeper.inbound_sweep(grace_seconds=0).gaps_decided == 1
    assert GapDecision.objects.get().disposition == "quarantine_partition"
