"""Every row lock of the connector app, in the canonical order (docs/locking.md):

  1. publication barrier set  2. ServingEpoch(s)  3. AccountServingGate (by account id)
  4. CredentialGenerationDispatchGate  5. OrderingLane  6. entity rows

Within one model, rows are locked by ascending primary key. Transitions of gates and epochs take FOR UPDATE;
production writes that only need them to stay as they are take FOR SHARE (docs/locking.md, "Lock modes").
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from django.db import transaction

from connector.models import (
    AccountServingGate,
    CredentialGenerationDispatchGate,
    Execution,
    ExecutionDependency,
    OrderingLane,
    ProjectionWindow,
    Receipt,
    ServingEpoch,
)

# Advisory-lock namespaces (one registry; STYLE R9). PostgreSQL grants a new row share lock even while a
# FOR UPDATE waits on the same row, so under steady writes a gate transition could wait without bound. The
# heavyweight advisory lock queues fairly: once a transition waits for it exclusively, later writers queue behind
# it. Writers take it shared, transitions exclusive, always at the gate's place in the canonical order.
ADVISORY_LOCK_KEYS = {"account_gate": 0x43563203, "credential_gate": 0x43563204, "owner_barrier": 0x43563205}

# The owner publication barriers (CV2-11-033/034, docs/locking.md "Owner barriers", D-284), in their lock order.
# Every authoring, publication or current-selector write of an owner takes its barrier shared for its whole
# transaction; every transition of a publication barrier set takes all four exclusive, before the set's row.
OWNER_BARRIERS = ("binding_definitions", "catalog", "configuration", "credential_authority")


def _fair(kind: str, row_id: int, *, exclusive: bool) -> None:
    fn = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(f"SELECT {fn}(%s, %s)", [ADVISORY_LOCK_KEYS[kind], int(row_id) % 2_147_483_647])


def owner_barriers_lock(owners: Iterable[str] = OWNER_BARRIERS, *, exclusive: bool) -> None:
    """Take the named owner barriers (advisory, transaction-scoped, in OWNER_BARRIERS order) in one statement.
    Shared by an owner write (they never wait for each other), exclusive by a barrier-set transition: a set cannot
    move to `held` while an owner write that passed its barrier is still open, and a write that starts while a
    transition is open waits for its commit and then sees the new state. Before every row lock (order 0)."""
    assert transaction.get_connection().in_atomic_block, "owner barriers are held until the transaction ends"
    keys = sorted({OWNER_BARRIERS.index(owner) for owner in owners})
    fn = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    namespace = ADVISORY_LOCK_KEYS["owner_barrier"]
    with transaction.get_connection().cursor() as cursor:  # left to right: the order of OWNER_BARRIERS
        cursor.execute("SELECT " + ", ".join(f"{fn}(%s, %s)" for _ in keys),
                       [value for key in keys for value in (namespace, key)])


def epoch_for_update(epoch_pk: int) -> ServingEpoch:
    # The preimage can be large (it grows with the account and binding sets); transitions never need it.
    forget_serving()
    return ServingEpoch.objects.defer("preimage").select_for_update().get(pk=epoch_pk)


def epochs_for_update(epoch_pks: Iterable[int]) -> list[ServingEpoch]:
    forget_serving()
    return list(ServingEpoch.objects.defer("preimage").filter(pk__in=set(epoch_pks)).order_by("pk")
                .select_for_update())


def epoch_for_share(epoch_pk: int) -> ServingEpoch:
    return _share_one(ServingEpoch.objects.defer("preimage").filter(pk=epoch_pk))


class ServingLock(NamedTuple):
    """What `connector_lock_serving` returns (migration 0012): the outcome, the gate's and the epoch's columns a
    guard compares, never the epoch's preimage."""

    outcome: str  # "locked" | "no_epoch" | "moved"
    gate_pk: int | None
    gate_mode: str | None
    gate_fence: int | None
    gate_epoch_pk: int | None
    gate_epoch_digest: bytes | None
    epoch_id: str | None
    epoch_state: str | None
    epoch_digest: bytes | None
    # The epoch's `provider_io_held` (migration 0023): a first activation not yet read back (CV2-12-071). Absent
    # (None) where a caller builds the tuple from a statement that does not return it (`connector_receipt_admit`).
    epoch_io_held: bool | None = None


