"""Thin Celery tasks: each takes ids, calls one service, and is safe to run twice (the service re-checks state
under its lock). Redis only wakes workers; beat runs the sweeper so a lost message only delays work."""
from __future__ import annotations

from celery import shared_task

from connector.services import sweeper


@shared_task(name="connector.tasks.serving_epoch_sweep", acks_late=True, ignore_result=True)
def serving_epoch_sweep() -> dict[str, list[int]]:
    report = sweeper.serving_epoch_sweep()
    return {"verified": report.verified, "rejected": report.rejected, "deferred": report.deferred}
