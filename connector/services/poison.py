"""Poison items never wedge a sweep (decision D-168, CV2-13-001).

Every sweeper and worker step runs each item inside `isolated(...)`. An exception on one item is classified:

* **transient** — the database is unreachable or restarting, or a statement lost a race it can retry
  (`django.db.OperationalError` / `InterfaceError`: connection loss, deadlock, serialization failure, lock or
  statement timeout), or a ConnectorError whose catalog entry is `retryable` (GATE_NOT_SERVING, FENCE_STALE,
  OWNER_UNAVAILABLE, ...), or a MemoryError (the process, not the item). Logged; the item is left exactly as it
  was and the next sweep retries it. A transient error never quarantines.
* **refused** — any other ConnectorError: the step's own domain answer (the item moved meanwhile, a permit was
  refused). Logged; left as it is — unless the step declares that its refusals are deterministic too (a
  materialization or a Runtime run is a pure function of immutable inputs, so its refusal repeats forever).
* **failed** — every other exception (DataError, IntegrityError, ValueError, KeyError, RecursionError, ...): a
  deterministic failure. Logged with its traceback; the item is quarantined in its own vocabulary (below) in a
  new transaction, with a closed reason code and a StepFailure row carrying the step, the exception class and
  message and the time; the step's sweep then moves on to the next item.

The quarantine writes of the connector's items live here; `effects.services.poison` has those of effects. A
quarantine write that fails itself is logged and the sweep still moves on."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from connector import locks
from connector.actors import Actor
from connector.choices import DependencyState, ExecutionState, LaneState, StepFailureReason, WindowState
from connector.errors import ConnectorError, TransitionRefused
from connector.models import Execution, MaterializationDue, OrderingLane, ServingEpoch, StepFailure
from connector.services.audit import audit_record

log = logging.getLogger(__name__)
R = TypeVar("R")
QUARANTINER = Actor.system("sweeper")

# code -> (title, owner, alert deadline in minutes, remediation): the closed map's entries of these reasons
# (governance.reasons reads them; CV2-13-001).
_EVIDENCE = "Read the StepFailure evidence (exception, step, time) and the worker log's traceback"
STEP_FAILURE_REASONS: dict[str, tuple[str, str, int, str]] = {
    StepFailureReason.MATERIALIZATION_FAILED: (
        "Receipt admitted but its materialization failed", "platform on-call", 30,
        f"{_EVIDENCE}. Product at fault: deploy the fix, then `manage.py poison_release --receipt <id> --reason "
        "...` (the missing children are derived again from the immutable Receipt). Bytes at fault: the source "
        "resends corrected content under a new Idempotency-Key; the held Receipt stays as evidence."),
    StepFailureReason.LANE_STEP_FAILED: (
        "Ordering lane halted: advancing it failed", "platform on-call", 30,
        f"{_EVIDENCE}. Deploy the fix, then `manage.py poison_release --lane <id> --reason ...`: the lane reopens "
        "with the same high-water and pending positions (nothing was decided while it was halted)."),
    StepFailureReason.WINDOW_SEAL_FAILED: (
        "Projection window quarantined: sealing it failed", "platform on-call", 60,
        f"{_EVIDENCE}. The window stays as evidence; after the fix, replay its member events (ReplayRequest); "
        "new input of the grouping key opens a successor window."),
    StepFailureReason.EXECUTION_STEP_FAILED: (
        "Execution quarantined: claiming, running or resolving it failed", "runtime owner", 60,
        f"{_EVIDENCE}. The quarantined Execution stays immutable; after the fix, replay its source event with a "
        "ReplayRequest. A lane halted behind it waits for the same remediation as RESULT_FAILED."),
    StepFailureReason.EPOCH_VERIFY_FAILED: (
        "Prepared epoch candidate: verifying it failed", "service owner", 120,
        f"{_EVIDENCE}. Reject the candidate (`epoch_reject`) and prepare a new one after the fix; the sweeper no "
        "longer re-verifies this one."),
    StepFailureReason.EFFECT_STEP_FAILED: (
        "Remote effect quarantined or held: a dispatch step failed", "integration on-call", 30,
        f"{_EVIDENCE}. A `quarantined` effect never sent: a new business intent needs a new EffectRoot. A held "
        "effect keeps its state (an open permit settles only by the crash rules: abandonment with proof or "
        "reconciliation); after the fix `manage.py poison_release --effect <id> --reason ...` lifts the hold."),
    StepFailureReason.DELIVERY_STEP_FAILED: (
        "Delivery operation held: a delivery step failed", "delivery on-call", 30,
        f"{_EVIDENCE}. The operation keeps its contract state; after the fix `manage.py poison_release "
        "--delivery <id> --reason ...` puts it back in the sweep (a SUBMITTING orphan is then recovered by "
        "attempt ID)."),
}

TRANSIENT = "transient"
REFUSED = "refused"
FAILED = "failed"


def classify(exc: BaseException) -> str:
    """transient | refused | failed (see the module docstring). Running out of memory is a property of the
    process, not of the item: transient too."""
    if isinstance(exc, ConnectorError):
        return TRANSIENT if exc.retryable else REFUSED
    if isinstance(exc, (OperationalError, InterfaceError, MemoryError)):
        return TRANSIENT
    return FAILED


def log_fallback(logger: logging.Logger, exc: BaseException, message: str, *args) -> None:
    """A batch that rolled back as a whole and is split (`isolated_batches`): a defect (`failed`) is logged with its
    traceback; a refusal or a transient failure (a gate that stopped serving, a lost connection) is routine and
    logged at INFO without one (D-397)."""
    if classify(exc) == FAILED:
        logger.error(message, *args, exc_info=exc)
    else:
        logger.info(message + ": %s: %s", *args, type(exc).__name__, exc)


@dataclass
class Isolated:
    """Context manager around one item of one step; it swallows the item's exception (never BaseExceptions
    such as KeyboardInterrupt or SystemExit) after classifying it. `failure` tells the caller what happened."""

    step: str
    item: str
    quarantine: Callable[[Exception], object] | None = None
    refusals_quarantine: bool = False
    failure: str = ""

    def __enter__(self) -> Isolated:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        kind = classify(exc)
        if kind == REFUSED and self.refusals_quarantine:
            kind = FAILED
        self.failure = kind
        extra = {"step": self.step, "item": self.item, "error": f"{type(exc).__name__}: {exc}"[:500]}
        if kind == TRANSIENT:  # a gate that is not serving is routine (info); a database error is not (warning)
            level = logging.INFO if isinstance(exc, ConnectorError) else logging.WARNING
            log.log(level, "%s on %s deferred: transient %s", self.step, self.item, type(exc).__name__, extra=extra)
            return True
        if kind == REFUSED:
            log.info("%s on %s refused: %s", self.step, self.item, getattr(exc, "code", ""), extra=extra)
            return True
        log.error("%s on %s failed; the item is quarantined and the sweep moves on", self.step, self.item,
                  exc_info=(exc_type, exc, tb), extra=extra)
        if self.quarantine is not None:
            try:
                self.quarantine(exc)
            except Exception:  # noqa: BLE001 - the sweep must move on; the next sweep tries again
                log.exception("quarantine of %s after %s failed", self.item, self.step, extra=extra)
        return True


def isolated(*, step: str, item: str, quarantine: Callable[[Exception], object] | None = None,
             refusals_quarantine: bool = False) -> Isolated:
    return Isolated(step=step, item=item, quarantine=quarantine, refusals_quarantine=refusals_quarantine)


def isolated_batches(items: list, run: Callable[[list], R], *, step: str, describe: Callable[[object], str],
                     quarantine_of: Callable[[object], Callable[[Exception], object]] | None = None,
                     refusals_quarantine: bool = False) -> list[R]:
    """Run the items as one batch (`run(items)`, one transaction that rolls back as a whole when it raises); a
    batch that raises is split in two halves, each run again in order, until the failing item stands alone. A lone
    item runs `isolated`: a deterministic failure is quarantined with its reason code (`quarantine_of(item)`), a
    transient or refused one is logged and the item left as it was. A poison item among n therefore costs about
    2 log2 n extra transactions and never holds the others back. Returns the results of the runs that committed,
    in item order."""
    results: list[R] = []
    pending = [list(items)] if items else []
    while pending:
        batch = pending.pop(0)
        if len(batch) == 1:
            item = batch[0]
            with isolated(step=step, item=describe(item), refusals_quarantine=refusals_quarantine,
                          quarantine=quarantine_of(item) if quarantine_of is not None else None):
                results.append(run(batch))
            continue
        try:
            results.append(run(batch))
        except Exception as exc:  # noqa: BLE001 - rolled back as a whole: split until the failing item stands alone
            log_fallback(log, exc, "%s: a batch of %d rolled back; split in two", step, len(batch))
            half = len(batch) // 2
            pending[:0] = [batch[:half], batch[half:]]
    return results


def _message(exc: Exception) -> str:
    """The exception's text as PostgreSQL can store it: no NUL, no lone surrogate, bounded."""
    text = str(exc).replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return text[:StepFailure.MESSAGE_LIMIT]


