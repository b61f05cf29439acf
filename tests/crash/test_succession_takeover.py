"""A V2 -> V2 successor coordinator SIGKILLed at every barrier boundary of succession, recovered by a second
coordinator through ONE holder-fenced takeover of the same barrier set (D-133): the outcome equals an uncrashed
run's, the crashed holder's every later act is refused with FENCE_STALE and changes nothing, and time passing
releases nothing."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

from connector.actors import Actor
from connector.choices import EpochState, GateMode
from connector.errors import FenceStale
from connector.models import AccountServingGate, AuditRecord, OrderingLane, ServingEpoch
from cutover.choices import BarrierSetState
from cutover.models import OrderingHandoff, ServingPublicationBarrierSet, SuccessionDrain
from cutover.services import succession, succession_drain, succession_handoffs, succession_phases
from cutover.services import succession_recovery as recovery
from cutover.services.fencing import barrier_set_takeover
from tests.crash.support import DB, assert_killed
from tests.cutover.succession_helpers import build_succession_world, drain, send

A, B = "coordinator-a", "coordinator-b"
ACTOR = Actor.system("takeover-test")
# Every barrier boundary of the coordinator (cutover.services.succession_recovery.succession_run), with the set's
# state the crash leaves; None is the uncrashed run.
BOUNDARIES = {
    None: None,
    "succession.after_acquire": BarrierSetState.ACQUIRING,
    "succession.after_hold": BarrierSetState.HELD,
    "succession.drain_open_before_commit": BarrierSetState.HELD,
    "succession.drain_complete_before_commit": BarrierSetState.HELD,
    "succession.after_drain": BarrierSetState.HELD,
    "succession.after_halt": BarrierSetState.HELD,
    "succession.after_handoff_chunk": BarrierSetState.HELD,
    "succession.before_commit": BarrierSetState.HELD,
    "succession.after_commit": BarrierSetState.ACTIVATION_COMMITTED,
}
COORDINATOR = """
from connector.actors import Actor
from cutover.services.succession_recovery import succession_run
result = succession_run(predecessor_epoch_id=ARGS["predecessor"], successor_epoch_id=ARGS["successor"],
                        holder=ARGS["holder"], actor=Actor.system("coordinator"))
