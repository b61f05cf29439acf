"""`draining -> retired` (D-267): `serving.epoch_retire` retires a draining epoch only when every fact naming it is
terminal, names what still references it otherwise, deletes nothing, and a retired epoch authorizes no write."""
from __future__ import annotations

import pytest
from django.db import transaction

from connector import locks
from connector.actors import Actor
from connector.choices import EpochState, ExecutionState
from connector.demo import build_world
from connector.errors import EpochRetentionUnmet, FenceStale, GateNotServing, PermissionRefused, TransitionRefused
from connector.models import (
    ApplicationResult,
    AuditRecord,
    Event,
    Execution,
    MaterializationDue,
    OrderingLane,
    Receipt,
    ServingEpoch,
    ServingEpochBindingProof,
)
from connector.selectors.serving import RETENTION_CODES, epoch_retention_blockers
from connector.services import execution, guard, materialize, serving, sweeper
from cutover.errors import HandoffRefused, SuccessorActivationRefused
from cutover.models import OrderingHandoff
from cutover.services import succession
from effects.models import RemoteEffect
from tests.connector.inbound_helpers import (
    admit,
    advance_lanes,
    drain,
    pending_lane_pks,
    webhook_body,
    webhook_event,
)
from tests.cutover.succession_helpers import (
    ACTOR,
    WEBHOOK,
    build_succession_world,
    halt_all,
    handoff_all,
    held_barrier,
    resume_all,
    send,
)
from tests.effects.helpers import author


def _codes(exc: EpochRetentionUnmet) -> list[str]:
    return [code for code, _ in exc.context["blockers"]]


def _force_draining(epoch: ServingEpoch) -> ServingEpoch:
    """The model transition alone, without the successor activation's own terminal-work checks: the state a
    defect (or a future path) could leave behind. Retirement must refuse it on its own."""
    epoch = locks.epoch_for_update(epoch.pk)  # as a transition does: lock, and drop the guard's memo
    epoch.drain()
    epoch.save(update_fields=serving.EPOCH_STATE_FIELDS)
    return epoch


def _succeed(world) -> object:
    """Halt, barriers, handoffs, activation: the predecessor is `draining`, the barrier set still committed."""
    halt_all(world)
    barrier = held_barrier(world)
    handoff_all(world, barrier)
    succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    world.epoch.refresh_from_db()
    assert world.epoch.state == EpochState.DRAINING
    barrier.refresh_from_db()
    return barrier


def _facts(epoch) -> dict:
    return {
        "receipts": sorted(Receipt.objects.filter(epoch=epoch).values_list("pk", "payload_digest")),
        "events": sorted(Event.objects.filter(epoch=epoch).values_list("pk", "payload_digest")),
        "executions": sorted(Execution.objects.filter(epoch=epoch).values_list("pk", "state")),
        "results": sorted(ApplicationResult.objects.filter(command_id__in=Execution.objects.filter(epoch=epoch)
                                                           .values("command_id")).values_list("pk", "outcome")),
        "lanes": sorted(OrderingLane.objects.filter(epoch=epoch).values_list("pk", "high_water", "fence")),
        "handoffs": sorted(OrderingHandoff.objects.filter(predecessor_epoch=epoch).values_list("pk", "high_water")),
        "proofs": sorted(ServingEpochBindingProof.objects.filter(epoch=epoch).values_list("pk", "owner_receipt")),
        "epoch": ServingEpoch.objects.filter(pk=epoch.pk).values_list("epoch_id", "digest", "preimage").get(),
    }


