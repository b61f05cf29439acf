"""Celery wake-ups for the V1 runtime (queue `v1`). The message only wakes a worker: it reads and claims from
PostgreSQL, and refuses when its process generation is not running."""
from __future__ import annotations

from celery import shared_task

from v1 import runtime


@shared_task(name="v1.tasks.v1_work", ignore_result=True)
def v1_work(generation_id: str) -> int:
    return runtime.drain(generation_id, limit=100)
