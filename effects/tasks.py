"""Thin Celery tasks of the `egress` queue; the sweeper finds due outbound work in PostgreSQL."""
from __future__ import annotations

from celery import shared_task

from effects.services import worker


@shared_task(name="effects.tasks.effect_dispatch", acks_late=True, ignore_result=True)
def effect_dispatch(limit: int = 20) -> int:
    done = 0
    while done < limit and worker.effect_dispatch_once() is not None:
        done += 1
    return done


@shared_task(name="effects.tasks.effects_sweep", acks_late=True, ignore_result=True)
def effects_sweep() -> dict[str, int]:
    report = worker.effects_sweep()
    if report["claimable"]:
        effect_dispatch.delay()
    return report