@pytest.mark.django_db
def test_retire_after_succession_once_every_fact_is_terminal_and_deletes_nothing():
    """After a successor activation the predecessor is `draining`; it retires only after the barrier set naming it
    is released (BARRIER_SET_OPEN before), by an explicit operator step with a reason: a sweep in between retires
    nothing. `draining -> retired` is audited with the reason, and every fact of the epoch (receipts, events,
    executions, results, lanes, handoffs, proof rows, its bytes) stays readable and unchanged.
    Proves: CV2-11-026, CV2-02-033, CV2-02-013"""
    world = build_succession_world("rt-")
    send(world, "evt-100", 100)
    send(world, "evt-7", 7, record="rec-2", account=world.accounts[1])
    assert [e.state for e in drain()] == [ExecutionState.COMPLETED, ExecutionState.COMPLETED]
    barrier = _succeed(world)
    before = _facts(world.epoch)
    assert len(before["executions"]) == 2 and len(before["results"]) == 2 and len(before["handoffs"]) == 2

    with pytest.raises(EpochRetentionUnmet) as refused:
        serving.epoch_retire(epoch_pk=world.epoch.pk, actor=ACTOR, reason="facts terminal")
    assert refused.value.code == "EPOCH_RETENTION_UNMET"
    assert refused.value.context["blockers"] == [
        ("BARRIER_SET_OPEN", f"barrier set #{barrier.pk} is activation_committed")]
    succession.barrier_set_release(barrier_set_pk=barrier.pk, expected_fence=barrier.fence,
                                   reason="readback verified", actor=ACTOR)
    assert epoch_retention_blockers(world.epoch) == []

    sweeper.serving_epoch_sweep()
    sweeper.inbound_sweep(grace_seconds=0)
    world.epoch.refresh_from_db()
    assert world.epoch.state == EpochState.DRAINING  # time and sweeps never retire an epoch

    with pytest.raises(TransitionRefused, match="needs a reason"):
        serving.epoch_retire(epoch_pk=world.epoch.pk, actor=ACTOR, reason="  ")
    with pytest.raises(FenceStale):
        serving.epoch_retire(epoch_pk=world.epoch.pk, actor=ACTOR, reason="x",
                             expected_digest=bytes(world.successor.digest))
    retired = serving.epoch_retire(epoch_pk=world.epoch.pk, actor=ACTOR, reason="facts terminal",
                                   expected_digest=bytes(world.epoch.digest))
    assert retired.state == EpochState.RETIRED
    assert ServingEpoch.objects.get(pk=world.epoch.pk).state == EpochState.RETIRED
    audit = AuditRecord.objects.get(action="epoch_retire")
    assert (audit.entity_id, audit.from_state, audit.to_state, audit.reason, bytes(audit.evidence_digest)) == (
        str(world.epoch.pk), EpochState.DRAINING, EpochState.RETIRED, "facts terminal", bytes(world.epoch.digest))
    assert _facts(world.epoch) == before
    with pytest.raises(TransitionRefused, match="only a draining epoch retires"):
        serving.epoch_retire(epoch_pk=world.epoch.pk, actor=ACTOR, reason="again")
    with pytest.raises(TransitionRefused, match="only a draining epoch retires"):
        serving.epoch_retire(epoch_pk=world.successor.pk, actor=ACTOR, reason="the active one")


@pytest.mark.django_db
def test_retire_refused_while_a_receipt_awaits_materialization():
    """A receipt admitted under a draining epoch and never materialized names the epoch and is not terminal:
    RECEIPT_UNMATERIALIZED names it and the epoch stays `draining`. Proves: CV2-11-026, CV2-02-033"""
    world = build_succession_world("ru-")
    receipt_pk = admit(world, WEBHOOK, webhook_body(webhook_event("evt-1", "rec-1", 1))).pk
    assert MaterializationDue.objects.filter(receipt_id=receipt_pk).exists()
    _force_draining(world.epoch)
    with pytest.raises(EpochRetentionUnmet) as refused:
        serving.epoch_retire(epoch_pk=world.epoch.pk, actor=ACTOR, reason="r")
    assert dict(refused.value.context["blockers"])["RECEIPT_UNMATERIALIZED"] == (
        f"receipt #{receipt_pk} awaiting materialization")
    assert ServingEpoch.objects.get(pk=world.epoch.pk).state == EpochState.DRAINING
    assert not AuditRecord.objects.filter(action="epoch_retire").exists()


