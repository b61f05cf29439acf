"""V2 -> V2 successor activation (requires_drain only) on real PostgreSQL: the barrier set, the per-lane
OrderingHandoff, the one activation transaction, the forward-only cutoff, and the database rules behind them."""
from __future__ import annotations

from unittest import mock

import pytest
from django.db import IntegrityError, connection, transaction

from connector.choices import EpochState, ExecutionState, GateMode, LaneState
from connector.errors import FenceStale, TransitionRefused
from connector.models import AccountServingGate, AuditRecord, Execution, OrderingLane, SupersededDecision
from connector.services import execution, runtime, serving
from connector.services import gates as gate_services
from cutover.choices import BarrierSetState
from cutover.errors import (
    BarrierSetRefused,
    HandoffRefused,
    SuccessorActivationRefused,
    SuccessorClassUnsupported,
    SuccessorDrifted,
)
from cutover.models import OrderingHandoff, ServingPublicationBarrierSet
from cutover.services import succession
from tests.connector.inbound_helpers import advance_lanes, drain, run_ready
from tests import dbroles
from tests.cutover.succession_helpers import (
    ACTOR,
    WEBHOOK,
    build_succession_world,
    gate_modes,
    halt_all,
    handoff_all,
    held_barrier,
    resume_all,
    send,
    state_of,
)


@pytest.fixture
def sworld(db):
    return build_succession_world("sa-")


def lane_of(epoch, partition: str = "rec-1") -> OrderingLane:
    return OrderingLane.objects.get(epoch=epoch, route=WEBHOOK, partition=partition)


def test_activation_moves_barrier_epochs_and_gates_together(sworld):
    """With every gate v2_halted, a held barrier set and one handoff per predecessor lane, the one activation
    transaction records barrier `held -> activation_committed`, predecessor `active -> draining`, successor
    `verified -> active`, and every gate `v2_halted -> v2_serving` naming the successor ID and digest with a new
    fence. Proves: CV2-11-023, CV2-11-024, CV2-11-027, CV2-11-029, CV2-11-015"""
    send(sworld, "evt-100", 100)
    send(sworld, "evt-7", 7, record="rec-2", account=sworld.accounts[1])
    drain()
    halt_all(sworld)
    barrier = held_barrier(sworld)
    assert barrier.state == BarrierSetState.HELD and barrier.owner_receipts_digest is not None
    handoffs = handoff_all(sworld, barrier)
    assert len(handoffs) == 2
    fences = dict(AccountServingGate.objects.values_list("account_id", "fence"))
    successor = succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert successor.state == EpochState.ACTIVE
    sworld.epoch.refresh_from_db()
    assert sworld.epoch.state == EpochState.DRAINING
    barrier.refresh_from_db()
    assert barrier.state == BarrierSetState.ACTIVATION_COMMITTED
    for account in sworld.accounts:
        gate = AccountServingGate.objects.get(account=account)
        assert (gate.mode, gate.epoch_id, bytes(gate.epoch_digest)) == (GateMode.V2_SERVING, successor.pk,
                                                                        bytes(successor.digest))
        assert gate.fence == fences[account.pk] + 1
    assert AuditRecord.objects.filter(action__in=["successor_activate", "gate_activate_successor"]).count() == 5
    # one audit row per gate, in account order, as the per-gate path wrote them (set-based since D-210)
    gates = list(AccountServingGate.objects.filter(account__in=sworld.accounts).order_by("account_id"))
    assert [(r.actor, r.entity_type, r.entity_id, r.from_state, r.to_state, r.fence, bytes(r.evidence_digest))
            for r in AuditRecord.objects.filter(action="gate_activate_successor").order_by("pk")] == [
        (str(ACTOR), "connector.AccountServingGate", str(g.pk), GateMode.V2_HALTED, GateMode.V2_SERVING, g.fence,
         bytes(successor.digest)) for g in gates]
    # Idempotent: a resumed coordinator gets the same outcome and writes nothing more.
    assert succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=None, actor=ACTOR).pk == successor.pk
    released = succession.barrier_set_release(barrier_set_pk=barrier.pk, expected_fence=barrier.fence,
                                              reason="readback verified", actor=ACTOR)
    assert released.state == BarrierSetState.RELEASED


