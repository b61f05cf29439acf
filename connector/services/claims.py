"""Claims: a ready Execution (or a fair batch of them across accounts) taken with `FOR UPDATE SKIP LOCKED`,
an Attempt appended and a new fenced lease, under the serving guard (CV2-07-016/017/018; D-204, D-205).
Split from connector.services.execution (module size, D-260), which re-exports these names."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from connector import locks
from connector.actors import Actor
from connector.choices import ExecutionState, SweepStep
from connector.faults import fault_point
from connector.models import Execution, ExecutionAttempt
from connector.services import poison
from connector.services.guard import ServingContext, lock_serving, lock_serving_accounts


log = logging.getLogger(__name__)
CLAIMANT = Actor.system("claimant")


@dataclass(frozen=True)
class ClaimToken:
    execution_pk: int
    lease_fence: int
    holder: str
    account_id: int | None = None  # the execution's account: the run's reads name it (docs/scale-out.md)


def execution_claim(*, holder: str, lease_seconds: int = 60, account_id: int | None = None) -> ClaimToken | None:
    """Claim one ready Execution whose lease is free or expired: lock gate and epoch (guard), then the Execution
    `FOR UPDATE SKIP LOCKED`, append an Attempt and a new lease fence. An expired lease is reacquired with the
    same Execution identity and command (CV2-07)."""
    now = timezone.now()
    candidates = Execution.objects.filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now),
                                          state=ExecutionState.READY)
    if account_id is not None:
        candidates = candidates.filter(account_id=account_id)
    for pk, acct, epoch_pk in candidates.order_by("pk").values_list("pk", "account_id", "epoch_id")[:20]:
        token = None
        # A ConnectorError (the gate moved) skips the candidate; a deterministic failure quarantines it
        # (EXECUTION_STEP_FAILED) so the next claim does not meet it again (decision D-168).
        with poison.isolated(step=SweepStep.EXECUTION_CLAIM, item=f"execution {pk}",
                             quarantine=partial(poison.execution_quarantine, execution_pk=pk,
                                                step=SweepStep.EXECUTION_CLAIM)):
            with transaction.atomic():
                ctx = lock_serving(account_id=acct)
                if ctx.epoch_pk != epoch_pk:
                    continue
                execution = locks.execution_for_update(pk, skip_locked=True, account_id=acct)
                now = timezone.now()
                if (execution is None or execution.state != ExecutionState.READY
                        or (execution.lease_expires_at is not None and execution.lease_expires_at >= now)):
                    continue
                ordinal = execution.attempt_count + 1
                fence = execution.lease_fence + 1
                expires = now + timedelta(seconds=lease_seconds)
                ExecutionAttempt.objects.create(execution=execution, ordinal=ordinal, holder=holder, lease_fence=fence,
                                                lease_expires_at=expires)
                Execution.objects.filter(pk=pk, account_id=acct).update(
                    attempt_count=ordinal, lease_fence=fence, lease_holder=holder, lease_expires_at=expires)
                token = ClaimToken(pk, fence, holder, acct)
        if token is None:
            continue
        fault_point("claim.after_commit")
        return token
    return None


# The batched claim's candidates (D-204/D-205), read without a lock: the accounts with ready work, found by a
# loose index scan of the ready-queue index in rotation order (from the process's cursor up, then wrapping
# around), at most `accounts` of them; then, per account (a LATERAL subquery naming its account, so it runs on
# the account's shard), its oldest claimable executions; then ranks interleaved round-robin: every account's
# first, then every account's second, ... An account's backlog therefore never delays another account's first.
# `group` (optional) restricts the claim to one account group (the scale-out path: one claimer per shard).
_CLAIM_CANDIDATES = """
WITH RECURSIVE upper_accounts(account_id, n) AS (
    (SELECT e.account_id, 1 FROM connector_execution e
     WHERE e.state = 'ready' AND e.account_id >= %(start)s
       AND (%(group)s::bigint[] IS NULL OR e.account_id = ANY(%(group)s::bigint[]))
     ORDER BY e.account_id LIMIT 1)
    UNION ALL
    SELECT (SELECT e.account_id FROM connector_execution e
            WHERE e.state = 'ready' AND e.account_id > u.account_id
              AND (%(group)s::bigint[] IS NULL OR e.account_id = ANY(%(group)s::bigint[]))
            ORDER BY e.account_id LIMIT 1), u.n + 1
    FROM upper_accounts u WHERE u.account_id IS NOT NULL AND u.n < %(accounts)s
), lower_accounts(account_id, n) AS (
    (SELECT e.account_id, 1 FROM connector_execution e
     WHERE e.state = 'ready' AND e.account_id < %(start)s
       AND (%(group)s::bigint[] IS NULL OR e.account_id = ANY(%(group)s::bigint[]))
     ORDER BY e.account_id LIMIT 1)
    UNION ALL
    SELECT (SELECT e.account_id FROM connector_execution e
            WHERE e.state = 'ready' AND e.account_id > l.account_id AND e.account_id < %(start)s
              AND (%(group)s::bigint[] IS NULL OR e.account_id = ANY(%(group)s::bigint[]))
            ORDER BY e.account_id LIMIT 1), l.n + 1
    FROM lower_accounts l WHERE l.account_id IS NOT NULL AND l.n < %(accounts)s
), rotation AS (
    SELECT account_id, wrap FROM (
        SELECT account_id, 0 AS wrap FROM upper_accounts WHERE account_id IS NOT NULL
        UNION ALL
        SELECT account_id, 1 AS wrap FROM lower_accounts WHERE account_id IS NOT NULL) a
    ORDER BY wrap, account_id LIMIT %(accounts)s
)
SELECT c.id, c.account_id, c.epoch_id
FROM rotation r CROSS JOIN LATERAL (
    SELECT e.id, e.account_id, e.epoch_id, row_number() OVER (ORDER BY e.id) AS rank
    FROM connector_execution e
    WHERE e.account_id = r.account_id AND e.state = 'ready'
      AND (e.lease_expires_at IS NULL OR e.lease_expires_at < %(now)s)
    ORDER BY e.id LIMIT %(n)s) c