def step_failure_record(*, entity, step: str, reason: str, exc: Exception, from_state: str = "",
                        to_state: str = "") -> StepFailure:
    """Append the evidence row and its audit row, inside the quarantining transaction (used by effects too)."""
    assert transaction.get_connection().in_atomic_block, "evidence is written with the quarantine it explains"
    failure = StepFailure.objects.create(
        entity_type=type(entity)._meta.label, entity_id=str(entity.pk), step=step, reason_code=reason,
        exception_class=f"{type(exc).__module__}.{type(exc).__qualname__}"[:255], message=_message(exc))
    audit_record(actor=QUARANTINER, entity=entity, action=f"quarantine:{step}", from_state=from_state,
                 to_state=to_state or reason, reason=f"{reason}: {failure.exception_class}: {failure.message}")
    return failure


# -- the connector's items -------------------------------------------------------------------------------------

def receipt_hold(exc: Exception, *, receipt_pk: int, step: str) -> bool:
    """Hold a Receipt's MaterializationDue row (MATERIALIZATION_FAILED). Locks the Receipt (as a materializer
    does) so a concurrent materialization that completed wins; nothing is held then. Returns whether held."""
    with transaction.atomic():
        receipt = locks.receipt_for_update(receipt_pk)
        held = MaterializationDue.objects.filter(receipt_id=receipt_pk, held_reason="").update(
            held_reason=StepFailureReason.MATERIALIZATION_FAILED, held_at=timezone.now())
        if held:
            step_failure_record(entity=receipt, step=step, reason=StepFailureReason.MATERIALIZATION_FAILED, exc=exc,
                                from_state="due", to_state="held")
        return bool(held)