def test_position_99_after_handoff_at_100_is_superseded_in_the_successor(sworld):
    """A predecessor lane ending at 100 stages its successor lane with baseline and high-water 100; after
    activation, successor input at position 99 is superseded without an Execution or a Runtime call, and 101
    executes. Proves: CV2-11-018, CV2-11-052, CV2-11-015"""
    send(sworld, "evt-100", 100)
    drain()
    halt_all(sworld)
    barrier = held_barrier(sworld)
    handoff, = handoff_all(sworld, barrier)
    assert handoff.high_water == 100 and bytes(handoff.high_water_tie) == b"evt-100"
    staged = handoff.successor_lane
    assert (staged.epoch_id, staged.baseline, staged.high_water, staged.baseline_origin) == (
        sworld.successor.pk, 100, 100, "ordering_handoff")
    succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    with mock.patch.object(runtime, "runtime_command_apply", wraps=runtime.runtime_command_apply) as spy:
        send(sworld, "evt-99", 99)
        assert advance_lanes() == [] and run_ready() == []
        assert spy.call_count == 0
    lane = lane_of(sworld.successor)
    assert lane.pk == staged.pk
    assert SupersededDecision.objects.get(lane=lane).position == 99
    assert not Execution.objects.filter(projection__position=99).exists()
    send(sworld, "evt-101", 101)
    done = drain()
    assert [e.state for e in done] == [ExecutionState.COMPLETED] and lane_of(sworld.successor).high_water == 101
    from connector.selectors.invariants import invariant_check

    report = invariant_check()
    assert report.ok, report.as_text()


@pytest.mark.parametrize("failure", ["gate_not_halted", "missing_handoff", "successor_rejected", "owner_drift",
                                     "stale_fence"])
def test_activation_refusal_moves_nothing(sworld, failure):
    """A gate not v2_halted, a predecessor lane without its handoff, a successor no longer the exact verified
    epoch (rejected, or its owners changed), or a stale holder fence refuses the whole activation: the barrier
    set stays `held`, the predecessor `active`, the successor as it was, every gate and fence unchanged.
    Proves: CV2-11-023, CV2-11-024, CV2-11-057, CV2-11-036, CV2-11-045"""
    send(sworld, "evt-1", 1)
    send(sworld, "evt-2", 2, record="rec-2")
    drain()
    if failure == "gate_not_halted":
        halt_all(sworld)
        barrier = held_barrier(sworld)
        handoff_all(sworld, barrier)
        # Only corruption can move a gate after the cutoff; the activation must still refuse it.
        with connection.cursor() as cursor:
            dbroles.admin_on(cursor)
            cursor.execute("SET session_replication_role = replica")
            cursor.execute("UPDATE connector_accountservinggate SET mode = 'halting_v2' WHERE account_id = %s",
                           [sworld.accounts[1].pk])
            cursor.execute("SET session_replication_role = DEFAULT")
            dbroles.admin_off(cursor)
        expected = SuccessorActivationRefused
    else:
        halt_all(sworld)
        barrier = held_barrier(sworld)
        lanes = handoff_all(sworld, barrier) if failure != "missing_handoff" else [
            succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane_of(sworld.epoch).pk, actor=ACTOR)]
        assert lanes
        expected = {"missing_handoff": SuccessorActivationRefused, "successor_rejected": SuccessorDrifted,
                    "owner_drift": SuccessorDrifted, "stale_fence": FenceStale}[failure]
        if failure == "successor_rejected":
            serving.epoch_reject(epoch_pk=sworld.successor.pk, reason="abandoned", actor=ACTOR)
        if failure == "owner_drift":
            # Owner writes are refused while the set is held and the hold reread them under its locks (D-285):
            # only corruption can change the successor's frozen owner receipts now; the activation still refuses.
            with connection.cursor() as cursor:
                dbroles.admin_on(cursor)
                cursor.execute("SET session_replication_role = replica")
                cursor.execute("UPDATE connector_servingepochcredentialproof SET owner_receipt_digest = %s "
                               "WHERE id = (SELECT min(id) FROM connector_servingepochcredentialproof "
                               "WHERE epoch_id = %s)", [b"\x00" * 32, sworld.successor.pk])
                cursor.execute("SET session_replication_role = DEFAULT")
                dbroles.admin_off(cursor)
    before = state_of(sworld)
    audits = AuditRecord.objects.count()
    fence = barrier.fence - 1 if failure == "stale_fence" else barrier.fence
    with pytest.raises(expected):
        succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=fence, actor=ACTOR)
    assert state_of(sworld) == before
    assert AuditRecord.objects.count() == audits
    assert ServingPublicationBarrierSet.objects.get(pk=barrier.pk).state == BarrierSetState.HELD