_SERVING_FOR_SHARE = "SELECT * FROM connector_lock_serving(%s, %s)"


def serving_for_share(account_id: int, *, attempts: int) -> ServingLock:
    """The guard's locks in one round trip, in the canonical order: the epoch the gate names FOR SHARE, the gate's
    fair advisory lock shared, the gate FOR SHARE, re-checked to still name that epoch; a lost race is released
    and retried from the top, up to `attempts` times (migration 0012, D-199). Outcome "locked" means both rows
    are held until the transaction ends."""
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(_SERVING_FOR_SHARE, [account_id, attempts])
        row = cursor.fetchone()
    lock = ServingLock(*row)
    if lock.outcome != "locked":
        return lock
    gate_digest = None if lock.gate_epoch_digest is None else bytes(lock.gate_epoch_digest)
    return lock._replace(gate_epoch_digest=gate_digest, epoch_digest=bytes(lock.epoch_digest))


# One call of connector_lock_serving per account, in the array's (ascending) order: the function scan of
# unnest yields the accounts in array order and the nested loop calls the lateral function once per outer row, so
# the account with the lower id is locked (epoch, then gate) before the next one is touched.
_SERVINGS_FOR_SHARE = """
SELECT s.* FROM unnest(%s::bigint[]) WITH ORDINALITY AS a(account_id, ord)
CROSS JOIN LATERAL connector_lock_serving(a.account_id, %s) AS s
ORDER BY a.ord"""


def servings_for_share(account_ids: list[int], *, attempts: int) -> list[ServingLock]:
    """`serving_for_share` for several accounts in one round trip, in ascending account id (a batched claim,
    D-204): the same function per account, so each account's epoch is locked before its gate and a lost race is
    retried from the top for that account. Returns one ServingLock per account, in the given order."""
    ordered = list(account_ids)
    assert ordered == sorted(set(ordered)), "accounts are guarded in ascending id"
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(_SERVINGS_FOR_SHARE, [ordered, attempts])
        rows = cursor.fetchall()
    out = []
    for row in rows:
        lock = ServingLock(*row)
        if lock.outcome == "locked":
            gate_digest = None if lock.gate_epoch_digest is None else bytes(lock.gate_epoch_digest)
            lock = lock._replace(gate_epoch_digest=gate_digest, epoch_digest=bytes(lock.epoch_digest))
        out.append(lock)
    return out


def forget_serving() -> None:
    """A transaction about to change a gate or an epoch drops what its guard memoized (connector.services.guard):
    a later guard in the same transaction must read the rows again."""
    connection = transaction.get_connection()
    if getattr(connection, "connector_serving_memo", None) is not None:
        connection.connector_serving_memo = None


# The gate's fair advisory lock exclusive, then the gate row FOR UPDATE, in ONE statement (D-384): the row lock is
# taken by the LockRows node above the join, so only after the one-row subquery took the advisory lock (a
# volatile subquery is never pulled up); the row is then re-read at its latest committed version, as any FOR UPDATE.
_GATE_FAIR_FOR_UPDATE = """
SELECT g.* FROM (SELECT pg_advisory_xact_lock(%s, %s)) AS fair, connector_accountservinggate AS g
 WHERE g.account_id = %s FOR UPDATE OF g"""


def gate_for_update(account_id: int) -> AccountServingGate:
    forget_serving()
    rows = list(AccountServingGate.objects.raw(_GATE_FAIR_FOR_UPDATE, [
        ADVISORY_LOCK_KEYS["account_gate"], int(account_id) % 2_147_483_647, account_id]))
    if not rows:
        raise AccountServingGate.DoesNotExist(f"no serving gate for account {account_id}")
    return rows[0]


class GateRow(NamedTuple):
    """A gate row as `gates_for_update` returns it: the columns whole-service transitions compare and write from
    (D-278). Not a model instance: nothing here can be saved; the set-based statements write the gates."""

    id: int
    account_id: int
    mode: str
    fence: int
    epoch_id: int | None
    epoch_digest: bytes | None

    @property
    def pk(self) -> int:
        return self.id