emit(state=result.set_state, stopped_at=result.stopped_at, blocked_by=result.blocked_by)
"""


def ready_world(prefix: str):
    """Two accounts, one lane each with applied work (high-waters 100 and 3), everything terminal."""
    world = build_succession_world(prefix)
    send(world, "evt-100", 100)
    send(world, "evt-3", 3, record="rec-2", account=world.accounts[1])
    drain()
    return world


def the_set(world) -> ServingPublicationBarrierSet:
    rows = list(ServingPublicationBarrierSet.objects.filter(predecessor_epoch=world.epoch))
    assert len(rows) == 1, rows  # recovery never acquires a second set
    return rows[0]


def outcome(world) -> dict:
    """Everything a finished succession leaves, as stored."""
    row = the_set(world)
    return {
        "epochs": dict(ServingEpoch.objects.filter(pk__in=[world.epoch.pk, world.successor.pk])
                       .values_list("epoch_id", "state")),
        "gates": set(AccountServingGate.objects.filter(account__in=world.accounts)
                     .values_list("account__account_key", "mode", "epoch__epoch_id")),
        "handoffs": sorted((h.route, h.partition, h.high_water, h.successor_lane.baseline, h.successor_lane.high_water)
                           for h in OrderingHandoff.objects.filter(barrier_set=row).select_related("successor_lane")),
        "lanes": OrderingLane.objects.filter(epoch=world.epoch).count(),
        "set": row.state,
        "drain": SuccessionDrain.objects.get(barrier_set=row).state,
    }


def expected(world) -> dict:
    keys = [a.account_key for a in world.accounts]
    return {
        "epochs": {world.epoch.epoch_id: EpochState.DRAINING, world.successor.epoch_id: EpochState.ACTIVE},
        "gates": {(k, GateMode.V2_SERVING, world.successor.epoch_id) for k in keys},
        "handoffs": sorted([("records.webhook", "rec-1", 100, 100, 100), ("records.webhook", "rec-2", 3, 3, 3)]),
        "lanes": 2, "set": BarrierSetState.RELEASED, "drain": "released",
    }


def takeovers(row) -> int:
    return AuditRecord.objects.filter(entity_type=ServingPublicationBarrierSet._meta.label, entity_id=str(row.pk),
                                      action="barrier_set_takeover").count()


def stale_holder_is_refused(world, before: ServingPublicationBarrierSet, stale_fence: int) -> None:
    """Every act of the taken-over holder fails with FENCE_STALE and changes nothing."""
    pk = before.pk
    lanes = list(OrderingLane.objects.filter(epoch=world.epoch).values_list("pk", flat=True))
    attempts = {
        "acquire": lambda: succession.barrier_set_acquire(predecessor_epoch_id=world.epoch.epoch_id,
                                                          successor_epoch_id=world.successor.epoch_id, holder=A,
                                                          actor=ACTOR),
        "hold": lambda: succession.barrier_set_hold(barrier_set_pk=pk, expected_fence=stale_fence, holder=A,
                                                    actor=ACTOR),
        "drain": lambda: succession_drain.succession_drain_open(barrier_set_pk=pk, holder=A, actor=ACTOR),
        "halt": lambda: succession_phases.halt_drained(barrier_set=before, holder=A, actor=ACTOR),
        "handoff": lambda: succession_handoffs.handoff_chunk(barrier_set_pk=pk, lane_pks=lanes, holder=A,
                                                             actor=ACTOR),
        "activate": lambda: succession.successor_activate(barrier_set_pk=pk, expected_fence=stale_fence, holder=A,
                                                          actor=ACTOR),
        "release": lambda: succession.barrier_set_release(barrier_set_pk=pk, expected_fence=stale_fence, holder=A,
                                                          reason="stale coordinator", actor=ACTOR),
        "release by fence": lambda: succession.barrier_set_release(barrier_set_pk=pk, expected_fence=stale_fence,
                                                                   reason="stale fence", actor=ACTOR),
    }
    for name, attempt in attempts.items():
        with pytest.raises(FenceStale):
            attempt()
            pytest.fail(f"the stale holder's {name} was not refused")
    after = ServingPublicationBarrierSet.objects.get(pk=pk)
    assert (after.state, after.fence, after.holder) == (before.state, before.fence, before.holder)


@pytest.mark.django_db(**DB)
@pytest.mark.parametrize("point", list(BOUNDARIES))
def test_a_coordinator_killed_at_every_barrier_boundary_is_taken_over_by_a_new_holder(point, run_child, child_env):
    """The coordinator (acquire, hold, drain, halt, handoffs in chunks of one account, activate, release) runs in a
    real process SIGKILLed at each barrier boundary; the set is left open under holder A in the state the boundary
    says. A second coordinator B takes over the SAME set by one holder-fenced step (same pk and state, fence + 1,
    one takeover audit row), after which A's acquire, hold, drain, halt, handoff, activation and release all fail
    with FENCE_STALE and change nothing; B resumes as the set's local state says (`held`: the remaining phases;
    `activation_committed`: readback, then release). The end state equals the uncrashed run's: predecessor
    draining, successor active, every gate v2_serving on it, one handoff per lane at its frozen high-water, the
    set and its drain released. Proves: issue 42 item 1, CV2-11-049, CV2-11-056"""
    world = ready_world("tk-")
    child_env["CONNECTOR_HALT_CHUNK_ACCOUNTS"] = "1"  # two handoff chunks: a boundary after the first (the cutoff)
    run = run_child(COORDINATOR, point, predecessor=world.epoch.epoch_id, successor=world.successor.epoch_id,
                    holder=A)
    if point is None:
        assert run.returncode == 0, run.stderr
        assert outcome(world) == expected(world)
        assert takeovers(the_set(world)) == 0
        return
    assert_killed(run)
    crashed = the_set(world)
    assert (crashed.holder, crashed.state) == (A, BOUNDARIES[point])
    if point == "succession.after_handoff_chunk":
        assert OrderingHandoff.objects.filter(barrier_set=crashed).count() == 1

    taken = barrier_set_takeover(barrier_set_pk=crashed.pk, holder=B, actor=ACTOR)
    assert (taken.pk, taken.holder, taken.state, taken.fence) == (crashed.pk, B, crashed.state, crashed.fence + 1)
    stale_holder_is_refused(world, taken, crashed.fence)

    result = recovery.succession_resume(predecessor_epoch_id=world.epoch.epoch_id, holder=B, actor=ACTOR)
    assert (result.barrier_set_pk, result.holder, result.stopped_at) == (crashed.pk, B, None), result
    assert outcome(world) == expected(world)
    assert takeovers(the_set(world)) == 1  # idempotent for its holder: one takeover, not one per call
    with pytest.raises(FenceStale):
        succession.successor_activate(barrier_set_pk=crashed.pk, expected_fence=None, holder=A, actor=ACTOR)


@pytest.mark.django_db(**DB)
def test_elapsed_time_never_releases_a_crashed_coordinators_set(run_child):
    """A set left `held` by a killed coordinator and aged ten years is exactly as held: an owner publication is
    still refused, the coordinator's own rerun with another identity is refused, and only the takeover and the
    remaining phases (or an explicit fenced release) end it. Proves: issue 42 item 1, CV2-11-056"""
    from connector.services import owners
    from cutover.errors import PublicationBarrierHeld
    from tests import dbroles

    world = ready_world("tt-")
    assert_killed(run_child(COORDINATOR, "succession.after_halt", predecessor=world.epoch.epoch_id,
                            successor=world.successor.epoch_id, holder=A))
    row = the_set(world)
    with connections["default"].cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE cutover_servingpublicationbarrierset SET created_at = created_at - interval '10 years',"
                       " changed_at = changed_at - interval '10 years' WHERE id = %s", [row.pk])
        cursor.execute("SET session_replication_role = origin")
        dbroles.admin_off(cursor)

    def publish():
        owners.credential_generation_create(
            generation_id="late.g1", credential_identity="crm-api", account_key=world.accounts[0].account_key,
            secret=b"s" * 16, transport_config={"base_url": "http://127.0.0.1:1", "auth": "bearer"}, actor=ACTOR)

    with pytest.raises(PublicationBarrierHeld):
        publish()
    aged = the_set(world)
    assert (aged.state, aged.holder, aged.fence) == (BarrierSetState.HELD, A, row.fence)
    assert set(AccountServingGate.objects.filter(account__in=world.accounts).values_list("mode", flat=True)) == \
        {GateMode.V2_HALTED}
    result = recovery.succession_resume(predecessor_epoch_id=world.epoch.epoch_id, holder=B, actor=ACTOR)
    assert result.set_state == BarrierSetState.RELEASED and outcome(world) == expected(world)


@pytest.mark.django_db(**DB)
def test_the_operator_takes_over_from_the_command_line(run_child):
    """`manage.py succession takeover --holder B` takes the crashed coordinator's set over; the crashed holder's
    `activate` is refused with FENCE_STALE; `takeover --resume` finishes the succession. Proves: issue 42 item 1"""
    from io import StringIO

    world = ready_world("tc-")
    assert_killed(run_child(COORDINATOR, "succession.after_handoff_chunk", predecessor=world.epoch.epoch_id,
                            successor=world.successor.epoch_id, holder=A))
    out = StringIO()
    call_command("succession", "takeover", "--predecessor", world.epoch.epoch_id, "--holder", B, stdout=out)
    assert f"held by {B}" in out.getvalue()
    with pytest.raises(CommandError, match="FENCE_STALE"):
        call_command("succession", "activate", "--predecessor", world.epoch.epoch_id, "--holder", A,
                     stdout=StringIO())
    call_command("succession", "takeover", "--predecessor", world.epoch.epoch_id, "--holder", B, "--resume",
                 stdout=out)
    assert "the successor serves" in out.getvalue()
    assert outcome(world) == expected(world)
    assert takeovers(the_set(world)) == 1
