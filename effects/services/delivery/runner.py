"""Driving operations forward: one step at a time (Celery `delivery` tasks and the CLI call these), orphan
recovery by attempt ID, and the sweep that finds due work so that a lost broker message only delays.

Orphan recovery (`journal_reconciliation_by_attempt_id`): an operation left SUBMITTING by a dead worker is
settled from its attempt's durable facts alone. `io_may_have_started` false proves the request never left (the
egress adapter commits it before any byte): the attempt settles `not_started` and the operation goes to
retry_wait (same delivery key) or final_not_started. True without an outcome means the mutation may have been
applied: the operation goes to final_unknown_not_accepted and waits for an operator. No second request is ever
sent without that proof.

Each operation runs isolated (decision D-168): a deterministic failure of its step or of its orphan recovery holds
it (`held_reason` DELIVERY_STEP_FAILED, the contract state unchanged) and the sweep moves on; held operations are
neither stepped nor swept until an operator releases them.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial

from django.db.models import Q
from django.utils import timezone

from connector.choices import SweepStep
from connector.faults import fault_point
from connector.services import poison
from effects import egress
from effects.delivery.errors import DeliveryError
from effects.delivery.protocol import Answer
from effects.models import DeliveryAttempt, DeliveryOperation, DeliveryParent

from ..poison import delivery_hold
from . import execution
from .planning import unresolved_states

log = logging.getLogger(__name__)


def step(operation_pk: int) -> str:
    """Advance one operation by at most one step; returns its state afterwards."""
    op = DeliveryOperation.objects.get(pk=operation_pk)
    if op.held_reason:
        return op.state  # held for an operator after a step failed (decision D-168)
    if op.state in ("sealed", "retry_wait"):
        try:
            result = execution.submit(op.pk)
        except DeliveryError as error:
            log.info("submit refused", extra={"operation": op.pk, "code": error.code})
            return DeliveryOperation.objects.get(pk=op.pk).state
        if result.submitted:
            fault_point("delivery.after_submit")  # SUBMITTING + marker + attempt committed, no I/O marked yet
            egress.delivery_send(attempt_pk=result.attempt.pk)
    elif op.state == "submitting":
        recover_orphan(op.pk, min_age=timedelta(seconds=60))
    elif op.state in ("accepted", "waiting"):
        egress.delivery_poll(operation_pk=op.pk)
    elif op.axis("execution") == "VERIFYING" and op.axis("remote_effect") == "UNDETERMINED":
        execution.verify(op.pk)
    return DeliveryOperation.objects.get(pk=op.pk).state


def _isolated(step_name: str, operation_pk: int) -> poison.Isolated:
    return poison.isolated(step=step_name, item=f"delivery operation {operation_pk}",
                           quarantine=partial(delivery_hold, operation_pk=operation_pk, step=step_name))


def step_isolated(operation_pk: int) -> str:
    """`step`, isolated: a deterministic failure holds the operation (DELIVERY_STEP_FAILED) instead of failing
    the worker; returns the state afterwards (unchanged by a failure)."""
    with _isolated(SweepStep.DELIVERY_STEP, operation_pk):
        return step(operation_pk)
    return DeliveryOperation.objects.values_list("state", flat=True).get(pk=operation_pk)


def drive_parent(parent_pk: int, *, max_steps: int = 200, poll_interval: float = 0.05) -> list[str]:
    """Step every child of a parent until none can move (finals, waits for capacity or time). For the CLI and
    tests; workers use the Celery tasks."""
    import time

    parent = DeliveryParent.objects.get(pk=parent_pk)
    for _ in range(max_steps):
        moved = False
        for child in parent.children.order_by("ordinal"):
            before = (child.state, child.observation_ordinal)
            if child.state.startswith("final_") or child.state.startswith("reconciling_"):
                continue
            after = step(child.pk)
            child.refresh_from_db()
            moved = moved or (after, child.observation_ordinal) != before
        if not moved:
            pending = parent.children.filter(state__in=["accepted", "waiting", "retry_wait"]).exists()
            if not pending:
                break
            time.sleep(poll_interval)
    return list(parent.children.order_by("ordinal").values_list("state", flat=True))


def recover_orphan(operation_pk: int, *, min_age: timedelta | None = None) -> str:
    """Settle a SUBMITTING operation whose worker is gone, from its attempt's durable facts (see module doc).
    `min_age`: only attempts older than this (the sweeper passes the attempt lease); time only decides when to
    look, never what happened."""
    op = DeliveryOperation.objects.get(pk=operation_pk)
    if op.state != "submitting":
        return op.state
    attempt = DeliveryAttempt.objects.filter(operation=op, ordinal=op.attempt_ordinal).first()
    if attempt is None or attempt.outcome:
        return op.state
    if min_age is not None and attempt.created_at > timezone.now() - min_age:
        return op.state
    if attempt.io_may_have_started:
        answer = Answer("ambiguous", detail=f"worker lost after io_may_have_started (attempt {attempt.attempt_id});"
                                            " the mutation may have been applied")
    else:
        answer = Answer("not_started", detail=f"worker lost before io_may_have_started (attempt "
                                              f"{attempt.attempt_id}): the request never left")
    return execution.record_submit_outcome(attempt.pk, answer).state


def sweep(*, lease: timedelta = timedelta(seconds=60)) -> dict:
    """Find due work: retry_wait past its time, sealed children, receipts to poll, verifications to finish, and
    SUBMITTING orphans older than the lease; held operations excepted. Returns counts by kind (the task enqueues
    `step` for each)."""
    now = timezone.now()
    due = DeliveryOperation.objects.filter(held_reason="").filter(
        Q(state="sealed") | Q(state="retry_wait", next_attempt_after__lte=now)
        | Q(state__in=["accepted", "waiting"]) | Q(execution="VERIFYING", remote_effect="UNDETERMINED"))
    ids = list(due.values_list("pk", flat=True)[:500])
    orphans = 0
    for pk in DeliveryOperation.objects.filter(state="submitting", held_reason="").values_list("pk", flat=True)[:500]:
        with _isolated(SweepStep.DELIVERY_RECOVER_ORPHAN, pk):
            if recover_orphan(pk, min_age=lease) != "submitting":
                orphans += 1
    return {"due": ids, "orphans_recovered": orphans, "unresolved": DeliveryOperation.objects.filter(
        state__in=unresolved_states()).count()}