_GATES_FOR_UPDATE = """
SELECT g.id, g.account_id, g.mode, g.fence, g.epoch_id, g.epoch_digest FROM connector_accountservinggate AS g
 WHERE g.account_id = ANY(%s::bigint[]) ORDER BY g.account_id FOR UPDATE OF g"""


def gates_for_update(account_ids: Iterable[int]) -> list[GateRow]:
    """Whole-service transitions (activation) lock every gate row; they take no per-gate advisory lock: one per
    gate would exhaust PostgreSQL's shared lock table beyond ~12,800 accounts (bench activation), and no guarded
    writer holds a gate in the modes these transitions start from (v2_validating, v2_halted, and the V1 modes of
    V1 shutdown's set-based steps, D-208). halt_v2 (from v2_serving, where writers hold the gate) takes each
    gate's advisory lock too, per chunk of at most HALT_CHUNK_ACCOUNTS gates (gates_fair_for_update, D-209, D-281).

    One `SELECT ... FOR UPDATE` in ascending account id (the same rows and order as before) returning GateRow
    tuples of the compared columns, not model instances (D-278: building N instances was a third of the lock
    phase)."""
    forget_serving()
    ordered = sorted(set(account_ids))
    assert AccountServingGate._meta.db_table == "connector_accountservinggate"
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(_GATES_FOR_UPDATE, [ordered])
        rows = cursor.fetchall()
    return [GateRow(pk, account_id, mode, fence, epoch_id, None if digest is None else bytes(digest))
            for pk, account_id, mode, fence, epoch_id, digest in rows]


def credential_gate_for_update(credential_generation_pk: int) -> CredentialGenerationDispatchGate:
    _fair("credential_gate", credential_generation_pk, exclusive=True)
    return CredentialGenerationDispatchGate.objects.select_for_update(of=("self",)).get(
        credential_generation_id=credential_generation_pk)


def credential_gate_for_share(credential_generation_pk: int) -> CredentialGenerationDispatchGate:
    _fair("credential_gate", credential_generation_pk, exclusive=False)
    return _share_one(CredentialGenerationDispatchGate.objects.filter(
        credential_generation_id=credential_generation_pk))


# The shared fair advisory locks of `credential_gate_for_share`, for several generations, in ascending order.
_CREDENTIAL_GATES_FAIR_SQL = ("SELECT count(pg_advisory_xact_lock_shared(%s, (a.id %% 2147483647)::int)) "
                              "FROM unnest(%s::bigint[]) AS a(id)")


def credential_gates_for_share(credential_generation_pks: Iterable[int]) -> dict[int, CredentialGenerationDispatchGate]:
    """`credential_gate_for_share` for several generations in two statements (the worker's batched claim and
    sending marker, D-345): each gate's fair advisory lock shared, in ascending generation pk (one statement),
    then the gates FOR SHARE in ascending generation pk (one statement); the same locks in the same order as the
    single call made per generation in that order. Returns {generation pk: gate}; a generation without a gate is
    absent (the caller refuses its items)."""
    ordered = sorted({int(pk) for pk in credential_generation_pks})
    if not ordered:
        return {}
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(_CREDENTIAL_GATES_FAIR_SQL, [ADVISORY_LOCK_KEYS["credential_gate"], ordered])
    sql, params = (CredentialGenerationDispatchGate.objects.filter(credential_generation_id__in=ordered)
                   .order_by("credential_generation_id").query.sql_with_params())
    return {g.credential_generation_id: g
            for g in CredentialGenerationDispatchGate.objects.raw(sql + " FOR SHARE", params)}


def _share_one(queryset):
    """`SELECT ... FOR SHARE` of exactly one row. Django's select_for_update has no share mode, so the lock
    clause is appended to the compiled single-table query."""
    sql, params = queryset.order_by().query.sql_with_params()
    rows = list(queryset.model.objects.raw(sql + " FOR SHARE", params))
    if len(rows) != 1:
        raise queryset.model.DoesNotExist(f"{queryset.model.__name__} matching query does not exist")
    return rows[0]


