"""Poison delivery operations never wedge the delivery worker or sweep (decision D-168, CV2-13-001): a step or an
orphan recovery that fails for a non-connector reason on one operation holds it (DELIVERY_STEP_FAILED, its
contract state untouched, StepFailure evidence); the other operations of the same sweep complete against a real
loopback receiver, and later sweeps skip the held one until an operator releases it."""
from __future__ import annotations

from datetime import timedelta
from unittest import mock

from django.core.management import call_command

from connector.models import StepFailure
from effects import egress, tasks
from effects.services.delivery import execution, runner


class WorkerKilled(BaseException):
    """A worker dying mid-step (not an Exception: nothing may catch it)."""


def _failure(op) -> StepFailure:
    return StepFailure.objects.get(entity_type="effects.DeliveryOperation", entity_id=str(op.pk))


def test_a_delivery_step_failure_holds_that_operation_and_the_others_complete(world, sync_receiver, monkeypatch):
    """`effects.tasks.delivery_step` fails for one child (its submit raises a ValueError): the child is held with
    its state unchanged (`sealed`), the other child is delivered and verified (its checkpoint waits, in frontier
    order, behind the held one), and the next sweep no longer enqueues the held one; `poison_release --delivery`
    puts it back, it completes, and both are promoted. Proves: CV2-13-001"""
    parent = world.plan()
    bad, good = parent.children.order_by("ordinal")
    real = execution.submit

    def submit(pk):
        if pk == bad.pk:
            raise ValueError("poison submit")
        return real(pk)

    monkeypatch.setattr(execution, "submit", submit)
    with mock.patch.object(tasks.delivery_step, "delay"):
        assert tasks.delivery_sweep()["due"] == 2
    for _ in range(3):
        for pk in (bad.pk, good.pk):
            tasks.delivery_step(pk)
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.state, bad.held_reason) == ("sealed", "DELIVERY_STEP_FAILED") and bad.held_at is not None
    assert good.state == "final_full_eligible" and sync_receiver.applied
    assert (_failure(bad).step, _failure(bad).exception_class) == ("delivery_step", "builtins.ValueError")
    assert StepFailure.objects.count() == 1  # held once: later steps skip it
    with mock.patch.object(tasks.delivery_step, "delay") as delay:
        assert tasks.delivery_sweep()["due"] == 0 and not delay.called
    monkeypatch.setattr(execution, "submit", real)
    call_command("poison_release", delivery=bad.pk, reason="fix deployed")
    for _ in range(3):
        tasks.delivery_step(bad.pk)
    assert list(parent.children.order_by("ordinal").values_list("state", flat=True)) == [
        "final_full_promoted", "final_full_promoted"]


def test_an_orphan_recovery_failure_holds_that_operation_and_the_sweep_recovers_the_others(world, monkeypatch):
    """The sweep's orphan recovery fails for one SUBMITTING orphan (a KeyError): that operation is held and the
    other orphan is settled by attempt ID in the same sweep (never sent: retry_wait). Proves: CV2-13-001"""
    parent = world.plan()
    bad, good = parent.children.order_by("ordinal")

    def killed(**kwargs):
        raise WorkerKilled

    monkeypatch.setattr(egress, "delivery_send", killed)
    for op in (bad, good):  # each worker dies after SUBMITTING committed, before any I/O was marked
        try:
            runner.step(op.pk)
        except WorkerKilled:
            pass
    real = runner.recover_orphan

    def recover_orphan(operation_pk, *, min_age=None):
        if operation_pk == bad.pk:
            raise KeyError("poison recovery")
        return real(operation_pk, min_age=min_age)

    monkeypatch.setattr(runner, "recover_orphan", recover_orphan)
    report = runner.sweep(lease=timedelta(0))
    assert report["orphans_recovered"] == 1
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.state, bad.held_reason) == ("submitting", "DELIVERY_STEP_FAILED")
    assert good.state == "retry_wait"
    assert _failure(bad).step == "delivery_recover_orphan"
    assert runner.sweep(lease=timedelta(0))["orphans_recovered"] == 0
