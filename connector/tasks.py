"""Thin Celery tasks: each takes ids, calls one service, and is safe to run twice (the service re-checks state
under its lock). Redis only wakes workers; beat runs the sweepers so a lost message only delays work. Each item
runs isolated (connector.services.poison, decision D-168): a deterministic failure quarantines that item and
never fails the task or the items after it."""
from __future__ import annotations

import logging
import os
import socket
import time
from contextlib import nullcontext
from datetime import timedelta
from functools import partial

import redis
from celery import shared_task
from django.conf import settings
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError

from connector import tracing
from connector.choices import SweepStep
from connector.models import ReceiptTrace
from connector.selectors import lanes as lane_selectors
from connector.selectors import materialization
from connector.services import execution, materialize, poison, statistics, sweeper

log = logging.getLogger(__name__)
BROKER_ERRORS = (KombuOperationalError, RedisError, OSError)

HOLDER = f"{socket.gethostname()}:{os.getpid()}"


@shared_task(name="connector.tasks.serving_epoch_sweep", acks_late=True, ignore_result=True)
def serving_epoch_sweep() -> dict[str, list[int]]:
    report = sweeper.serving_epoch_sweep()
    return {"verified": report.verified, "rejected": report.rejected, "deferred": report.deferred}


@shared_task(name="connector.tasks.statistics_sweep", acks_late=True, ignore_result=True)
def statistics_sweep() -> list[str]:
    """Planner statistics for the tables that have none yet or outgrew theirs (connector.services.statistics)."""
    analyzed = statistics.statistics_analyze_stale()
    if analyzed:
        log.info("planner statistics refreshed", extra={"tables": analyzed})
    return analyzed


@shared_task(name="connector.tasks.inbound_sweep", acks_late=True, ignore_result=True)
def inbound_sweep() -> dict[str, int]:
    """The sweep wakes the batch materializer of each account with receipts due for more than 2 s instead of
    materializing them itself (a live worker's work is never repeated, D-270); a wake already pending for the
    account is not repeated. When the broker cannot be reached, the sweep materializes every due receipt itself
    (losing Redis loses no work); otherwise it materializes only receipts still due after `MATERIALIZE_STUCK`
    seconds whose account has no run alive (a wake lost with its debounce key still set, or no materialization
    worker consuming): a live run (its key refreshed, `run`) is never duplicated, however long its burst."""
    grace, running = 2, set()
    try:
        due = materialization.due_slots(before=timezone.now() - timedelta(seconds=grace), slots=_slots())
        for account_pk, slot in due:
            materialization_wake(account_pk, slot)
        running = running_accounts(sorted({account_pk for account_pk, _ in due}))
    except BROKER_ERRORS as exc:
        log.warning("materialization wake-up failed; the sweep materializes the due receipts itself",
                    extra={"error": f"{type(exc).__name__}: {exc}"})
    else:
        grace = int(settings.CONNECTOR.get("MATERIALIZE_STUCK_SECONDS", 60))
    report = sweeper.inbound_sweep(materialize_grace_seconds=grace, materialize_skip_accounts=running)
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


# -- the batch materializer (issue 18: woken per batch, never per item; D-269) ------------------------------------

_CLIENTS: dict[str, redis.Redis] = {}


def _redis() -> redis.Redis:
    """The broker's Redis (the debounce key lives where the wake-up goes: both are lost together)."""
    url = settings.CELERY_BROKER_URL
    client = _CLIENTS.get(url)
    if client is None:
        client = _CLIENTS[url] = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    return client


def _wake_key(account_pk: int | str, slot: int | str = 0) -> str:
    """The debounce key of one account's slot, behind the deployment's Redis key prefix (the broker's own keys
    carry the same prefix: CONNECTOR_REDIS_KEY_PREFIX)."""
    return f"{settings.CONNECTOR_REDIS_KEY_PREFIX}connector:wake:materialize:{account_pk}:{slot}"


def _slots() -> int:
    return max(1, int(settings.CONNECTOR.get("MATERIALIZE_SLOTS", 2)))


def slot_of(receipt_pk: int) -> int:
    """The run of its account that takes the receipt: `MATERIALIZE_SLOTS` runs of one account work in parallel
    on disjoint receipts (receipt pk modulo the slots), never on the same one."""
    return receipt_pk % _slots()


def materialization_wake(account_pk: int, slot: int = 0) -> bool:
    """Wake one batch materializer for the account unless one is already pending or running (a Redis `SET NX`
    with a short TTL, `MATERIALIZE_WAKE_TTL` seconds): a burst of admissions sends one message, not one per
    receipt. Returns whether a message was sent. Raises the broker's errors: the caller logs them, and the
    sweeper materializes from MaterializationDue (PostgreSQL stays the authority; Redis only wakes)."""
    key = _wake_key(account_pk, slot)
    if not _redis().set(key, b"1", nx=True, ex=_ttl()):
        return False
    try:
        materialize_due.delay(account_pk, slot)
    except BaseException:
        try:
            _redis().delete(key)
        except RedisError:
            pass  # the TTL ends the debounce
        raise
    return True