ORDER BY c.rank, r.wrap, r.account_id
LIMIT %(n)s"""

# Where this process's next batch starts its rotation over accounts (round-robin across batches too).
_ROTATION = {"start": 0}


def execution_claim_batch(*, holder: str, n: int, lease_seconds: int = 60,
                          account_ids: list[int] | None = None) -> list[ClaimToken]:
    """Claim up to `n` ready Executions whose lease is free or expired, fairly across accounts, in one
    transaction (D-204, D-205, CV2-07-016/017/018). The one claim path of the worker (D-503): one Execution is a
    batch of one.

    1. Candidates (one statement, no lock): up to `n` claimable executions interleaved round-robin over the
       accounts that have ready work, starting from this process's rotation cursor (`_CLAIM_CANDIDATES`);
       `account_ids` restricts the claim to one account group.
    2. The serving guard of every account involved, in ascending account id, in one round trip
       (`guard.lock_serving_accounts`: per account its epoch, then its gate, FOR SHARE). An account whose gate
       does not serve is skipped; a candidate bound to another epoch than its account's guarded one is skipped.
    3. The remaining candidates locked `FOR UPDATE SKIP LOCKED` in ascending pk, re-checked (still ready, lease
       still free or expired, same epoch), leased with a new fence and Attempt ordinal, and their Attempts
       appended, in one statement (`locks.executions_lease`).

    A lease transaction that fails deterministically rolled back as a whole: each half of the candidates is leased
    again, until the Execution at fault stands alone and is quarantined (EXECUTION_STEP_FAILED, step
    execution_claim, D-503); a refusal or a transient failure of the whole batch raises (nothing was written), of
    a half is logged and leases nothing of that half.

    An expired lease is reacquired under the same Execution identity and command with a higher fence (CV2-07-017).
    Returns the tokens in claim order (round-robin over accounts); `fault_point("claim.after_commit")` fires
    once after the commits. Nothing is written for a skipped candidate; a refused guard never raises."""
    if n <= 0:
        return []
    now = timezone.now()
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(_CLAIM_CANDIDATES, {"start": _ROTATION["start"], "accounts": 2 * n, "n": n, "now": now,
                                           "group": sorted(account_ids) if account_ids is not None else None})
        candidates = cursor.fetchall()
    if not candidates:
        return []
    order = {pk: i for i, (pk, _, _) in enumerate(candidates)}
    _ROTATION["start"] = _next_start(candidates)
    leased = _lease_isolating(candidates, holder=holder, lease_seconds=lease_seconds, whole=True)
    if not leased:
        return []
    fault_point("claim.after_commit")
    accounts = {pk: acct for pk, acct, _ in candidates}
    return [ClaimToken(pk, fence, holder, accounts[pk]) for pk, fence in sorted(leased, key=lambda t: order[t[0]])]


def _next_start(candidates) -> int:
    """The rotation cursor after this batch: past the last account of the batch's first round."""
    first_rank, seen = [], set()
    for _, acct, _ in candidates:
        if acct not in seen:
            seen.add(acct)
            first_rank.append(acct)
    return first_rank[-1] + 1


def _lease(candidates, *, holder: str, lease_seconds: int) -> list[tuple[int, int]]:
    """Steps 2 and 3 of `execution_claim_batch` for these candidates, in one transaction."""
    with transaction.atomic(durable=True):
        guarded = lock_serving_accounts(account_ids={acct for _, acct, _ in candidates})
        chosen = [(pk, epoch_pk, acct) for pk, acct, epoch_pk in candidates
                  if isinstance(guarded[acct], ServingContext) and guarded[acct].epoch_pk == epoch_pk]
        now = timezone.now()
        return locks.executions_lease(candidates=chosen, holder=holder, now=now,
                                      expires=now + timedelta(seconds=lease_seconds))


def _lease_isolating(candidates, *, holder: str, lease_seconds: int, whole: bool = False) -> list[tuple[int, int]]:
    """`_lease`, split in halves while it fails deterministically, until the Execution at fault stands alone and is
    quarantined (poison isolation, D-168, D-503). A refusal or transient failure of the whole batch raises."""
    try:
        return _lease(candidates, holder=holder, lease_seconds=lease_seconds)
    except Exception as exc:  # noqa: BLE001 - classified: a defect is split until the Execution at fault stands alone
        if poison.classify(exc) != poison.FAILED:
            if whole:
                raise
            log.info("execution claim of %d deferred: %s: %s", len(candidates), type(exc).__name__, exc)
            return []
        if len(candidates) == 1:
            pk = candidates[0][0]
            with poison.isolated(step=SweepStep.EXECUTION_CLAIM, item=f"execution {pk}",
                                 quarantine=partial(poison.execution_quarantine, execution_pk=pk,
                                                    step=SweepStep.EXECUTION_CLAIM)):
                raise exc
            return []
        poison.log_fallback(log, exc, "the claim of %d executions failed; claiming each half again", len(candidates))
    half = len(candidates) // 2
    return (_lease_isolating(candidates[:half], holder=holder, lease_seconds=lease_seconds)
            + _lease_isolating(candidates[half:], holder=holder, lease_seconds=lease_seconds))
