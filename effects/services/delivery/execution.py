"""Submit, outcome, poll and verification transitions of a delivery operation (the contract's automatic
transitions). Each function is one transaction that locks, in canonical order, the mutation gate (FOR SHARE), the
effect conflict domain lock row, the parent, the operation, and the remote job semaphore, then compare-and-swaps
the operation on its `revision`.

The submit transaction is the contract's atomic submit: capacity reservation, the attempt-scoped MAY_ATTEMPT
marker (created if absent), the attempt row and the CAS to SUBMITTING, all or nothing.
"""
from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from effects.delivery.contract import contract
from effects.delivery.errors import DeliveryError, DeliveryRequestInvalid
from effects.delivery.protocol import Answer
from effects.models import (
    DeliveryAttempt,
    DeliveryObservation,
    DeliveryOperation,
    DeliveryParent,
    MayAttemptMarker,
    RemoteJobSemaphore,
)
from effects.choices import CapacityState, ParentState

from . import finalization, journal
from .planning import check_generation_fence, domain_lock_for_update, unresolved_states
from .setup import binding_certified, contract_approved, semaphore_ensure
from .transitions import move

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubmitResult:
    submitted: bool
    waiting_for: str = ""  # capacity | in_flight_child | retry_due | state
    attempt: DeliveryAttempt | None = None


def operation_for_update(pk: int) -> DeliveryOperation:
    return DeliveryOperation.objects.select_for_update(of=("self",)).get(pk=pk)


def _observe(op: DeliveryOperation, *, kind: str, answer: Answer, attempt: DeliveryAttempt | None) -> None:
    op.observation_ordinal += 1
    DeliveryObservation.objects.create(
        operation=op, ordinal=op.observation_ordinal, attempt=attempt, kind=kind,
        acknowledgement=answer.acknowledgement, http_status=answer.http_status, applied_count=answer.applied,
        body_digest=bytes.fromhex(answer.body_sha256) if answer.body_sha256 else None,
        detail=(f"rolled_back={answer.rolled_back} payload_sha256={answer.payload_sha256} {answer.detail}").strip())


# -- submit ---------------------------------------------------------------------------------------------------

def submit(operation_pk: int) -> SubmitResult:
    """sealed|retry_wait -> submitting, guarded by the generation fence, the mutation gate and remote capacity.
    Refusals raise the contract's error and write nothing (a journal epoch mismatch also blocks the gate)."""
    if not contract_approved():
        raise DeliveryRequestInvalid("the delivery contract has no approval receipt: implementation is gated "
                                     "(BLOCKED_UNTIL_ADR_AND_SECURITY_APPROVAL)")
    try:
        return _submit(operation_pk)
    except DeliveryError as error:
        block = error.context.get("block")
        if block:
            journal.gate_block(reason=block[0], detail=block[1])
        if error.code in ("REST_DELIVERY_STALE_GENERATION", "REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT"):
            DeliveryOperation.objects.filter(pk=operation_pk).update(last_code=error.code, last_detail=error.detail)
        raise