def materialization_release(*, receipt_pk: int, actor: Actor, reason: str) -> bool:
    """Put a held receipt back in the materialization queue (the operator's remediation once the cause is fixed:
    materialization derives only the missing children from the immutable Receipt, CV2-05-017). The evidence
    stays. Returns whether a hold was released."""
    if not reason.strip():
        raise TransitionRefused("a release needs a reason")
    with transaction.atomic():
        receipt = locks.receipt_for_update(receipt_pk)
        released = MaterializationDue.objects.filter(receipt_id=receipt_pk).exclude(held_reason="").update(
            held_reason="", held_at=None)
        if released:
            audit_record(actor=actor, entity=receipt, action="materialization_release",
                         from_state=StepFailureReason.MATERIALIZATION_FAILED, to_state="due", reason=reason)
        return bool(released)


def lane_halt(exc: Exception, *, lane_pk: int, step: str) -> bool:
    """Halt an open lane (LANE_STEP_FAILED): its partition waits for an operator, in order. Returns whether
    halted."""
    with transaction.atomic():
        lane = locks.lane_for_update(lane_pk)
        if lane.state != LaneState.OPEN:
            return False
        OrderingLane.objects.filter(pk=lane.pk).update(state=LaneState.HALTED,
                                                       halt_reason=StepFailureReason.LANE_STEP_FAILED,
                                                       fence=lane.fence + 1)
        step_failure_record(entity=lane, step=step, reason=StepFailureReason.LANE_STEP_FAILED, exc=exc,
                            from_state=LaneState.OPEN, to_state=LaneState.HALTED)
        return True


