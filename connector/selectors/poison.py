"""Read paths of poison-item evidence (D-168) that every app's operator surface shows: the StepFailure rows of
one item, newest first (CV2-13-001). Reads only; takes no lock."""
from __future__ import annotations

from connector.models import StepFailure


def step_failures_of(entity, *, limit: int) -> list[StepFailure]:
    """The item's StepFailure rows, newest first (the item is named by its model label and primary key)."""
    return list(StepFailure.objects.filter(entity_type=type(entity)._meta.label, entity_id=str(entity.pk))
                .order_by("-at", "-pk")[:limit])