def test_handoff_is_refused_while_a_nonterminal_execution_exists(sworld):
    """A claimed predecessor execution still `ready` refuses the handoff (nothing written: no handoff, no
    successor lane, lane fence unchanged); once its result is recorded (local finalization in v2_halted) the
    handoff freezes the high-water including it and advances the lane fence. Proves: CV2-11-014, CV2-11-046,
    CV2-11-050, CV2-11-006"""
    send(sworld, "evt-100", 100)
    minted, = advance_lanes()
    token = execution.execution_claim(holder="w1")
    halt_all(sworld)
    barrier = held_barrier(sworld)
    lane = lane_of(sworld.epoch)
    with pytest.raises(HandoffRefused, match="nonterminal execution"):
        succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane.pk, actor=ACTOR)
    assert not OrderingHandoff.objects.exists() and not OrderingLane.objects.filter(epoch=sworld.successor).exists()
    assert lane_of(sworld.epoch).fence == lane.fence
    assert execution.execution_run(token=token).state == ExecutionState.COMPLETED
    completed_fence = lane_of(sworld.epoch).fence
    handoff = succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane.pk, actor=ACTOR)
    frozen = lane_of(sworld.epoch)
    assert handoff.high_water == 100 and frozen.fence == completed_fence + 1 == handoff.predecessor_lane_fence
    assert (frozen.state, frozen.halt_reason) == (LaneState.HALTED, "ORDERING_HANDOFF")
    # Idempotent and immutable.
    assert succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane.pk, actor=ACTOR).pk == handoff.pk
    with dbroles.as_admin(), pytest.raises(IntegrityError), transaction.atomic():
        OrderingHandoff.objects.filter(pk=handoff.pk).update(high_water=99)


def test_handoff_requires_every_gate_halted_and_a_held_barrier(sworld):
    """A handoff runs only under a held barrier set and with every gate v2_halted on the predecessor.
    Proves: CV2-11-011, CV2-11-013, CV2-11-014"""
    send(sworld, "evt-1", 1)
    drain()
    row = succession.barrier_set_acquire(predecessor_epoch_id=sworld.epoch.epoch_id,
                                         successor_epoch_id=sworld.successor.epoch_id, holder="c", actor=ACTOR)
    lane = lane_of(sworld.epoch)
    with pytest.raises(HandoffRefused, match="held barrier set"):
        succession.ordering_handoff(barrier_set_pk=row.pk, lane_pk=lane.pk, actor=ACTOR)
    row = succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=ACTOR)
    with pytest.raises(HandoffRefused, match="v2_halted"):
        succession.ordering_handoff(barrier_set_pk=row.pk, lane_pk=lane.pk, actor=ACTOR)
    assert not OrderingHandoff.objects.exists()


def test_predecessor_resume_allowed_before_first_handoff_refused_after(sworld):
    """Before any handoff a failed successor attempt releases its held barrier set and the gates resume the
    predecessor; once the first handoff commits every predecessor resume is refused, and only the successor
    activation brings the gates back to v2_serving. Proves: CV2-11-019, CV2-11-020, CV2-11-047, CV2-11-051,
    CV2-03-011, CV2-03-012"""
    send(sworld, "evt-1", 1)
    drain()
    halt_all(sworld)
    barrier = held_barrier(sworld)
    succession.barrier_set_release(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, reason="abort",
                                   actor=ACTOR)
    resume_all(sworld)
    assert gate_modes(sworld) == {GateMode.V2_SERVING}

    halt_all(sworld)
    barrier = held_barrier(sworld)
    handoff_all(sworld, barrier)
    for account in sworld.accounts:
        with pytest.raises(TransitionRefused, match="OrderingHandoff"):
            gate_services.gate_transition(account_id=account.pk, action="resume_predecessor", expected_fence=None,
                                          actor=ACTOR)
    assert gate_modes(sworld) == {GateMode.V2_HALTED}
    succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert gate_modes(sworld) == {GateMode.V2_SERVING}


