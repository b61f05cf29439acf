"""The async_bulk_job receiver end to end (effects.egress against the loopback receiver): the sequential child
supervisor of V1 keeps at most one child in flight per parent, in ordinal order, and a child whose effect is
unresolved holds the next one back until it is reconciled."""
from __future__ import annotations

import pytest

from connector.actors import Actor
from effects.models import DeliveryAttempt, DeliveryOperation
from effects.choices import CapacityState
from effects.services.delivery import execution, runner
from effects.services.delivery.reconciliation import reconcile_open, reconcile_resolve
from tests.effects.delivery.world import build


@pytest.fixture
def aworld(async_receiver):
    return build(async_receiver.url, kind_suffix="-a")


def step_until(op_pk: int, *states: str, max_steps: int = 20) -> str:
    for _ in range(max_steps):
        state = runner.step(op_pk)
        if state in states:
            return state
    raise AssertionError(f"operation {op_pk} never reached {states}; it is {state}")


def assert_held_back(op: DeliveryOperation, receiver, mutations: int) -> None:
    result = execution.submit(op.pk)
    assert not result.submitted and result.waiting_for == "in_flight_child", result
    assert runner.step(op.pk) == "sealed"
    assert not DeliveryAttempt.objects.filter(operation=op).exists()
    assert len(receiver.mutations()) == mutations


def test_async_bulk_job_has_one_in_flight_child_in_v1(aworld, async_receiver):
    """Two children on the async profile: the second is never submitted (SubmitResult waiting_for
    "in_flight_child") before the first, nor while the first is accepted, running or verifying; once the first is
    final (fully applied) the second is submitted and both finish, each applied exactly once.
    Proves: async_bulk_job_has_one_in_flight_child_in_v1."""
    parent = aworld.plan(profile=aworld.asyncp)
    first, second = parent.children.order_by("ordinal")

    # sequential supervisor: ordinal order, even before the first child moved
    assert_held_back(second, async_receiver, 0)

    assert step_until(first.pk, "accepted") == "accepted"
    assert len(async_receiver.mutations()) == 1
    assert_held_back(second, async_receiver, 1)

    assert step_until(first.pk, "waiting") == "waiting"  # job_full: running first
    assert_held_back(second, async_receiver, 1)
    assert step_until(first.pk, "verifying_success") == "verifying_success"
    assert_held_back(second, async_receiver, 1)
    assert step_until(first.pk, "final_full_promoted") == "final_full_promoted"

    assert step_until(second.pk, "accepted") == "accepted"
    assert len(async_receiver.mutations()) == 2
    states = runner.drive_parent(parent.pk)
    assert states == ["final_full_promoted", "final_full_promoted"], states
    first.refresh_from_db()
    second.refresh_from_db()
    keys = {bytes(first.receiver_mutation_key).hex(), bytes(second.receiver_mutation_key).hex()}
    assert len(keys) == 2
    assert async_receiver.applied == dict.fromkeys(keys, 1)
    assert [m["key"] for m in async_receiver.mutations()] == [bytes(first.receiver_mutation_key).hex(),
                                                              bytes(second.receiver_mutation_key).hex()]
    assert not DeliveryAttempt.objects.filter(operation__parent=parent,
                                              capacity_state=CapacityState.RESERVED).exists()


def test_unresolved_async_child_holds_the_next_until_reconciled(aworld, async_receiver):
    """A first child cancelled with an unknown effect stays in flight (its effect is unresolved and its capacity
    reserved): the second child is held back until an operator reconciles the first to no effect.
    Proves: async_bulk_job_has_one_in_flight_child_in_v1, unknown_remote_job_retains_capacity_until_reconciliation."""
    async_receiver.queue("job_cancelled_unknown", "job_full")
    parent = aworld.plan(profile=aworld.asyncp)
    first, second = parent.children.order_by("ordinal")
    assert step_until(first.pk, "final_unknown_cancelled_ack") == "final_unknown_cancelled_ack"
    assert DeliveryAttempt.objects.get(operation=first).capacity_state == CapacityState.RESERVED
    assert_held_back(second, async_receiver, 1)

    actor = Actor.for_user(aworld.admin)
    reconcile_open(actor=actor, operation_pk=first.pk, expected_revision=DeliveryOperation.objects.get(pk=first.pk).revision, reconciliation_id="rec-async")
    assert_held_back(second, async_receiver, 1)
    reconcile_resolve(actor=actor, operation_pk=first.pk, expected_revision=DeliveryOperation.objects.get(pk=first.pk).revision, reconciliation_id="rec-async",
                      target="final_no_effect_cancelled_ack",
                      proof={"applied_count": 0, "source": "receiver-query:job"})
    assert DeliveryAttempt.objects.get(operation=first).capacity_state == CapacityState.RELEASED

    assert step_until(second.pk, "accepted") == "accepted"
    # fully applied, but the frontier cannot pass the first child (no effect): eligible, not promoted
    assert step_until(second.pk, "final_full_eligible", "final_full_promoted") == "final_full_eligible"
    assert async_receiver.applied == {bytes(DeliveryOperation.objects.get(pk=second.pk)
                                            .receiver_mutation_key).hex(): 1}