@pytest.mark.django_db
def test_an_unmaterialized_receipt_refuses_the_cutoff_until_the_predecessor_materializes_it():
    """D-268: a receipt admitted before the halt and not yet materialized would be stranded by the cutoff (only an
    active epoch on a serving gate materializes), and its epoch could never retire. The first handoff and the
    activation refuse while it waits; the predecessor resumes (allowed before the cutoff), materializes and runs
    it, halts again, and the succession then completes and the predecessor retires.
    Proves: CV2-11-026, CV2-11-014, CV2-11-011"""
    world = build_succession_world("rh-")
    send(world, "evt-5", 5, record="rec-2")  # one lane, so one handoff to refuse
    assert len(drain()) == 1
    receipt_pk = admit(world, WEBHOOK, webhook_body(webhook_event("evt-1", "rec-1", 1))).pk
    halt_all(world)
    barrier = held_barrier(world)
    with pytest.raises(HandoffRefused, match=f"receipt #{receipt_pk}"):
        handoff_all(world, barrier)
    with pytest.raises(SuccessorActivationRefused, match=f"receipt #{receipt_pk} awaiting materialization"):
        succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert not OrderingHandoff.objects.exists()
    resume_all(world)
    materialize.receipt_materialize(receipt_pk=receipt_pk)
    assert [e.state for e in drain()] == [ExecutionState.COMPLETED]
    halt_all(world)
    handoff_all(world, barrier)
    succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    barrier.refresh_from_db()
    succession.barrier_set_release(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, reason="readback",
                                   actor=ACTOR)
    assert serving.epoch_retire(epoch_pk=world.epoch.pk, actor=ACTOR, reason="terminal").state == EpochState.RETIRED


@pytest.mark.django_db
def test_retire_refused_while_executions_are_open():
    """A draining epoch with a leased `ready` Execution (and so a lane with an active Execution) and gates still
    naming it is refused with EXECUTION_OPEN, LANE_WORK_OPEN and GATE_NAMES_EPOCH, each naming its rows; nothing
    moves. Proves: CV2-11-026, CV2-02-033"""
    world = build_succession_world("re-")
    send(world, "evt-100", 100)
    minted, = advance_lanes()
    execution.execution_claim(holder="w1")
    _force_draining(world.epoch)
    with pytest.raises(EpochRetentionUnmet) as refused:
        serving.epoch_retire(epoch_pk=world.epoch.pk, actor=ACTOR, reason="r")
    blockers = dict(refused.value.context["blockers"])
    assert _codes(refused.value) == ["GATE_NAMES_EPOCH", "EXECUTION_OPEN", "LANE_WORK_OPEN"]
    assert blockers["EXECUTION_OPEN"] == f"execution #{minted.pk} is ready (leased by w1)"
    assert blockers["LANE_WORK_OPEN"] == f"lane #{minted.lane_id} with an active execution or a pending projection"
    assert str(world.accounts[0].pk) in blockers["GATE_NAMES_EPOCH"]
    assert "EXECUTION_OPEN: execution #" in refused.value.detail
    assert ServingEpoch.objects.get(pk=world.epoch.pk).state == EpochState.DRAINING


@pytest.mark.django_db
def test_retire_refused_while_a_remote_effect_is_open():
    """A RemoteEffect authored under the epoch and still `prepared` keeps it from retiring: EFFECT_OPEN names it
    (registered by the effects app through the connector's retention hook). Proves: CV2-11-026, CV2-02-033"""
    world = build_world("rf-", push=True)
    command = author(world.accounts[0])
    effect = RemoteEffect.objects.get(command=command)
    _force_draining(world.active_epoch)
    with pytest.raises(EpochRetentionUnmet) as refused:
        serving.epoch_retire(epoch_pk=world.active_epoch.pk, actor=ACTOR, reason="r")
    assert dict(refused.value.context["blockers"])["EFFECT_OPEN"] == f"effect #{effect.pk} is prepared"
    assert set(_codes(refused.value)) <= set(RETENTION_CODES)