# -- inbound chain (entity rows come last in the canonical order) ----------------------------------------------

# `account_id`, where the caller already read the row's account: the lock statement then names its distribution
# column too, so on the scale-out path it is a single-shard row lock (docs/scale-out.md, D-241). The row is the
# same (account_id never changes); a pk of another account finds nothing.
def _of_account(queryset, account_id: int | None):
    return queryset if account_id is None else queryset.filter(account_id=account_id)


def lane_for_update(lane_pk: int, *, account_id: int | None = None):
    return _of_account(OrderingLane.objects.select_for_update(of=("self",)), account_id).get(pk=lane_pk)


def receipt_for_update(receipt_pk: int, *, account_id: int | None = None):
    return _of_account(Receipt.objects.select_for_update(of=("self",)), account_id).get(pk=receipt_pk)


def open_window_for_update(*, epoch_pk: int, route: str, grouping_key: str):
    return (ProjectionWindow.objects.select_for_update(of=("self",))
            .filter(epoch_id=epoch_pk, route=route, grouping_key=grouping_key, state="open").first())


def window_for_update(window_pk: int):
    return ProjectionWindow.objects.select_for_update(of=("self",)).get(pk=window_pk)


def execution_for_update(execution_pk: int, *, skip_locked: bool = False, account_id: int | None = None):
    return (_of_account(Execution.objects.select_for_update(of=("self",), skip_locked=skip_locked), account_id)
            .filter(pk=execution_pk).first())


def lanes_for_update(lane_pks: Iterable[int], *, account_ids: Iterable[int]) -> dict:
    """Several OrderingLanes FOR UPDATE in ascending pk, in one statement that names their accounts (the batched
    result recording, D-255: lanes before entity rows). Returns {pk: lane}; a pk of another account is absent."""
    ordered = sorted(set(lane_pks))
    if not ordered:
        return {}
    return {lane.pk: lane for lane in OrderingLane.objects.select_for_update(of=("self",))
            .filter(pk__in=ordered, account_id__in=sorted(set(account_ids))).order_by("pk")}


def account_receipts_for_update(receipt_pks: Iterable[int], *, account_id: int) -> list:
    """The Receipts of one account FOR UPDATE in ascending pk, the columns materialization compares and reads, in
    one statement that names the account and joins no reference table (materialization, after the guard:
    concurrent materializers of a receipt serialize). A pk of another account is absent."""
    ordered = sorted(set(receipt_pks))
    if not ordered:
        return []
    return list(Receipt.objects.select_for_update(of=("self",))
                .only("id", "account_id", "epoch_id", "epoch_digest", "kind", "channel", "payload",
                      "component_count", "replay_request_id")
                .filter(account_id=account_id, pk__in=ordered).order_by("pk"))


def account_lanes_for_update(lane_pks: Iterable[int], *, account_id: int) -> list:
    """The OrderingLanes of one account FOR UPDATE in ascending pk, in one statement that names the account and
    joins no reference table (the lane advance, after the guard). A pk of another account is absent."""
    ordered = sorted(set(lane_pks))
    if not ordered:
        return []
    return list(OrderingLane.objects.select_for_update(of=("self",))
                .filter(account_id=account_id, pk__in=ordered).order_by("pk"))


def executions_for_update(execution_pks: Iterable[int], *, account_ids: Iterable[int]) -> dict:
    """Several Executions FOR UPDATE in ascending pk (entity rows, after the guard and the lanes), in one statement
    that names their accounts (D-255). Returns {pk: execution}; a pk of another account is absent."""
    ordered = sorted(set(execution_pks))
    if not ordered:
        return {}
    return {e.pk: e for e in Execution.objects.select_for_update(of=("self",))
            .filter(pk__in=ordered, account_id__in=sorted(set(account_ids))).order_by("pk")}


def dependency_for_update(dependency_pk: int):
    return ExecutionDependency.objects.select_for_update(of=("self",)).get(pk=dependency_pk)