def test_barrier_release_rules(sworld):
    """`acquiring -> released` always; `held -> released` before any handoff; after the first handoff only as a
    replacement while every gate stays v2_halted; `activation_committed -> released` after readback; `released`
    is terminal; a stale fence is refused; the database refuses edges outside the table.
    Proves: CV2-11-028, CV2-11-030, CV2-11-031, CV2-11-032, CV2-11-038, CV2-11-039, CV2-11-044, CV2-11-045"""
    send(sworld, "evt-1", 1)
    drain()
    row = succession.barrier_set_acquire(predecessor_epoch_id=sworld.epoch.epoch_id,
                                         successor_epoch_id=sworld.successor.epoch_id, holder="c", actor=ACTOR)
    with pytest.raises(FenceStale, match="held by 'c', not 'other'"):  # only its holder acts on it (D-133)
        succession.barrier_set_acquire(predecessor_epoch_id=sworld.epoch.epoch_id,
                                       successor_epoch_id=sworld.successor.epoch_id, holder="other", actor=ACTOR)
    with pytest.raises(FenceStale):
        succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence + 5, reason="x", actor=ACTOR)
    row = succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence, reason="x", actor=ACTOR)
    assert row.state == BarrierSetState.RELEASED
    with pytest.raises(BarrierSetRefused, match="terminal"):
        succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=None, reason="again", actor=ACTOR)
    with pytest.raises(IntegrityError), transaction.atomic():
        ServingPublicationBarrierSet.objects.filter(pk=row.pk).update(state="held", fence=row.fence + 1)

    halt_all(sworld)
    barrier = held_barrier(sworld)
    handoff_all(sworld, barrier)
    with pytest.raises(BarrierSetRefused, match="replace"):
        succession.barrier_set_release(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, reason="abort",
                                       actor=ACTOR)
    replaced = succession.barrier_set_release(barrier_set_pk=barrier.pk, expected_fence=barrier.fence,
                                              reason="replace candidate", replacement=True, actor=ACTOR)
    assert replaced.state == BarrierSetState.RELEASED and gate_modes(sworld) == {GateMode.V2_HALTED}

    # A new barrier set for the same successor completes the activation from the frozen handoffs.
    again = held_barrier(sworld)
    succession.successor_activate(barrier_set_pk=again.pk, expected_fence=again.fence, actor=ACTOR)
    again.refresh_from_db()
    done = succession.barrier_set_release(barrier_set_pk=again.pk, expected_fence=again.fence, reason="readback ok",
                                          actor=ACTOR)
    assert done.state == BarrierSetState.RELEASED


@pytest.mark.parametrize("klass", ["online_compatible", "compatible_hot_swap"])
def test_successor_classes_other_than_requires_drain_are_refused(sworld, klass):
    """Every successor class other than requires_drain is refused whatever compatibility evidence is supplied,
    and the database refuses such a barrier set too. Proves: CV2-11-002, CV2-11-003, CV2-11-058"""
    with pytest.raises(SuccessorClassUnsupported):
        succession.barrier_set_acquire(predecessor_epoch_id=sworld.epoch.epoch_id,
                                       successor_epoch_id=sworld.successor.epoch_id, holder="c", actor=ACTOR,
                                       successor_class=klass, compatibility_evidence={"proof": "all fields equal"})
    assert not ServingPublicationBarrierSet.objects.exists()
    with pytest.raises(IntegrityError), transaction.atomic():
        ServingPublicationBarrierSet.objects.create(
            predecessor_epoch=sworld.epoch, predecessor_digest=bytes(sworld.epoch.digest),
            successor_epoch=sworld.successor, successor_key=sworld.successor.epoch_id,
            successor_digest=bytes(sworld.successor.digest), scope_digest=b"\0" * 32, successor_class=klass,
            holder="c")


