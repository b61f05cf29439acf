"""A kill inside the shared materialization transaction (D-294, D-521): a real worker process running
`materialize_due` over several due receipts of one account is SIGKILLed at `materialize.after_components`; nothing
of any receipt stands, and the next run derives each exactly once. The same for the lanes' advance."""
from __future__ import annotations

import pytest

from connector import tasks
from connector.models import Event, MaterializationDue, Projection, ReceiptComponent
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import admit, build_inbound_world, webhook_body, webhook_event
from tests.connector.test_materialize_many import _deliveries
from tests.crash.support import DB, assert_killed

MATERIALIZE_DUE_SCRIPT = """
from django.conf import settings
from connector import tasks
settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_SLOTS": 1}
tasks.execution_claim_and_run.delay = lambda *a, **k: None
from connector.services import materialize
real = materialize.receipts_materialize
def shared(*, receipt_pks, account_id):  # the kill must come from the shared transaction of all five
    assert len(receipt_pks) == 5, receipt_pks
    return real(receipt_pks=receipt_pks, account_id=account_id)
materialize.receipts_materialize = shared
emit(attempted=tasks.materialize_due(ARGS["account_id"]))
"""


@pytest.mark.django_db(**DB)
def test_a_kill_inside_the_shared_transaction_leaves_nothing_and_the_rerun_derives_each_once(run_child, settings,
                                                                                             monkeypatch):
    """Five due receipts (two events in one, a duplicate and a conflict of an earlier key among the others): the
    child is killed after the shared transaction wrote its Components, before its commit. No Component, Event or
    Projection of any receipt stands and all five are still due. The next run materializes each exactly once:
    6 Components (4 events, 1 duplicate, 1 conflict), 4 Events, 4 Projections, nothing due.
    Proves: CV2-05-017, CV2-02-007, CV2-14-001"""
    world = build_inbound_world("mk-", [PACK_A])
    receipts = _deliveries(world, world.account)
    run = run_child(MATERIALIZE_DUE_SCRIPT, "materialize.after_components", account_id=world.account.pk)
    assert_killed(run)
    assert (ReceiptComponent.objects.count(), Event.objects.count(), Projection.objects.count()) == (0, 0, 0)
    assert MaterializationDue.objects.filter(receipt__in=receipts).count() == 5

    monkeypatch.setattr(tasks.execution_claim_and_run, "delay", lambda *a, **k: None)
    settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_SLOTS": 1}
    assert tasks.materialize_due(world.account.pk) == 5
    assert MaterializationDue.objects.count() == 0
    assert sorted(ReceiptComponent.objects.values_list("disposition", flat=True)) == [
        "duplicate_event", "event", "event", "event", "event", "quarantined"]
    assert Event.objects.count() == 4 and Projection.objects.count() == 4
    assert Event.objects.values("source_event_key").distinct().count() == 4


ADVANCE_SCRIPT = """
from connector.services import advance
emit(out=advance.lanes_advance(lane_pks=ARGS["lanes"], account_id=ARGS["account_id"]))
"""


@pytest.mark.django_db(**DB)
def test_a_kill_inside_the_shared_advance_mints_nothing_and_the_rerun_mints_each_once(run_child):
    """Five fresh lanes advanced together (D-295) by a child SIGKILLed at `advance.before_commit`: no
    Execution stands, every Projection is still pending at generation 0, every lane idle at its old fence. The
    rerun mints exactly one Execution per lane. Proves: CV2-06-014, CV2-02-007, CV2-14-001"""
    from connector.models import Execution, OrderingLane
    from connector.services import advance, materialize

    world = build_inbound_world("ma-", [PACK_A])
    for i in range(5):
        receipt = admit(world, "records.webhook", webhook_body(webhook_event(f"ev-{i}", f"rec-{i}", 1)))
        materialize.receipt_materialize(receipt_pk=receipt.pk, account_id=world.account.pk)
    lanes = {lane.pk: lane.fence for lane in OrderingLane.objects.filter(account=world.account)}
    run = run_child(ADVANCE_SCRIPT, "advance.before_commit", lanes=sorted(lanes),
                    account_id=world.account.pk)
    assert_killed(run)
    assert Execution.objects.count() == 0
    assert set(Projection.objects.values_list("lane_status", "execution_generation")) == {("pending", 0)}
    assert {lane.pk: (lane.fence, lane.active_execution_id) for lane in OrderingLane.objects.all()} == {
        pk: (fence, None) for pk, fence in lanes.items()}
    minted = advance.lanes_advance(lane_pks=sorted(lanes), account_id=world.account.pk)
    assert len(minted) == 5 and Execution.objects.count() == 5
    assert {lane.active_execution_id for lane in OrderingLane.objects.all()} == set(minted)
