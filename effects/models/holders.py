"""Worker process generations that may hold dispatch permits. Termination is durable proof that the generation's
egress capability is revoked: the egress adapter refuses any send from it, and only then may its permits be
abandoned."""
from __future__ import annotations

from django.db import models
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from effects.choices import HolderState

__all__ = ["ProcessGeneration"]


class ProcessGeneration(ConcurrentTransitionMixin, models.Model):
    """One worker process generation. Invariants: `holder_id` unique; `running -> terminated` only, never back."""

    holder_id = models.CharField(max_length=255, unique=True)
    state = FSMField(default=HolderState.RUNNING, choices=HolderState.choices, protected=True)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField(auto_now_add=True)
    terminated_at = models.DateTimeField(null=True, blank=True)
    terminated_by = models.CharField(max_length=255, blank=True, default="")
    termination_evidence = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.holder_id} ({self.state})"

    @transition(field=state, source=HolderState.RUNNING, target=HolderState.TERMINATED)
    def terminate(self, *, at, by: str, evidence: str) -> None:
        self.terminated_at, self.terminated_by, self.termination_evidence = at, by, evidence