def test_changed_partition_derivation_refuses_the_handoff(sworld):
    """A successor whose route derives the partition (or comparator) differently has no total L1 transformation
    with a snapshot barrier: its handoff is refused, nothing is frozen or staged, and activation cannot proceed.
    Proves: CV2-11-016, CV2-11-052"""
    from tests.cutover.succession_helpers import build_changed_successor

    send(sworld, "evt-100", 100)
    drain()
    changed = build_changed_successor(sworld, epoch_key="epoch-3", ordering_patch={"partition": "/evt_type"})
    assert changed.state == EpochState.VERIFIED
    sworld.successor = changed
    halt_all(sworld)
    barrier = held_barrier(sworld)
    lane = lane_of(sworld.epoch)
    with pytest.raises(HandoffRefused, match="comparator or partition"):
        succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane.pk, actor=ACTOR)
    assert not OrderingHandoff.objects.exists()
    assert lane_of(sworld.epoch).fence == lane.fence and lane_of(sworld.epoch).state == LaneState.OPEN
    with pytest.raises(SuccessorActivationRefused, match="no OrderingHandoff"):
        succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)


def test_owner_change_after_verification_refuses_hold_and_activation(sworld):
    """While the barrier set is held, an owner publication (a new Catalog view revision) is refused and nothing
    moves; once the set is released the owners publish, and holding a new set for the old successor (which
    rereads the owners) is refused. Proves: CV2-11-013, CV2-11-035, CV2-11-057, CV2-12-064"""
    from cutover.errors import PublicationBarrierHeld
    from tests.cutover.succession_helpers import build_changed_successor

    halt_all(sworld)
    row = succession.barrier_set_acquire(predecessor_epoch_id=sworld.epoch.epoch_id,
                                         successor_epoch_id=sworld.successor.epoch_id, holder="c", actor=ACTOR)
    held = succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=ACTOR)
    before = state_of(sworld)
    with pytest.raises(PublicationBarrierHeld):
        build_changed_successor(sworld, epoch_key="epoch-3", ordering_patch={"tie_breaker": "/evt_type"})
    assert state_of(sworld) == before
    succession.barrier_set_release(barrier_set_pk=held.pk, expected_fence=held.fence, reason="owner change",
                                   actor=ACTOR)
    build_changed_successor(sworld, epoch_key="epoch-3", ordering_patch={"tie_breaker": "/evt_type"})
    again = succession.barrier_set_acquire(predecessor_epoch_id=sworld.epoch.epoch_id,
                                           successor_epoch_id=sworld.successor.epoch_id, holder="c", actor=ACTOR)
    with pytest.raises(SuccessorDrifted, match="owners changed"):
        succession.barrier_set_hold(barrier_set_pk=again.pk, expected_fence=again.fence, actor=ACTOR)
    assert ServingPublicationBarrierSet.objects.get(pk=again.pk).state == BarrierSetState.ACQUIRING


def test_replacement_successor_after_the_cutoff_derives_from_the_frozen_high_water(sworld):
    """After the first handoff the candidate is abandoned: the barrier set is released as a replacement while the
    gates stay halted, the candidate is rejected, and a newly verified successor gets handoffs that copy the
    frozen high-water and lane fence and cite the abandoned handoff; the predecessor lane is not touched again,
    the predecessor is never resumed, and the replacement activates with position 99 superseded.
    Proves: CV2-11-021, CV2-11-022, CV2-11-047, CV2-11-051"""
    send(sworld, "evt-100", 100)
    drain()
    halt_all(sworld)
    first = held_barrier(sworld)
    abandoned, = handoff_all(sworld, first)
    frozen = lane_of(sworld.epoch)
    succession.barrier_set_release(barrier_set_pk=first.pk, expected_fence=first.fence, reason="candidate failed",
                                   replacement=True, actor=ACTOR)
    sworld.successor = serving.epoch_verify(epoch_pk=serving.epoch_prepare_from_owners(
        epoch_id="sa-epoch-3", configuration_generation_id=sworld.configuration.generation_id, actor=ACTOR).pk,
        actor=ACTOR)
    barrier = held_barrier(sworld)
    with pytest.raises(HandoffRefused, match="not rejected"):
        succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=frozen.pk, actor=ACTOR)
    serving.epoch_reject(epoch_pk=abandoned.successor_epoch_id, reason="abandoned after the cutoff", actor=ACTOR)
    derived = succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=frozen.pk, actor=ACTOR)
    assert derived.derived_from_id == abandoned.pk
    assert (derived.high_water, derived.predecessor_lane_fence) == (100, abandoned.predecessor_lane_fence)
    assert lane_of(sworld.epoch).fence == frozen.fence
    with pytest.raises(TransitionRefused):
        gate_services.gate_transition(account_id=sworld.accounts[0].pk, action="resume_predecessor",
                                      expected_fence=None, actor=ACTOR)
    succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert gate_modes(sworld) == {GateMode.V2_SERVING}
    send(sworld, "evt-99", 99)
    assert advance_lanes() == []
    assert SupersededDecision.objects.get(lane__epoch=sworld.successor).position == 99