def _submit(operation_pk: int) -> SubmitResult:
    head = DeliveryOperation.objects.select_related("profile", "binding", "parent").get(pk=operation_pk)
    profile, binding = head.profile, head.binding
    semaphore = semaphore_ensure(remote_principal_id=binding.remote_principal_id, profile=profile)
    with transaction.atomic():
        gate = journal.gate_guard_for_share()
        domain = domain_lock_for_update(head.domain_id)
        parent = DeliveryParent.objects.select_for_update().get(pk=head.parent_id)
        op = operation_for_update(operation_pk)
        if op.state not in ("sealed", "retry_wait"):
            return SubmitResult(False, "state")
        if op.state == "retry_wait" and op.next_attempt_after and op.next_attempt_after > timezone.now():
            return SubmitResult(False, "retry_due")
        if parent.state != ParentState.ADMITTED:
            raise DeliveryRequestInvalid("the parent plan is not admitted: no child submits before it")
        if binding_certified(binding) is None:
            raise DeliveryRequestInvalid(f"receiver binding {binding.name} has no current certification")
        check_generation_fence(domain=domain, kind=profile.scope_kind, policy=profile.mutation_policy,
                               rng=op.scope, gen_end=op.generation_end, revision=op.correction_revision,
                               exclude_parent_pk=parent.pk, for_submit=True)
        in_flight = parent.children.exclude(pk=op.pk).filter(state__in=unresolved_states(), reconciled=False)
        limit = 1 if profile.receiver_kind == "async_bulk_job" else int(
            profile.policy("concurrency_policy", {}).get("max_in_flight_children", 4))
        if in_flight.count() >= limit:
            return SubmitResult(False, "in_flight_child")
        if profile.receiver_kind == "async_bulk_job" and parent.children.filter(
                ordinal__lt=op.ordinal, execution__in=["PLANNED", "SEALED", "RETRY_WAIT"]).exists():
            return SubmitResult(False, "in_flight_child")  # the sequential child supervisor: in ordinal order
        sem = RemoteJobSemaphore.objects.select_for_update().get(pk=semaphore.pk)
        if sem.attempts.filter(capacity_state=CapacityState.RESERVED).count() >= sem.capacity:
            return SubmitResult(False, "capacity")
        ordinal = op.attempt_ordinal + 1
        attempt_id = uuid.uuid4()
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO effects_mayattemptmarker (kind, attempt_id, attempt_ordinal, operation_id,"
                " operation_namespace, parent_and_child_identity, generation, expected_journal_revision,"
                " journal_epoch, mutation_intent_digest, created_at) VALUES ('MAY_ATTEMPT', %s, %s, %s, %s, %s,"
                " %s, %s, %s, %s, now()) ON CONFLICT (operation_namespace, operation_id, attempt_ordinal)"
                " DO NOTHING",
                [attempt_id, ordinal, op.pk, bytes(op.namespace), f"{parent.parent_key}#{op.ordinal}",
                 op.explicit_generation, op.revision, gate.journal_epoch, bytes(op.mutation_intent_digest)])
        marker = MayAttemptMarker.objects.get(operation=op, attempt_ordinal=ordinal,
                                              operation_namespace=bytes(op.namespace))
        attempt = DeliveryAttempt.objects.create(operation=op, ordinal=ordinal, attempt_id=marker.attempt_id,
                                                 marker=marker, semaphore=sem)
        op.attempt_ordinal = ordinal
        op.next_attempt_after = None
        op.last_code, op.last_detail = "", ""
        move(op, "submitting", reason=f"attempt {ordinal} ({marker.attempt_id})")
    return SubmitResult(True, attempt=attempt)


def attempt_start_io(attempt_pk: int) -> DeliveryAttempt:
    """The egress adapter's pre-I/O compare-and-swap, committed before any byte leaves: the operation is
    SUBMITTING on this very attempt, its marker exists, the gate is enabled, and nobody started or settled it.
    A journal epoch mismatch found here blocks the gate at once, as in `submit`."""
    try:
        return _attempt_start_io(attempt_pk)
    except DeliveryError as error:
        block = error.context.get("block")
        if block:
            journal.gate_block(reason=block[0], detail=block[1])
        raise


def _attempt_start_io(attempt_pk: int) -> DeliveryAttempt:
    with transaction.atomic():
        journal.gate_guard_for_share()
        attempt = DeliveryAttempt.objects.select_related("marker").get(pk=attempt_pk)
        op = operation_for_update(attempt.operation_id)
        attempt = DeliveryAttempt.objects.select_for_update().get(pk=attempt_pk)
        if op.state != "submitting" or op.attempt_ordinal != attempt.ordinal:
            raise DeliveryRequestInvalid(f"operation is {op.state} at attempt {op.attempt_ordinal}: not this "
                                         "attempt's to send")
        if attempt.io_may_have_started or attempt.outcome:
            raise DeliveryRequestInvalid("this attempt already started or settled: never a second request")
        attempt.io_may_have_started = True
        attempt.io_started_at = timezone.now()
        attempt.save()
    return attempt


