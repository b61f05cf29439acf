"""Thin Celery tasks: each takes ids, calls one service, and is safe to run twice (the service re-checks state
under its lock). Redis only wakes workers; beat runs the sweepers so a lost message only delays work. Each item
runs isolated (connector.services.poison, decision D-168): a deterministic failure quarantines that item and
never fails the task or the items after it."""
from __future__ import annotations

import os
import socket
from functools import partial

from celery import shared_task
from django.conf import settings

from connector import tracing
from connector.choices import SweepStep
from connector.models import ReceiptTrace
from connector.services import execution, materialize, poison, sweeper

HOLDER = f"{socket.gethostname()}:{os.getpid()}"


@shared_task(name="connector.tasks.serving_epoch_sweep", acks_late=True, ignore_result=True)
def serving_epoch_sweep() -> dict[str, list[int]]:
    report = sweeper.serving_epoch_sweep()
    return {"verified": report.verified, "rejected": report.rejected, "deferred": report.deferred}


@shared_task(name="connector.tasks.inbound_sweep", acks_late=True, ignore_result=True)
def inbound_sweep() -> dict[str, int]:
    report = sweeper.inbound_sweep()
    if report.claimable:  # one wake-up per batch of claimable work (D-206), at most 8
        for _ in range(min(-(-report.claimable // _batch()), 8)):
            execution_claim_and_run.delay()
    return vars(report)


@shared_task(name="connector.tasks.receipt_materialize", acks_late=True, ignore_result=True)
@tracing.entry("receipt_materialize", ReceiptTrace, arg="receipt_pk", lookup="receipt_id", log="receipt_id")
def receipt_materialize(receipt_pk: int, account_id: int | None = None) -> None:
    """`account_id` travels with the pk (the first read names it, docs/scale-out.md); a message from before it was
    carried has none and the service looks the receipt up by its pk once."""
    out = None
    with poison.isolated(step=SweepStep.RECEIPT_MATERIALIZE, item=f"receipt {receipt_pk}", refusals_quarantine=True,
                         quarantine=partial(poison.receipt_hold, receipt_pk=receipt_pk,
                                            step=SweepStep.RECEIPT_MATERIALIZE)):
        out = materialize.receipt_materialize(receipt_pk=receipt_pk, account_id=account_id)
    if out is None:
        return  # transient: the sweeper retries from MaterializationDue; failed: the receipt is held
    for lane_pk in out.lanes:
        lane_advance.delay(lane_pk, out.account_id)
    if out.executions:  # one wake-up per batch, not per item (D-206)
        for _ in range(-(-len(out.executions) // _batch())):
            execution_claim_and_run.delay()


@shared_task(name="connector.tasks.lane_advance", acks_late=True, ignore_result=True)
def lane_advance(lane_pk: int, account_id: int | None = None) -> None:
    """`account_id` travels with the lane's pk, as for materialization; None (an older message) reads by pk."""
    minted = None
    with poison.isolated(step=SweepStep.LANE_ADVANCE, item=f"lane {lane_pk}",
                         quarantine=partial(poison.lane_halt, lane_pk=lane_pk, step=SweepStep.LANE_ADVANCE)):
        minted = execution.lane_advance(lane_pk=lane_pk, account_id=account_id)
    if minted is not None:  # the wake-up stays outside the isolated step: a broker error is not the lane's fault
        execution_claim_and_run.delay()


def _batch() -> int:
    return max(1, int(settings.CONNECTOR.get("CLAIM_BATCH", 10)))


@shared_task(name="connector.tasks.execution_claim_and_run", acks_late=True, ignore_result=True)
def execution_claim_and_run(limit: int = 20) -> int:
    """Claim batches fairly across accounts and run them one by one, up to `limit` executions
    (`execution.execution_claim_batch_and_run`, D-204..D-206); each result commits before the next run, and a
    quarantined one never stops the loop. Each completed execution's lane is woken to mint its successor."""
    done = 0
    while done < limit:
        ran = execution.execution_claim_batch_and_run(holder=HOLDER, n=min(_batch(), limit - done),
                                                      lease_seconds=settings.CONNECTOR["LEASE_SECONDS"])
        if not ran:
            break
        for result in ran:
            if result.lane_id:
                lane_advance.delay(result.lane_id, result.account_id)
        done += len(ran)
    return done
