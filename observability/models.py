"""Stage samples: one reading per pipeline stage per minute (how many items wait, how old the oldest is), taken by
`observability.services.stage_samples_record` and drawn by the overview. Readings, not facts: losing them loses
only a picture; the backlog itself is always re-read from the owning apps' tables."""
from django.db import models
from django.db.models import Q


class StageSample(models.Model):
    taken_at = models.DateTimeField(db_index=True)
    stage = models.CharField(max_length=64)
    count = models.PositiveIntegerField()
    oldest_age_seconds = models.FloatField()

    class Meta:
        ordering = ["taken_at", "stage"]
        constraints = [
            models.UniqueConstraint(fields=["taken_at", "stage"], name="observability_sample_unique"),
            models.CheckConstraint(condition=Q(oldest_age_seconds__gte=0), name="observability_sample_age"),
        ]

    def __str__(self) -> str:
        return f"{self.stage} at {self.taken_at:%H:%M}: {self.count} waiting, oldest {self.oldest_age_seconds:.0f} s"
