from celery import shared_task

from .services import stage_samples_record


@shared_task(name="observability.tasks.stage_sample")
def stage_sample() -> int:
    """Once a minute (beat): one backlog reading per stage for the overview's pictures."""
    return len(stage_samples_record())
