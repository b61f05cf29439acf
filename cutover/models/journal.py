"""The L2 activation-versus-restore journal. It lives in the `journal` database (config.routers), outside the
database a restore replaces, so the decision survives the restore it arbitrates."""
from __future__ import annotations

from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from cutover.choices import DecisionState

__all__ = ["CutoverDecision"]


class CutoverDecision(ConcurrentTransitionMixin, models.Model):
    """The sole activation-versus-restore decision of one service cutover attempt. Invariants: one per attempt;
    the branch never changes because time passed (CV2-12-062); `fence` advances on every transition."""

    journal_database = True

    attempt_key = models.CharField(max_length=255, unique=True)
    state = FSMField(default=DecisionState.ROLLBACK_OPEN, choices=DecisionState.choices, protected=True)
    fence = models.BigIntegerField(default=1)
    changed_at = models.DateTimeField(auto_now=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=DecisionState.values), name="cutover_decision_state"),
        ]

    def __str__(self) -> str:
        return f"{self.attempt_key} ({self.state})"

    @transition(field=state, source=DecisionState.ROLLBACK_OPEN, target=DecisionState.ACTIVATING_V2)
    def choose_activation(self) -> None:
        self.fence += 1

    @transition(field=state, source=DecisionState.ACTIVATING_V2, target=DecisionState.V2_COMMITTED)
    def commit_activation(self) -> None:
        self.fence += 1

    @transition(field=state, source=DecisionState.ROLLBACK_OPEN, target=DecisionState.RESTORING_V1)
    def choose_restore(self) -> None:
        self.fence += 1

    @transition(field=state, source=DecisionState.RESTORING_V1, target=DecisionState.V1_RESTORED)
    def complete_restore(self) -> None:
        self.fence += 1
