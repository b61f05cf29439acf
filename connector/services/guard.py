"""The serving guard: the one check every production V2 write passes (admission, replay, materialization,
claims, outbound authoring, permit acquisition). CV2-03-015/016/017/021/022.

Lock order is epoch before gate (activation locks epochs first): read which epoch the gate names, lock that
epoch FOR SHARE, lock the gate FOR SHARE, and re-check the gate still names that epoch (retry once if not).
Share locks let writes of one account proceed together while still serializing with every gate or epoch
transition, which takes FOR UPDATE. The locking runs in PostgreSQL in one round trip
(`connector.locks.serving_for_share`, migration 0012) and happens once per transaction and account: the rows
stay locked until the transaction ends, so a second guard of the same account in the same transaction checks the
memoized rows instead of locking them again (D-199).
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from connector import locks
from connector.choices import EpochState, GateMode
from connector.errors import ConnectorError, FenceStale, GateNotServing


@dataclass(frozen=True)
class ServingContext:
    """What a guarded write binds its facts to: the exact gate fence and epoch it was admitted under."""

    account_id: int
    gate_pk: int
    fence: int
    epoch_pk: int
    epoch_id: str
    epoch_digest: bytes
    # The exact epoch's first activation is not read back yet: provider I/O stays disabled (CV2-12-071, D-321).
    # Only the permit acquisition reads it; every other guarded write is unaffected.
    provider_io_held: bool = False


def _locked(account_id: int) -> locks.ServingLock:
    """The gate and epoch rows this transaction holds FOR SHARE, locking them on first use.

    The memo lives on the connection and belongs to one transaction: it is keyed to the connection's list of
    on-commit callbacks, which Django replaces by a new list when the transaction commits or rolls back and when
    any savepoint rolls back (a memo made inside a rolled-back savepoint, whose locks PostgreSQL released, is
    never used). A transaction that goes on to change a gate or epoch drops the memo
    (`locks.forget_serving`, called by every FOR UPDATE of gates and epochs). Only outcome "locked" is kept:
    a refusal is re-read by the next guard."""
    memo = _memo(transaction.get_connection())
    lock = memo.get(account_id)
    if lock is None:
        lock = locks.serving_for_share(account_id, attempts=1 + int(settings.CONNECTOR.get("GUARD_RETRY_LIMIT", 1)))
        if lock.outcome == "locked":
            memo[account_id] = lock
    return lock


def _memo(connection) -> dict[int, locks.ServingLock]:
    """This transaction's memo of locked gate and epoch rows by account (see `_locked`)."""
    memo = getattr(connection, "connector_serving_memo", None)
    if memo is None or memo[0] is not connection.run_on_commit:
        memo = (connection.run_on_commit, {})
        connection.connector_serving_memo = memo
    return memo[1]


def lock_serving(*, account_id: int, epoch_id: str | None = None, epoch_digest: bytes | None = None,
                 expected_fence: int | None = None, settling: bool = False) -> ServingContext:
    """Lock and check the gate and its exact epoch inside the caller's transaction.

    Requires: gate `v2_serving`; `expected_fence` (if the caller acts on an observed fence) equal to the
    current fence; the gate's epoch ID and digest equal to the epoch row's and to the caller's (if given); the
    epoch `active`. Raises GateNotServing or FenceStale otherwise; the caller's transaction then writes nothing.

    `settling=True` is for recording the outcome of already-claimed work (a Runtime result receipt), which the
    seed lets finish while the gate drains: it also accepts `halting_v2` and `v2_halted` on the same exact epoch
    (local finalization is allowed in `v2_halted`, CV2-11-006; decision D-130). After an OrderingHandoff froze
    the lane no nonterminal execution of it exists, so nothing can settle past the handoff fence.

    One round trip on the first call of a transaction for an account, none on later calls (every check below
    still runs on each call, against the rows the transaction holds locked).
    """
    assert transaction.get_connection().in_atomic_block, "lock_serving runs inside the write's transaction"
    return serving_check(_locked(account_id), account_id=account_id, epoch_id=epoch_id, epoch_digest=epoch_digest,
                         expected_fence=expected_fence, settling=settling)