def lane_release(*, lane_pk: int, actor: Actor, reason: str) -> bool:
    """Reopen a lane halted with LANE_STEP_FAILED (only that reason: no ordering decision was taken while it was
    halted, so reopening changes no fact; every other halt has its own remediation). Returns whether reopened."""
    if not reason.strip():
        raise TransitionRefused("a release needs a reason")
    with transaction.atomic():
        lane = locks.lane_for_update(lane_pk)
        if lane.state != LaneState.HALTED or lane.halt_reason != StepFailureReason.LANE_STEP_FAILED:
            return False
        OrderingLane.objects.filter(pk=lane.pk).update(state=LaneState.OPEN, halt_reason="", fence=lane.fence + 1)
        audit_record(actor=actor, entity=lane, action="lane_release", from_state=LaneState.HALTED,
                     to_state=LaneState.OPEN, fence=lane.fence + 1, reason=reason)
        return True


def window_quarantine(exc: Exception, *, window_pk: int, step: str) -> bool:
    """`open -> quarantined` (WINDOW_SEAL_FAILED); later input of the key opens a successor window."""
    with transaction.atomic():
        window = locks.window_for_update(window_pk)
        if window.state != WindowState.OPEN:
            return False
        window.quarantine(reason=StepFailureReason.WINDOW_SEAL_FAILED)
        window.save()
        step_failure_record(entity=window, step=step, reason=StepFailureReason.WINDOW_SEAL_FAILED, exc=exc,
                            from_state=WindowState.OPEN, to_state=window.state)
        return True


def execution_quarantine(exc: Exception, *, execution_pk: int, step: str) -> bool:
    """`ready | waiting_dependency -> quarantined` (EXECUTION_STEP_FAILED): its waiting dependencies are
    rejected with the failure as evidence, and its lane (if it is the lane's active execution) halts with the
    same reason, exactly as a quarantined Runtime result halts it. Locks lane, execution, dependencies (the
    canonical order). Returns whether quarantined."""
    lane_id = Execution.objects.filter(pk=execution_pk).values_list("lane_id", flat=True).first()
    reason = StepFailureReason.EXECUTION_STEP_FAILED
    with transaction.atomic():
        lane = locks.lane_for_update(lane_id) if lane_id else None
        execution = locks.execution_for_update(execution_pk)
        if execution is None or execution.state not in (ExecutionState.READY, ExecutionState.WAITING_DEPENDENCY):
            return False
        was = execution.state
        now = timezone.now()
        for dependency_pk in execution.dependencies.filter(state=DependencyState.WAITING).values_list("pk",
                                                                                                       flat=True):
            dependency = locks.dependency_for_update(dependency_pk)
            dependency.reject(at=now, evidence=f"{reason} in {step}")
            dependency.save()
        execution.quarantine(reason=reason)
        execution.save()
        if lane is not None and lane.active_execution_id == execution.pk:
            OrderingLane.objects.filter(pk=lane.pk).update(active_execution=None, state=LaneState.HALTED,
                                                           halt_reason=reason, fence=lane.fence + 1)
        step_failure_record(entity=execution, step=step, reason=reason, exc=exc, from_state=was,
                            to_state=execution.state)
        return True


def epoch_verify_hold(exc: Exception, *, epoch_pk: int, step: str) -> bool:
    """Record EPOCH_VERIFY_FAILED for a prepared epoch: the sweeper stops re-verifying it (the evidence is the
    hold; a prepared epoch is only a candidate, and its remediation is `epoch_reject` and a new candidate)."""
    with transaction.atomic():
        epoch = locks.epoch_for_update(epoch_pk)
        if epoch_held(epoch_pk):
            return False
        step_failure_record(entity=epoch, step=step, reason=StepFailureReason.EPOCH_VERIFY_FAILED, exc=exc)
        return True


def epoch_held(epoch_pk: int) -> bool:
    return StepFailure.objects.filter(entity_type=ServingEpoch._meta.label, entity_id=str(epoch_pk),
                                      reason_code=StepFailureReason.EPOCH_VERIFY_FAILED).exists()


def failures_of(entity) -> list[StepFailure]:
    """The evidence rows of one item, newest first (admin pages, the board)."""
    return list(StepFailure.objects.filter(entity_type=type(entity)._meta.label, entity_id=str(entity.pk)))
