"""Thin Celery tasks of the `egress` queue; the sweeper finds due outbound work in PostgreSQL."""
from __future__ import annotations

from celery import shared_task

from connector.services import poison
from effects.services import recovery, worker
from effects.services.delivery import journal, runner, setup


@shared_task(name="effects.tasks.effect_dispatch", acks_late=True, ignore_result=True)
def effect_dispatch(limit: int = 20) -> int:
    """Up to `limit` effects, in worker steps of up to CONNECTOR["EGRESS_BATCH"] effects each (D-350)."""
    done, size = 0, worker.egress_batch_size()
    while done < limit:
        step = len(worker.effect_dispatch_batch(n=min(size, limit - done)))
        if not step:
            break
        done += step
    return done


@shared_task(name="effects.tasks.effects_sweep", acks_late=True, ignore_result=True)
def effects_sweep() -> dict[str, int]:
    report = worker.effects_sweep()
    if report["claimable"]:
        effect_dispatch.delay()
    return report


@shared_task(name="effects.tasks.uncertain_sweep", acks_late=True, ignore_result=True)
def uncertain_sweep() -> dict[str, int]:
    """Uncertain effects whose frozen idempotency contract proves a repeat safe, found in PostgreSQL: the due ones
    go back to `prepared` (effects.services.recovery, D-430); the egress is woken when any did."""
    report = recovery.uncertain_sweep()
    if report["recovered"]:
        effect_dispatch.delay()
    return report


@shared_task(name="effects.tasks.delivery_step", acks_late=True, ignore_result=True)
def delivery_step(operation_pk: int) -> str:
    """Advance one delivery operation by one step (queue `delivery`); the service re-reads and claims it. A
    deterministic failure holds the operation (DELIVERY_STEP_FAILED) instead of failing the worker."""
    return runner.step_isolated(operation_pk)


@shared_task(name="effects.tasks.delivery_sweep", acks_late=True, ignore_result=True)
def delivery_sweep() -> dict:
    """Find due delivery work in PostgreSQL (a lost broker message only delays), recover orphans by attempt ID,
    expire certifications due for recertification, and audit the journal (blocking the gate on a finding). Each
    part is isolated: a failure of one is logged with its traceback and never keeps the others from running."""
    findings = []
    with poison.isolated(step="delivery_sweep", item="certification expiry"):
        setup.certification_expire_due()
    with poison.isolated(step="delivery_sweep", item="journal audit"):
        findings = journal.journal_audit()
    report = runner.sweep()
    for pk in report["due"]:
        delivery_step.delay(pk)
    return {"due": len(report["due"]), "orphans_recovered": report["orphans_recovered"],
            "unresolved": report["unresolved"], "journal_findings": len(findings)}
