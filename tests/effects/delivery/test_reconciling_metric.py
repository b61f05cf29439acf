"""Issue 21: "delivery operations held for reconciliation" in /metrics. A real unknown outcome (the receiver applied
the batch and answered without a count) is counted at the `delivery_reconciling` stage while it waits, still while
an operator's reconciliation is open, and no longer once the approver resolved it with proof; the reading is the
partial index `delivery_op_reconciling`'s own predicate, so it stays an index read whatever the delivered history."""
from __future__ import annotations

from django.db import connection

from connector.actors import Actor
from effects.models import DeliveryOperation
from effects.services.delivery.reconciliation import reconcile_open, reconcile_resolve
from observability import readings
from tests.effects.delivery.test_failure_scenarios import RESOLUTIONS, unknown_success


def _reconciling() -> int:
    (backlog,) = [b for b in readings.backlogs() if b.stage == "delivery_reconciling"]
    return backlog.count


def test_an_unknown_outcome_is_counted_until_its_reconciliation_is_resolved(world, sync_receiver):
    assert _reconciling() == 0
    op = unknown_success(world, sync_receiver)
    assert _reconciling() == 1
    reconcile_open(actor=Actor.for_user(world.admin), operation_pk=op.pk,
                   expected_revision=DeliveryOperation.objects.get(pk=op.pk).revision, reconciliation_id="rec-m",
                   note="inspect receiver")
    assert DeliveryOperation.objects.get(pk=op.pk).state == "reconciling_unknown_success_ack"
    assert _reconciling() == 1
    target, proof, final, _capacity = RESOLUTIONS["none"]
    reconcile_resolve(actor=Actor.for_user(world.approver), operation_pk=op.pk,
                      expected_revision=DeliveryOperation.objects.get(pk=op.pk).revision, reconciliation_id="rec-m",
                      target=target, proof=proof, note="resolved none")
    assert DeliveryOperation.objects.get(pk=op.pk).state == final
    assert _reconciling() == 0
    # the reading can use the partial index: its WHERE is the index predicate
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
    plan = (DeliveryOperation.objects.filter(readings.RECONCILIATION_WAITING).order_by()
            .values_list("changed_at", flat=True).explain())
    assert "delivery_op_reconciling" in plan, plan
