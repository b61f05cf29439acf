"""The one write of the observability app: record a stage sample (one row per stage, in one transaction) and drop
samples older than the retention."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from . import readings
from .models import StageSample

SAMPLE_RETENTION = timedelta(hours=25)


def stage_samples_record(*, now: datetime | None = None) -> list[StageSample]:
    """Read every stage's backlog (bounded, indexed aggregates: observability.readings.backlogs) and store it as
    one sample per stage at `now`, truncated to the second. A second call for the same second writes nothing
    (the unique (taken_at, stage) constraint; a beat that fired twice). Samples older than a day go."""
    now = (now or timezone.now()).replace(microsecond=0)
    rows = [StageSample(taken_at=now, stage=b.stage, count=b.count, oldest_age_seconds=b.age(now))
            for b in readings.backlogs(now)]
    with transaction.atomic():
        StageSample.objects.filter(taken_at__lt=now - SAMPLE_RETENTION).delete()
        StageSample.objects.bulk_create(rows, ignore_conflicts=True)
    return rows