# The batched claim's lock and lease compare-and-swap (D-204), one statement: lock the guarded candidates that are
# still ready with a free or expired lease and still bound to the epoch their account's guard locked, ascending
# pk, FOR UPDATE SKIP LOCKED (a row another claimer holds is skipped, never waited for; a row another claimer
# leased and committed meanwhile fails the re-checked condition); give each a new lease fence and Attempt ordinal;
# append their ExecutionAttempts. Returns (execution pk, lease fence) of the rows claimed.
_EXECUTIONS_LEASE = """
WITH candidate AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(epochs)s::bigint[], %(accounts)s::bigint[])
        AS c(id, epoch_id, account_id)
), picked AS (
    SELECT e.id, e.attempt_count + 1 AS ordinal, e.lease_fence + 1 AS fence
    FROM connector_execution e
    JOIN candidate c ON c.id = e.id AND c.epoch_id = e.epoch_id AND c.account_id = e.account_id
    WHERE e.state = 'ready' AND (e.lease_expires_at IS NULL OR e.lease_expires_at < %(now)s)
    ORDER BY e.id
    FOR UPDATE OF e SKIP LOCKED
), leased AS (
    UPDATE connector_execution e
    SET attempt_count = p.ordinal, lease_fence = p.fence, lease_holder = %(holder)s, lease_expires_at = %(expires)s
    FROM picked p WHERE e.id = p.id
    RETURNING e.id, e.attempt_count, e.lease_fence
), attempts AS (
    INSERT INTO connector_executionattempt (execution_id, ordinal, holder, lease_fence, claimed_at, lease_expires_at)
    SELECT l.id, l.attempt_count, %(holder)s, l.lease_fence, %(now)s, %(expires)s FROM leased l
)
SELECT l.id, l.lease_fence FROM leased l ORDER BY l.id"""


def executions_lease(*, candidates: list[tuple[int, int, int]], holder: str, now, expires) -> list[tuple[int, int]]:
    """Lock the given (execution pk, guarded epoch pk, account id) candidates `FOR UPDATE SKIP LOCKED` in
    ascending pk and lease the ones still claimable (entity rows: last in the canonical order, after the caller's
    guard). Writes the new lease fences and ExecutionAttempts in the same statement (the lease compare-and-swap,
    CV2-07-018). The statement names the accounts, so a sharded deployment routes it by account (D-205)."""
    assert transaction.get_connection().in_atomic_block, "the lease is written inside the claim's transaction"
    if not candidates:
        return []
    ordered = sorted(candidates)
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(_EXECUTIONS_LEASE, {"ids": [c[0] for c in ordered], "epochs": [c[1] for c in ordered],
                                           "accounts": [c[2] for c in ordered], "holder": holder, "now": now,
                                           "expires": expires})
        return [(int(pk), int(fence)) for pk, fence in cursor.fetchall()]


# The per-gate fair advisory locks of `gate_for_update`, for several gates, taken exclusively one after the other in
# the array's (ascending) order: the aggregate consumes the function scan of unnest row by row, in array order.
_GATES_FAIR_SQL = ("SELECT count(pg_advisory_xact_lock(%s, (a.id %% 2147483647)::int)) "
                   "FROM unnest(%s::bigint[]) AS a(id)")


def gates_fair_for_update(account_ids: Iterable[int]) -> list[AccountServingGate]:
    """`gate_for_update` for a chunk of gates in two statements (the whole-service halt, D-281): each gate's fair
    advisory lock exclusive, in ascending account id (one statement), then the gates FOR UPDATE in ascending
    account id (one statement). The same locks, in the same order, as `gate_for_update` called per account, so a
    writer holding a gate FOR SHARE with its advisory lock shared is waited for, and later writers queue behind.
    The caller bounds the chunk (CONNECTOR["HALT_CHUNK_ACCOUNTS"]): one advisory lock per gate fills PostgreSQL's
    shared lock table beyond ~12,800 (D-209)."""
    forget_serving()
    ordered = sorted(set(account_ids))
    if not ordered:
        return []
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(_GATES_FAIR_SQL, [ADVISORY_LOCK_KEYS["account_gate"], ordered])
    return list(AccountServingGate.objects.filter(account_id__in=ordered).order_by("account_id")
                .select_for_update(of=("self",)))