# -- outcomes -------------------------------------------------------------------------------------------------

def _settle(attempt: DeliveryAttempt, answer: Answer) -> None:
    attempt.outcome = answer.transport
    attempt.response_status = answer.http_status
    attempt.response_digest = bytes.fromhex(answer.body_sha256) if answer.body_sha256 else None
    attempt.evidence = answer.detail
    attempt.settled_at = timezone.now()
    attempt.save()


def record_submit_outcome(attempt_pk: int, answer: Answer) -> DeliveryOperation:
    """submitting -> retry_wait | final_not_started | accepted | verifying_success | verifying_failure |
    final_unknown_not_accepted, from what the egress adapter saw."""
    head = DeliveryAttempt.objects.select_related("operation").get(pk=attempt_pk)
    with transaction.atomic():
        domain_lock_for_update(head.operation.domain_id)
        op = operation_for_update(head.operation_id)
        attempt = DeliveryAttempt.objects.select_for_update().get(pk=attempt_pk)
        if op.state != "submitting" or op.attempt_ordinal != attempt.ordinal or attempt.outcome:
            log.warning("late outcome kept as evidence only", extra={"attempt": attempt_pk, "state": op.state})
            if not attempt.outcome:
                _settle(attempt, answer)
            return op
        _settle(attempt, answer)
        _observe(op, kind="submit", answer=answer, attempt=attempt)
        if answer.transport == "not_started":
            _not_started(op, attempt, answer)
        elif answer.transport == "ambiguous":
            op.last_code, op.last_detail = "REST_DELIVERY_REMOTE_EFFECT_UNKNOWN", answer.detail
            move(op, "final_unknown_not_accepted", reason=answer.detail)
        elif answer.acknowledgement == "ACCEPTED":
            op.remote_receipt_id = answer.receipt_id
            move(op, "accepted")
        elif answer.acknowledgement == "SUCCEEDED":
            op.applied_count = answer.applied
            move(op, "verifying_success")
        else:
            op.applied_count = answer.applied
            move(op, "verifying_failure")
    return op


def _not_started(op: DeliveryOperation, attempt: DeliveryAttempt, answer: Answer) -> None:
    retry = op.profile.policy("retry_policy", {})
    budget = float(retry.get("max_retry_after_seconds", 300))
    max_attempts = int(retry.get("max_attempts", 3))
    delay = answer.retry_after_seconds if answer.retry_after_seconds is not None else float(
        retry.get("backoff_seconds", 1)) * (2 ** (attempt.ordinal - 1))
    if answer.retry_after_seconds is not None and answer.retry_after_seconds > budget:
        finalization.release(attempt, "request_not_started")
        op.last_code = "REST_DELIVERY_RETRY_AFTER_EXCEEDS_BUDGET"
        op.last_detail = f"Retry-After {answer.retry_after_seconds}s exceeds the budget of {budget}s"
        move(op, "final_not_started", reason=op.last_detail)
    elif attempt.ordinal < max_attempts:
        finalization.release(attempt, "durable_retry_wait")
        op.next_attempt_after = timezone.now() + timedelta(seconds=delay)
        move(op, "retry_wait", reason=f"request not started; retry after {delay}s with the same delivery key")
    else:
        finalization.release(attempt, "request_not_started")
        op.last_code, op.last_detail = "REST_DELIVERY_UNSAFE_RETRY", "retry budget exhausted; the request never started"
        move(op, "final_not_started", reason=op.last_detail)


POLL_TARGETS = {"SUCCEEDED": "verifying_success", "FAILED": "verifying_failure",
                "CANCELLED": "verifying_cancelled", "EXPIRED": "verifying_expired"}


