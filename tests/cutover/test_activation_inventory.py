"""The first activation's closed inventory (CV2-12-010, D-320): computed from the database when the barrier set is
held (every account, gate, enabled route, credential dispatch gate and certified partition with its selected
authority), frozen with its digest in an append-only ActivationInventory, and checked again before the activation
transaction. An uncovered supported path refuses the hold or the commit with ACTIVATION_INVENTORY_UNCOVERED and
writes nothing."""
from __future__ import annotations

import pytest
from django.db import IntegrityError, connections, transaction

from connector.models import AuditRecord, OrderingLane
from connector.selectors import inventory
from cutover.choices import BarrierSetState, DecisionState
from cutover.errors import ActivationInventoryUncovered
from cutover.models import ActivationInventory, OrderingBaseline, ServiceCutoverAttempt
from cutover.services import decision as decisions
from cutover.services import first_activation as fa
from tests import dbroles
from tests.cutover.v1_world import ACTOR, approve_activation, build_v1_world, to_validating

TX = pytest.mark.django_db(databases=["default", "journal"], transaction=True)


pytestmark = pytest.mark.usefixtures("cutover_env")  # tests/cutover/conftest.py


def validating_world():
    world = build_v1_world()
    world.accept(0, "k1", 1)
    world.accept(1, "k2", 7, partition="rec-9")
    to_validating(world)
    fa.first_activation_acquire(attempt_key="att-1", actor=ACTOR)
    return world


def _set():
    return fa.barrier_set_of(ServiceCutoverAttempt.objects.get(attempt_key="att-1"))


def _drop_lane(lane: OrderingLane) -> None:
    """Stage a certified partition whose lane authority is missing (no product path deletes a lane)."""
    with connections["default"].cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM connector_orderinglane WHERE id = %s", [lane.pk])
        cursor.execute("SET session_replication_role = origin")
        dbroles.admin_off(cursor)


@TX
def test_the_hold_freezes_a_fully_covered_inventory():
    """Every account, gate, enabled route, mapped credential and certified partition appears with its authority;
    the digest and the registry's digest are frozen once for the held set, append-only. Proves: CV2-12-010"""
    world = validating_world()
    row = fa.first_activation_hold(attempt_key="att-1", actor=ACTOR)
    assert row.state == BarrierSetState.HELD
    frozen = ActivationInventory.objects.get(barrier_set=row)
    accounts = len(world.accounts)
    partitions = OrderingBaseline.objects.filter(attempt__attempt_key="att-1").count()
    assert partitions >= 2
    assert frozen.counts["account"] == accounts and frozen.counts["gate"] == accounts
    assert frozen.counts["route"] >= accounts and frozen.counts["partition"] == partitions
    assert frozen.counts["dispatch"] >= accounts
    assert AuditRecord.objects.filter(action="activation_inventory_freeze").count() == 1
    with dbroles.as_admin(), pytest.raises(IntegrityError), transaction.atomic():  # even the administrator
        ActivationInventory.objects.filter(pk=frozen.pk).update(counts={})


@TX
def test_a_partition_without_its_lane_authority_blocks_the_hold_and_writes_nothing():
    """A certified partition (an OrderingBaseline) whose candidate-epoch OrderingLane is missing is uncovered: the
    hold is refused with ACTIVATION_INVENTORY_UNCOVERED naming it, the set stays `acquiring`, no inventory and no
    audit row is written. Proves: CV2-12-010"""
    world = validating_world()
    baseline = OrderingBaseline.objects.filter(attempt__attempt_key="att-1", partition="rec-9").get()
    lane = OrderingLane.objects.get(epoch=world.epoch, account_id=baseline.account_id, partition="rec-9")
    _drop_lane(lane)
    audits = AuditRecord.objects.count()
    with pytest.raises(ActivationInventoryUncovered) as info:
        fa.first_activation_hold(attempt_key="att-1", actor=ACTOR)
    assert info.value.code == "ACTIVATION_INVENTORY_UNCOVERED" and "rec-9" in info.value.detail
    assert _set().state == BarrierSetState.ACQUIRING
    assert not ActivationInventory.objects.exists() and AuditRecord.objects.count() == audits


@TX
def test_an_enabled_route_whose_path_kind_has_no_selected_authority_blocks_the_hold(monkeypatch):
    """With the registry lacking the ingress path's authority, every enabled inbound route (and its binding) is
    uncovered: the hold is refused and nothing is written; with the registry whole it holds. Proves: CV2-12-010"""
    validating_world()
    monkeypatch.setattr(inventory, "PATHS", tuple(p for p in inventory.PATHS if p.kind != "ingress"))
    with pytest.raises(ActivationInventoryUncovered) as info:
        fa.first_activation_hold(attempt_key="att-1", actor=ACTOR)
    assert "route" in info.value.detail and "no selected authority" in info.value.detail
    assert _set().state == BarrierSetState.ACQUIRING and not ActivationInventory.objects.exists()
    monkeypatch.undo()
    assert fa.first_activation_hold(attempt_key="att-1", actor=ACTOR).state == BarrierSetState.HELD


@TX
def test_an_inventory_uncovered_after_the_hold_blocks_the_activation_and_changes_nothing():
    """A path that loses its authority after the hold (a lane gone) refuses the commit before the activation
    transaction: the decision stays `rollback_open`, the set `held`, the epoch verified and every gate
    v2_validating. Proves: CV2-12-010"""
    from connector.models import ServingEpoch

    world = validating_world()
    fa.first_activation_hold(attempt_key="att-1", actor=ACTOR)
    approve_activation(world.epoch.epoch_id)
    _drop_lane(OrderingLane.objects.filter(epoch=world.epoch).order_by("pk").first())
    with pytest.raises(ActivationInventoryUncovered):
        fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert decisions.decision_read("att-1").state == DecisionState.ROLLBACK_OPEN
    assert _set().state == BarrierSetState.HELD
    assert ServingEpoch.objects.get(pk=world.epoch.pk).state == "verified"
    assert world.modes() == {"v2_validating"}