RUNNING = b"run"


def _ttl() -> int:
    return max(1, int(settings.CONNECTOR.get("MATERIALIZE_WAKE_TTL", 10)))


class _Holding:
    """A run keeps its account's debounce key alive (value `run`) while it drains, refreshed at most every
    second: no second run starts for the account meanwhile, and the sweep sees a live run (D-270). A run that
    dies stops refreshing; the key expires within the TTL and the next admission or sweep wakes again."""

    def __init__(self, account_pk: int | None, slot: int = 0) -> None:
        self.account_pk, self.slot, self.last = account_pk, slot, 0.0

    def refresh(self) -> None:
        if self.account_pk is None or time.monotonic() - self.last < 1.0:
            return
        self.last = time.monotonic()
        try:
            _redis().set(_wake_key(self.account_pk, self.slot), RUNNING, ex=_ttl())
        except RedisError:
            pass  # Redis only wakes: the run goes on, the sweep may take some receipts too (the lock serializes)


def running_accounts(account_pks: list[int]) -> set[int]:
    """The accounts among `account_pks` with a batch materializer running now (a slot's key says `run`)."""
    if not account_pks:
        return set()
    keys = [(pk, _wake_key(pk, slot)) for pk in account_pks for slot in range(_slots())]
    values = _redis().mget([key for _, key in keys])
    return {pk for (pk, _), value in zip(keys, values) if value == RUNNING}


def _wake_release(account_pk: int, slot: int, attempted: set[int]) -> bool:
    """End of a run: drop the debounce key, then look once more. A receipt committed before the drop is seen by
    this read; one committed after it sends its own wake-up (its SET NX succeeds). Returns whether this run
    goes on (work remains and no other wake took the key meanwhile)."""
    try:
        _redis().delete(_wake_key(account_pk, slot))
    except RedisError:
        pass  # the TTL ends it
    if not materialization.due_receipts(account_id=account_pk, limit=1, skip=attempted, slot=(slot, _slots())):
        return False
    try:
        return bool(_redis().set(_wake_key(account_pk, slot), RUNNING, nx=True, ex=_ttl()))
    except RedisError:
        return True


class _ClaimWakes:
    """One claim wake-up per CLAIM_BATCH executions made ready, sent as soon as a batch is full (the first
    results do not wait for the end of the materialization batch), the remainder at the end."""

    def __init__(self) -> None:
        self.pending = 0

    def add(self, n: int) -> None:
        self.pending += n
        while self.pending >= _batch():
            self.pending -= _batch()
            self._send()

    def flush(self) -> None:
        if self.pending:
            self.pending = 0
            self._send()

    @staticmethod
    def _send() -> None:
        try:
            execution_claim_and_run.delay()
        except BROKER_ERRORS as exc:  # the sweeper counts claimable executions and wakes the claimers
            log.warning("claim wake-up not sent", extra={"error": f"{type(exc).__name__}: {exc}"})


def _advance(lanes, account_id: int) -> int:
    """Advance the lanes of one account in one transaction (`execution.lanes_advance`), a failing batch split until
    the failing lane stands alone and is halted with LANE_STEP_FAILED (`poison.isolated_batches`). Returns the
    Executions minted."""
    results = poison.isolated_batches(
        sorted(lanes), lambda batch: execution.lanes_advance(lane_pks=batch, account_id=account_id),
        step=SweepStep.LANE_ADVANCE, describe=lambda lane_pk: f"lane {lane_pk}",
        quarantine_of=lambda lane_pk: partial(poison.lane_halt, lane_pk=lane_pk, step=SweepStep.LANE_ADVANCE))
    return sum(len(minted) for minted in results)


def _advance_inline(lanes, account_id: int, claims: _ClaimWakes) -> None:
    """Advance materialized lanes inline (`_advance`), one claim wake-up per batch of minted Executions."""
    if lanes:
        claims.add(_advance(lanes, account_id))