def lock_serving_accounts(*, account_ids, settling: bool = False) -> dict[int, ServingContext | ConnectorError]:
    """`lock_serving` for several accounts of one transaction (a batched claim), in ascending account id.

    One round trip for every account not yet guarded in this transaction (`locks.servings_for_share`: per
    account the epoch FOR SHARE, then the gate FOR SHARE, accounts in ascending id: docs/locking.md, D-204);
    the locked rows join the transaction's memo, so a later `lock_serving` of one of
    these accounts in the same transaction needs no round trip. Returns, per account, its ServingContext or the
    GateNotServing / FenceStale the single guard would have raised: the caller skips refused accounts and writes
    nothing for them (their share locks, if taken, are harmless and end with the transaction). `settling=True`
    (recording results of already-claimed work, `execution_record_results`) accepts what `lock_serving(settling=
    True)` accepts."""
    connection = transaction.get_connection()
    assert connection.in_atomic_block, "lock_serving_accounts runs inside the write's transaction"
    ordered = sorted(set(int(a) for a in account_ids))
    memo = _memo(connection)
    missing = [a for a in ordered if a not in memo]
    fetched = dict(zip(missing, locks.servings_for_share(
        missing, attempts=1 + int(settings.CONNECTOR.get("GUARD_RETRY_LIMIT", 1))))) if missing else {}
    out: dict[int, ServingContext | ConnectorError] = {}
    for account_id in ordered:
        row = memo.get(account_id) or fetched[account_id]
        if row.outcome == "locked":
            memo[account_id] = row
        try:
            out[account_id] = serving_check(row, account_id=account_id, settling=settling)
        except ConnectorError as exc:
            out[account_id] = exc
    return out


def serving_check(row: locks.ServingLock, *, account_id: int, epoch_id: str | None = None,
                  epoch_digest: bytes | None = None, expected_fence: int | None = None,
                  settling: bool = False) -> ServingContext:
    """Every check of `lock_serving` on rows already locked FOR SHARE (by `connector_lock_serving`, directly or
    through a hot path's one statement, e.g. `connector_receipt_admit`): the same order, the same exceptions."""
    if row.outcome == "no_epoch":
        raise GateNotServing(f"account {account_id} gate is {row.gate_mode or 'absent'}; no epoch serves it")
    if row.outcome != "locked":
        raise GateNotServing(f"account {account_id} gate kept moving between epochs; retry")
    allowed = ((GateMode.V2_SERVING, GateMode.HALTING_V2, GateMode.V2_HALTED) if settling
               else (GateMode.V2_SERVING,))
    if row.gate_mode not in allowed:
        raise GateNotServing(f"account {account_id} gate is {row.gate_mode}, not v2_serving")
    if expected_fence is not None and row.gate_fence != expected_fence:
        raise FenceStale(f"account {account_id} gate fence is {row.gate_fence}, the writer observed {expected_fence}")
    if row.epoch_state != EpochState.ACTIVE:
        raise GateNotServing(f"epoch {row.epoch_id} named by account {account_id} gate is {row.epoch_state}, "
                             "not active")
    stored = row.epoch_digest
    if row.gate_epoch_digest is None or not hmac.compare_digest(row.gate_epoch_digest, stored):
        raise GateNotServing(f"account {account_id} gate names epoch {row.epoch_id} with a different digest")
    if epoch_id is not None and epoch_id != row.epoch_id:
        raise GateNotServing(f"writer bound to epoch {epoch_id}; the gate serves {row.epoch_id}")
    if epoch_digest is not None and not hmac.compare_digest(bytes(epoch_digest), stored):
        raise GateNotServing(f"writer's digest for epoch {row.epoch_id} differs from the exact epoch")
    return ServingContext(account_id, row.gate_pk, row.gate_fence, row.gate_epoch_pk, row.epoch_id, stored,
                          bool(row.epoch_io_held))