def record_poll(operation_pk: int, answer: Answer) -> DeliveryOperation:
    """The poll_receipt continuation: accepted|waiting -> waiting | verifying_* | final_unknown_*_ack."""
    head = DeliveryOperation.objects.get(pk=operation_pk)
    with transaction.atomic():
        domain_lock_for_update(head.domain_id)
        op = operation_for_update(operation_pk)
        if op.state not in ("accepted", "waiting"):
            return op
        _observe(op, kind="poll", answer=answer, attempt=None)
        ack = answer.acknowledgement
        if ack == "RUNNING":
            if op.state == "accepted":
                move(op, "waiting")
            else:
                op.save()
        elif ack in POLL_TARGETS:
            op.applied_count = answer.applied
            move(op, POLL_TARGETS[ack])
        else:
            op.last_code, op.last_detail = "REST_DELIVERY_PROTOCOL_UNKNOWN", answer.detail
            move(op, "final_unknown_accepted_ack" if op.state == "accepted" else "final_unknown_protocol_ack",
                 reason=answer.detail)
            finalization.after_final(op)
    return op


def _latest(op: DeliveryOperation) -> DeliveryObservation:
    return op.observations.order_by("-ordinal").first()


def verify(operation_pk: int) -> DeliveryOperation:
    """verifying_* -> a final tuple, by the receiver's counts (the verification contract):
    success: applied == records and the payload digest echoes the sealed one -> full (eligible); applied ==
    records but a different digest -> full_unverified; another count -> partial (COUNT_MISMATCH); no count ->
    unknown. failure/cancelled/expired: rolled back or 0 applied -> no effect; some -> partial; no count -> unknown.
    The acknowledgement axis is preserved in every case (the contract's tuples)."""
    head = DeliveryOperation.objects.get(pk=operation_pk)
    with transaction.atomic():
        domain_lock_for_update(head.domain_id)
        parent = DeliveryParent.objects.select_for_update().get(pk=head.parent_id)
        op = operation_for_update(operation_pk)
        if op.axis("execution") != "VERIFYING" or op.axis("remote_effect") != "UNDETERMINED":
            return op
        obs = _latest(op)
        applied = obs.applied_count if obs else None
        rolled_back = bool(obs and "rolled_back=True" in obs.detail)
        echo = ""
        if obs and "payload_sha256=" in obs.detail:
            echo = obs.detail.split("payload_sha256=", 1)[1].split(" ", 1)[0]
        suffix = {"SUCCEEDED": "success_ack", "FAILED": "failed_ack", "CANCELLED": "cancelled_ack",
                  "EXPIRED": "expired_ack"}[op.axis("acknowledgement")]
        if op.state == "verifying_success":
            if applied is None:
                target, code = "final_unknown_success_ack", "REST_DELIVERY_REMOTE_EFFECT_UNKNOWN"
            elif applied != op.record_count:
                target, code = "final_partial_success_ack", "REST_DELIVERY_COUNT_MISMATCH"
            elif echo != hashlib.sha256(bytes(op.payload)).hexdigest():
                target, code = "final_full_unverified", "REST_DELIVERY_COUNT_MISMATCH"
            else:
                target, code = "final_full_eligible", ""
        elif rolled_back or applied == 0:
            target, code = f"final_no_effect_{suffix}", ""
        elif applied is None:
            target = f"final_unknown_{suffix}"
            code = "REST_DELIVERY_RECEIPT_EXPIRED" if suffix == "expired_ack" else \
                "REST_DELIVERY_REMOTE_EFFECT_UNKNOWN"
        else:
            target, code = f"final_partial_{suffix}", "REST_DELIVERY_PARTIALLY_APPLIED"
        op.last_code = code
        op.last_detail = f"applied {applied} of {op.record_count}" if code else ""
        move(op, target, reason=op.last_detail)
        finalization.after_final(op, parent=parent)
    return op
