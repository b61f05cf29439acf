"""Recovery of a first-activation coordinator that crashed holding its publication barrier set (CV2-11-043,
CV2-11-049, CV2-11-056; seed "Ownership boundaries").

The set is recovered, never lease-healed: a successor coordinator, named by its own `holder`, takes over the SAME
open set by one holder-fenced takeover (`fencing.barrier_set_takeover`: the holder changes, the fence advances by
one, PostgreSQL refuses any other change, migration 0015), then loads the CutoverDecision and the set's per-owner receipts and does only what
the decision allows:

- `rollback_open`: resume acquisition (`acquiring -> held`, the owners reread and checked against the receipts) or,
  when asked or when a receipt is missing or differs, release explicitly; a held set stays held (the activation
  itself still needs the dual-approved decision: `first_activation_commit` with the new holder);
- `restoring_v1` / `v1_restored` (restore won): release, so the restore proceeds;
- `activating_v2` (activation won): resume the activation transaction, then read back, `v2_committed`, release;
- `v2_committed` with the set `activation_committed`: read back, then release.

After the takeover every act of the previous holder (hold, activation, release, a new acquire) is refused by its
holder and fence. Nothing here reads a clock: an old or long-held set is recovered the same way, and only an
explicit fenced release reopens the owners' publications.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from connector.actors import Actor
from cutover import locks
from cutover.choices import BARRIER_SET_OPEN, BarrierSetState, DecisionState
from cutover.errors import BarrierSetRefused, CutoverPhaseRefused
from cutover.models import ServingPublicationBarrierSet
from cutover.services import barrier_receipts
from cutover.services import decision as decisions
from cutover.services import first_activation as fa
from cutover.services import succession
from cutover.services.fencing import barrier_set_takeover
from cutover.services.preflight import attempt_get, require_coordinator

__all__ = ["Recovery", "first_activation_release", "first_activation_recover"]

ACTIVATION_WON = (DecisionState.ACTIVATING_V2, DecisionState.V2_COMMITTED)
RESTORE_WON = (DecisionState.RESTORING_V1, DecisionState.V1_RESTORED)


@dataclass(frozen=True)
class Recovery:
    """What a recovery found and left: the set (same pk as before the crash), its holder, fence and state, and the
    CutoverDecision's state."""

    barrier_set_pk: int | None
    holder: str
    fence: int
    set_state: str
    decision: str


def _open_set(attempt_key: str) -> ServingPublicationBarrierSet:
    current = fa.barrier_set_of(attempt_get(attempt_key))
    if current is None or current.state not in BARRIER_SET_OPEN:
        raise BarrierSetRefused(f"attempt {attempt_key} has no open first-activation barrier set")
    return current


def first_activation_release(*, attempt_key: str, holder: str | None, expected_fence: int | None, reason: str,
                             actor: Actor) -> ServingPublicationBarrierSet:
    """Explicit fenced release of an `acquiring` or `held` set while the activation has not won (rollback open,
    or restore won). Once activation won, only forward: `first_activation_commit` reads back, then releases
    (CV2-11-040). A stale holder or fence is refused and changes nothing (CV2-11-045)."""
    require_coordinator(actor)
    if not reason.strip():
        raise BarrierSetRefused("a release needs a reason")
    current = _open_set(attempt_key)
    with transaction.atomic():
        row = locks.barrier_set_for_update(current.pk)
        fa.check_holder(row, holder, expected_fence)
        if row.state not in (BarrierSetState.ACQUIRING, BarrierSetState.HELD):
            raise BarrierSetRefused(f"{row} is {row.state}: released only after its readback (resume the activation)")
        decision = decisions.decision_read(attempt_key)  # moved only by a transaction holding this set FOR UPDATE
        if decision is not None and decision.state in ACTIVATION_WON:
            raise BarrierSetRefused(f"activation won the CutoverDecision of {attempt_key} ({decision.state}); "
                                    "resume the activation, then it is released after its readback")
        return succession.record_release(row, reason, actor)


def first_activation_recover(*, attempt_key: str, holder: str, actor: Actor, release: bool = False,
                             reason: str = "") -> Recovery:
    """Take over the attempt's open set as `holder` and continue as the CutoverDecision says (module docstring).
    `release=True` asks for the explicit release while rollback is still open."""
    require_coordinator(actor)
    decision = decisions.decision_read(attempt_key)
    if decision is None:
        raise CutoverPhaseRefused(f"attempt {attempt_key} has no CutoverDecision; nothing to recover")
    attempt = attempt_get(attempt_key)
    row = barrier_set_takeover(barrier_set_pk=_open_set(attempt_key).pk, holder=holder, actor=actor)
    problems = barrier_receipts.owner_receipt_problems(row, attempt.candidate_epoch)
    state = decision.state
    if state in RESTORE_WON:
        row = first_activation_release(attempt_key=attempt_key, holder=holder, expected_fence=row.fence, actor=actor,
                                       reason=f"recovery by {holder}: restore won the CutoverDecision ({state})")
    elif state == DecisionState.ROLLBACK_OPEN:
        if release or problems:
            why = reason or ("owner receipts: " + "; ".join(problems) if problems else "released by recovery")
            row = first_activation_release(attempt_key=attempt_key, holder=holder, expected_fence=row.fence,
                                           actor=actor, reason=f"recovery by {holder}: {why}")
        elif row.state == BarrierSetState.ACQUIRING:
            row = fa.first_activation_hold(attempt_key=attempt_key, actor=actor, holder=holder,
                                           expected_fence=row.fence)
    else:  # activation won: only forward. The activation's approvals were required before the decision was won.
        if row.state == BarrierSetState.HELD:
            fa.activation_transaction(attempt, row.pk, actor, holder=holder, expected_fence=row.fence)
        fa.first_activation_commit(attempt_key=attempt_key, actor=actor, holder=holder)
    row = ServingPublicationBarrierSet.objects.get(pk=row.pk)
    return Recovery(row.pk, row.holder, row.fence, row.state, decisions.decision_read(attempt_key).state)