def _materialize(due: list[tuple[int, int]], claims: _ClaimWakes) -> None:
    """The due receipts of each account materialized in one transaction (`materialize.receipts_materialize`), a
    failing batch split until the failing receipt stands alone and is held with MATERIALIZATION_FAILED
    (`poison.isolated_batches`; a materialization is a pure function of immutable inputs, so its refusal is
    deterministic too); then their lanes advanced inline (`_advance`). While tracing is on, every receipt is a
    batch of one inside its own stage span, continuing its admission's trace."""
    by_account: dict[int, list[int]] = {}
    for receipt_pk, account_pk in due:
        by_account.setdefault(account_pk, []).append(receipt_pk)
    for account_pk, pks in sorted(by_account.items()):
        batches = [[pk] for pk in pks] if tracing.enabled() else [pks]
        for batch in batches:
            with tracing.stage("receipt_materialize", ReceiptTrace, log={"receipt_id": batch[0]},
                               receipt_id=batch[0]) if len(batch) == 1 else nullcontext():
                results = poison.isolated_batches(
                    batch, lambda part, account_pk=account_pk: materialize.receipts_materialize(
                        receipt_pks=part, account_id=account_pk),
                    step=SweepStep.RECEIPT_MATERIALIZE, describe=lambda pk: f"receipt {pk}", refusals_quarantine=True,
                    quarantine_of=lambda pk: partial(poison.receipt_hold, receipt_pk=pk,
                                                     step=SweepStep.RECEIPT_MATERIALIZE))
            for out in results:
                claims.add(len(out.executions))
                _advance_inline(out.lanes, account_pk, claims)


@shared_task(name="connector.tasks.materialize_due", acks_late=True, ignore_result=True)
def materialize_due(account_id: int | None = None, slot: int = 0) -> int:
    """Materialize the account's due receipts, oldest first, `MATERIALIZE_BATCH` per read, until none is left
    (D-269). The receipts of one read and one account are one transaction (`_materialize`); a receipt already
    materialized by another worker is found complete under its lock and skipped (the service's receipt lock
    serializes two runs). At most `MATERIALIZE_ROUNDS` reads per run, then the run hands over to a fresh wake-up. `account_id`
    None (no account known) takes one batch across accounts. `slot`: this run's share of the account's receipts
    (`slot_of`), so the account's runs work in parallel without repeating each other. Returns the number of
    receipts attempted."""
    size = max(1, int(settings.CONNECTOR.get("MATERIALIZE_BATCH", 50)))
    rounds = max(1, int(settings.CONNECTOR.get("MATERIALIZE_ROUNDS", 20)))
    attempted: set[int] = set()
    claims = _ClaimWakes()
    holding = _Holding(account_id, slot)
    share = (slot, _slots()) if account_id is not None else None
    try:
        for _ in range(rounds):
            holding.refresh()
            due = materialization.due_receipts(account_id=account_id, limit=size, skip=attempted, slot=share)
            if not due:
                if account_id is None or not _wake_release(account_id, slot, attempted):
                    return len(attempted)
                continue
            attempted.update(receipt_pk for receipt_pk, _ in due)
            _materialize(due, claims)
            holding.refresh()
            if account_id is None:
                return len(attempted)
        if account_id is not None:  # rounds spent with work left: hand over to a fresh run
            try:
                _redis().delete(_wake_key(account_id, slot))
                materialization_wake(account_id, slot)
            except BROKER_ERRORS as exc:
                log.warning("materialization wake-up failed; the sweeper will materialize the rest",
                            extra={"error": f"{type(exc).__name__}: {exc}"})
        return len(attempted)
    finally:
        claims.flush()


@shared_task(name="connector.tasks.lane_advance", acks_late=True, ignore_result=True)
def lane_advance(lane_pk: int, account_id: int | None = None) -> None:
    """`account_id` travels with the lane's pk, as for materialization; None (an older message) reads it first."""
    if account_id is None:
        account_id = lane_selectors.lane_account(lane_pk)
        if account_id is None:
            return  # no such lane
    if _advance([lane_pk], account_id):  # the wake-up stays outside the isolated step: not the lane's fault
        execution_claim_and_run.delay()


def _batch() -> int:
    return max(1, int(settings.CONNECTOR.get("CLAIM_BATCH", 10)))


@shared_task(name="connector.tasks.execution_claim_and_run", acks_late=True, ignore_result=True)
def execution_claim_and_run(limit: int = 20) -> int:
    """Claim batches fairly across accounts and run them one by one, up to `limit` executions
    (`execution.execution_claim_batch_and_run`, D-204..D-206); each result commits before the next run, and a
    quarantined one never stops the loop. The completed executions' lanes mint their successors inline, an account's
    lanes in one transaction (D-398)."""
    done, minted = 0, 0
    while done < limit:
        ran = execution.execution_claim_batch_and_run(holder=HOLDER, n=min(_batch(), limit - done),
                                                      lease_seconds=settings.CONNECTOR["LEASE_SECONDS"])
        if not ran:
            break
        minted += _advance_completed_lanes(ran)
        done += len(ran)
    if minted:  # this loop may have ended before claiming them: one wake-up for the successors it minted
        _ClaimWakes._send()
    return done


def _advance_completed_lanes(ran) -> int:
    """The lanes of one claims step's executions advanced inline, per account in one transaction (`_advance`,
    D-295/D-398). Returns the Executions minted here."""
    by_account: dict[int, set[int]] = {}
    for result in ran:
        if result.lane_id:
            by_account.setdefault(result.account_id, set()).add(result.lane_id)
    return sum(_advance(lanes, account_pk) for account_pk, lanes in sorted(by_account.items()))
