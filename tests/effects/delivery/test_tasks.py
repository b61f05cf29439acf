"""The Celery `delivery` tasks are thin: the beat sweep finds due work in PostgreSQL and enqueues one step per
operation; a lost message only delays (the next sweep finds the same rows)."""
from __future__ import annotations

from unittest import mock

from django.conf import settings

from effects import tasks


def test_sweep_enqueues_due_operations_and_steps_drive_them(world, sync_receiver):
    parent = world.plan()
    sent: list[int] = []
    with mock.patch.object(tasks.delivery_step, "delay", side_effect=lambda pk: sent.append(pk)):
        report = tasks.delivery_sweep()
    children = list(parent.children.order_by("ordinal").values_list("pk", flat=True))
    assert report["due"] == 2 and sorted(sent) == children
    for _ in range(3):  # a lost message: the next sweep finds the same rows
        for pk in children:
            tasks.delivery_step(pk)
    states = list(parent.children.order_by("ordinal").values_list("state", flat=True))
    assert states == ["final_full_promoted", "final_full_promoted"]
    with mock.patch.object(tasks.delivery_step, "delay") as delay:
        assert tasks.delivery_sweep()["due"] == 0 and not delay.called
    assert sorted(sync_receiver.applied.values()) == [1, 1]


def test_delivery_tasks_run_on_the_delivery_queue_and_the_sweep_is_scheduled():
    assert settings.CELERY_TASK_ROUTES["effects.tasks.delivery_step"] == {"queue": "delivery"}
    assert settings.CELERY_BEAT_SCHEDULE["sweeper-delivery"]["task"] == "effects.tasks.delivery_sweep"