def test_a_succession_above_the_declared_maximum_is_refused_before_anything_is_written(sworld, settings):
    """An account set larger than CONNECTOR["ACTIVATION_MAX_ACCOUNTS"] refuses the barrier set (none is written)
    and, lowered after the set is held, the activation transaction: nothing moves. (D-210)"""
    from connector.errors import ActivationCardinalityExceeded

    halt_all(sworld)
    limit = settings.CONNECTOR["ACTIVATION_MAX_ACCOUNTS"]
    settings.CONNECTOR = {**settings.CONNECTOR, "ACTIVATION_MAX_ACCOUNTS": 1}
    with pytest.raises(ActivationCardinalityExceeded, match="names 2 accounts; the declared maximum is 1"):
        held_barrier(sworld)
    assert not ServingPublicationBarrierSet.objects.exists()
    settings.CONNECTOR = {**settings.CONNECTOR, "ACTIVATION_MAX_ACCOUNTS": limit}
    barrier = held_barrier(sworld)
    handoff_all(sworld, barrier)
    before = state_of(sworld)
    settings.CONNECTOR = {**settings.CONNECTOR, "ACTIVATION_MAX_ACCOUNTS": 1}
    with pytest.raises(ActivationCardinalityExceeded):
        succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert state_of(sworld) == before
    assert not AuditRecord.objects.filter(action__in=("successor_activate", "gate_activate_successor")).exists()


def test_one_handoff_per_predecessor_lane_and_successor_with_a_byte_equal_baseline(sworld):
    """The handoff of a predecessor lane (one predecessor epoch, account, route and partition) into a successor
    epoch exists once: repeating the handoff returns the same row, and PostgreSQL refuses a second row for the
    same successor epoch and predecessor lane even around the service. The staged successor lane's baseline and
    high-water equal, byte for byte, the frozen predecessor high-water and its tie-breaker.
    Proves: CV2-15-014"""
    send(sworld, "evt-7", 7)
    drain()
    halt_all(sworld)
    barrier = held_barrier(sworld)
    handoff, = handoff_all(sworld, barrier)
    predecessor = OrderingLane.objects.get(pk=handoff.predecessor_lane_id)
    staged = handoff.successor_lane
    assert (handoff.predecessor_epoch_id, handoff.successor_epoch_id) == (sworld.epoch.pk, sworld.successor.pk)
    assert (handoff.route, handoff.partition) == (predecessor.route, predecessor.partition)
    assert handoff.high_water == predecessor.high_water == staged.baseline == staged.high_water == 7
    assert bytes(handoff.high_water_tie) == bytes(predecessor.high_water_tie) == bytes(staged.high_water_tie)
    again = succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=predecessor.pk, actor=ACTOR)
    assert again.pk == handoff.pk and OrderingHandoff.objects.count() == 1
    other_lane = OrderingLane.objects.create(
        epoch=sworld.successor, account_id=predecessor.account_id, route=predecessor.route,
        route_version=predecessor.route_version, partition=predecessor.partition + "-other",
        contract=predecessor.contract, baseline=7, baseline_origin="ordering_handoff", high_water=7)
    row = {f.attname: getattr(handoff, f.attname) for f in OrderingHandoff._meta.concrete_fields if f.attname != "id"}
    with pytest.raises(IntegrityError, match="cutover_orderinghandoff_one_per_lane"), transaction.atomic():
        OrderingHandoff.objects.create(**{**row, "successor_lane_id": other_lane.pk})
