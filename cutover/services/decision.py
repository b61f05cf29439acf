"""The CutoverDecision journal: the sole activation-versus-restore owner of one service cutover attempt
(CV2-12-058..063). It lives in the `journal` database, so every function here runs its own short transaction on
that database (never inside a `default` transaction: the two commits are independent and the decision is taken
first). Each transition is a compare-and-swap on the observed fence: a stale coordinator changes nothing. No
function here looks at a clock: the branch never changes because time passed (CV2-12-062).

Created when the attempt enters `v2_validating` (decision 11)."""
from __future__ import annotations

from django.db import IntegrityError, transaction

from config.routers import JOURNAL_DB
from connector.errors import FenceStale, TransitionRefused
from cutover.choices import DecisionState
from cutover.models import CutoverDecision

__all__ = ["decision_open", "decision_read", "decision_choose_activation", "decision_commit_activation",
           "decision_choose_restore", "decision_complete_restore"]


def decision_read(attempt_key: str) -> CutoverDecision | None:
    return CutoverDecision.objects.using(JOURNAL_DB).filter(attempt_key=attempt_key).first()


def decision_open(attempt_key: str) -> CutoverDecision:
    """Create the attempt's decision `rollback_open`; idempotent (an existing decision is returned as is)."""
    existing = decision_read(attempt_key)
    if existing is not None:
        return existing
    try:
        with transaction.atomic(using=JOURNAL_DB):
            return CutoverDecision.objects.using(JOURNAL_DB).create(attempt_key=attempt_key)
    except IntegrityError:  # a concurrent opener won; the row is the same fact
        return decision_read(attempt_key)


def _cas(attempt_key: str, expected_fence: int | None, method: str, source: str) -> CutoverDecision:
    with transaction.atomic(using=JOURNAL_DB):
        decision = (CutoverDecision.objects.using(JOURNAL_DB).select_for_update()
                    .filter(attempt_key=attempt_key).first())
        if decision is None:
            raise TransitionRefused(f"attempt {attempt_key} has no CutoverDecision (it is not in v2_validating)")
        if expected_fence is not None and decision.fence != expected_fence:
            raise FenceStale(f"decision {attempt_key} was acted on with fence {expected_fence}; it holds "
                             f"{decision.fence} ({decision.state})")
        if decision.state != source:
            raise TransitionRefused(f"decision {attempt_key} is {decision.state}; {method} needs {source}")
        getattr(decision, method)()
        decision.save(using=JOURNAL_DB)
        return decision


def decision_choose_activation(attempt_key: str, *, expected_fence: int | None = None) -> CutoverDecision:
    """rollback_open -> activating_v2: activation wins; a restore can no longer start (CV2-12-058/065)."""
    return _cas(attempt_key, expected_fence, "choose_activation", DecisionState.ROLLBACK_OPEN)


def decision_commit_activation(attempt_key: str, *, expected_fence: int | None = None) -> CutoverDecision:
    """activating_v2 -> v2_committed, only after a fresh readback proved the epoch and every gate active."""
    return _cas(attempt_key, expected_fence, "commit_activation", DecisionState.ACTIVATING_V2)


def decision_choose_restore(attempt_key: str, *, expected_fence: int | None = None) -> CutoverDecision:
    """rollback_open -> restoring_v1: a RestoreAttempt wins; activation records no commit (CV2-12-060/066)."""
    return _cas(attempt_key, expected_fence, "choose_restore", DecisionState.ROLLBACK_OPEN)


def decision_complete_restore(attempt_key: str, *, expected_fence: int | None = None) -> CutoverDecision:
    """restoring_v1 -> v1_restored, only after the recovery receipt is durable (CV2-12-061/074)."""
    return _cas(attempt_key, expected_fence, "complete_restore", DecisionState.RESTORING_V1)