@pytest.mark.django_db
def test_retire_needs_the_permission_for_a_person(django_user_model):
    """A person without `connector.retire_servingepoch` is refused before anything is checked or written.
    Proves: CV2-02-033"""
    world = build_succession_world("rp-")
    barrier = _succeed(world)
    succession.barrier_set_release(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, reason="ok",
                                   actor=ACTOR)
    user = django_user_model.objects.create_user("no-retire", password="x")
    with pytest.raises(PermissionRefused):
        serving.epoch_retire(epoch_pk=world.epoch.pk, actor=Actor.for_user(user), reason="r")
    assert ServingEpoch.objects.get(pk=world.epoch.pk).state == EpochState.DRAINING


@pytest.mark.django_db
def test_a_retired_epoch_authorizes_no_write():
    """A gate that still named a retired epoch (forced here by the model transitions alone) refuses every guarded
    write: the serving guard, a transport admission, and a lane advance. Proves: CV2-03-017, CV2-02-033"""
    world = build_succession_world("rw-")
    send(world, "evt-1", 1)
    epoch = locks.epoch_for_update(_force_draining(world.epoch).pk)
    epoch.retire()
    epoch.save(update_fields=serving.EPOCH_STATE_FIELDS)
    assert ServingEpoch.objects.get(pk=epoch.pk).state == EpochState.RETIRED
    with pytest.raises(GateNotServing, match="retired"), transaction.atomic():
        guard.lock_serving(account_id=world.accounts[0].pk)
    receipts = Receipt.objects.count()
    with pytest.raises(GateNotServing, match="retired"):
        admit(world, WEBHOOK, webhook_body(webhook_event("evt-2", "rec-1", 2)))
    assert Receipt.objects.count() == receipts
    lane_pk, = pending_lane_pks()
    with pytest.raises(GateNotServing, match="retired"):
        execution.lane_advance(lane_pk=lane_pk)
    assert not Execution.objects.filter(epoch=epoch).exists()


@pytest.mark.django_db
def test_retire_through_the_admin_names_the_open_work_then_retires(client, django_user_model):
    """The epoch page's `retire` button is enabled only on a draining epoch; it needs a reason, is refused with
    EPOCH_RETENTION_UNMET naming the open barrier set, and after the release retires the epoch with an audit row by
    the operator. Proves: CV2-02-033, CV2-11-026"""
    from django.contrib import messages

    from tests.connector.test_admin import buttons, flashed, post, url

    client.force_login(django_user_model.objects.create_superuser("op", "op@example.com", "unused"))
    world = build_succession_world("ra-")
    assert buttons(client.get(url(world.epoch)).content.decode())["retire"] is False
    barrier = _succeed(world)
    assert buttons(client.get(url(world.epoch)).content.decode())["retire"] is True
    response = post(client, url(world.epoch, "transition"), {"transition": "retire", "reason": ""})
    assert flashed(response)[0][1].startswith("TRANSITION_REFUSED: a retirement needs a reason")
    response = post(client, url(world.epoch, "transition"), {"transition": "retire", "reason": "done"})
    assert flashed(response)[0] == (messages.ERROR, f"EPOCH_RETENTION_UNMET: epoch {world.epoch.epoch_id} still "
                                                    f"has open facts: BARRIER_SET_OPEN: barrier set #{barrier.pk} "
                                                    "is activation_committed")
    succession.barrier_set_release(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, reason="ok",
                                   actor=ACTOR)
    response = post(client, url(world.epoch, "transition"), {"transition": "retire", "reason": "done"})
    assert flashed(response)[0][0] == messages.SUCCESS
    assert ServingEpoch.objects.get(pk=world.epoch.pk).state == EpochState.RETIRED
    assert AuditRecord.objects.filter(action="epoch_retire", actor="user:op", reason="done").exists()
