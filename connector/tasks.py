"""Thin Celery tasks: each takes ids, calls one service, and is safe to run twice (the service re-checks state
under its lock). Redis only wakes workers; beat runs the sweepers so a lost message only delays work."""
from __future__ import annotations

import os
import socket

from celery import shared_task
from django.conf import settings

from connector.errors import ConnectorError
from connector.services import execution, materialize, sweeper

HOLDER = f"{socket.gethostname()}:{os.getpid()}"


@shared_task(name="connector.tasks.serving_epoch_sweep", acks_late=True, ignore_result=True)
def serving_epoch_sweep() -> dict[str, list[int]]:
    report = sweeper.serving_epoch_sweep()
    return {"verified": report.verified, "rejected": report.rejected, "deferred": report.deferred}


@shared_task(name="connector.tasks.inbound_sweep", acks_late=True, ignore_result=True)
def inbound_sweep() -> dict[str, int]:
    report = sweeper.inbound_sweep()
    if report.claimable:
        for _ in range(min(report.claimable, 8)):
            execution_claim_and_run.delay()
    return vars(report)


@shared_task(name="connector.tasks.receipt_materialize", acks_late=True, ignore_result=True)
def receipt_materialize(receipt_pk: int) -> None:
    try:
        out = materialize.receipt_materialize(receipt_pk=receipt_pk)
    except ConnectorError:
        return  # the sweeper retries from MaterializationDue
    for lane_pk in out.lanes:
        lane_advance.delay(lane_pk)
    for _ in out.executions:
        execution_claim_and_run.delay()


@shared_task(name="connector.tasks.lane_advance", acks_late=True, ignore_result=True)
def lane_advance(lane_pk: int) -> None:
    try:
        if execution.lane_advance(lane_pk=lane_pk) is not None:
            execution_claim_and_run.delay()
    except ConnectorError:
        return


@shared_task(name="connector.tasks.execution_claim_and_run", acks_late=True, ignore_result=True)
def execution_claim_and_run(limit: int = 20) -> int:
    """Claim and run up to `limit` executions; each result commits before the next claim."""
    done = 0
    while done < limit:
        token = execution.execution_claim(holder=HOLDER, lease_seconds=settings.CONNECTOR["LEASE_SECONDS"])
        if token is None:
            break
        result = execution.execution_run(token=token)
        if result.lane_id:
            lane_advance.delay(result.lane_id)
        done += 1
    return done
