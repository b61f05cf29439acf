"""Row locks of the cutover app. The publication barrier set is first in the canonical order (docs/locking.md);
the other helpers lock connector rows at their own places (gates 3, lanes 5) in ascending key order.
"""
from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction

from connector.selectors.locks import owner_barriers_lock, share_one
from connector.selectors.rows import AccountServingGate, OrderingLane
from cutover.models import ServingPublicationBarrierSet


def barrier_set_for_update(barrier_set_pk: int) -> ServingPublicationBarrierSet:
    """Every owner barrier exclusive first (D-284): the set's transition (`held` above all) waits for each owner
    write that already passed its barrier to commit, and an owner write that starts meanwhile waits for this
    transaction and then reads the set's new state; then the set's row FOR UPDATE."""
    owner_barriers_lock(exclusive=True)
    return ServingPublicationBarrierSet.objects.select_for_update().get(pk=barrier_set_pk)


def barrier_set_for_share(barrier_set_pk: int) -> ServingPublicationBarrierSet:
    return share_one(ServingPublicationBarrierSet.objects.filter(pk=barrier_set_pk))


def gates_for_share(account_ids: Iterable[int]) -> list[AccountServingGate]:
    """Every listed gate FOR SHARE, ascending account id: a handoff needs the gates to stay `v2_halted` until
    it commits, and a predecessor resume (FOR UPDATE) must wait for it and then see the handoff."""
    ordered = sorted(set(account_ids))
    if not ordered:
        return []
    queryset = AccountServingGate.objects.filter(account_id__in=ordered).order_by("account_id")
    sql, params = queryset.query.sql_with_params()
    return list(AccountServingGate.objects.raw(sql + " FOR SHARE", params))


EPOCH_LANES_FOR_UPDATE_SQL = f"""
SELECT count(*) FILTER (WHERE locked.epoch_id = %(counting)s) FROM (
       SELECT l.id, l.epoch_id FROM {OrderingLane._meta.db_table} AS l WHERE l.epoch_id = ANY(%(epochs)s::bigint[])
        ORDER BY l.id FOR UPDATE OF l) AS locked
"""


def epoch_lanes_for_update(epoch_pks: Iterable[int], *, counting: int) -> int:
    """Every OrderingLane of these epochs FOR UPDATE, ascending pk, in one statement; returns how many of them
    belong to the epoch `counting`. The successor activation locks every lane of the predecessor and the successor
    this way (D-288): no lane pk is read, sent or dumped (an 80,000-value array parameter took about 45 ms to send
    at 10,000 accounts), and the handoffs are compared with the locked lanes in SQL afterwards."""
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(EPOCH_LANES_FOR_UPDATE_SQL, {"epochs": sorted(set(epoch_pks)), "counting": counting})
        return cursor.fetchone()[0]


def lane_rows_for_update(lane_pks: Iterable[int]) -> list[OrderingLane]:
    """Every listed OrderingLane FOR UPDATE, ascending pk, in one statement, as instances: the set-based handoffs
    (cutover.services.succession_handoffs, at most HALT_CHUNK_ACCOUNTS accounts' lanes) freeze and copy them."""
    ordered = sorted(set(lane_pks))
    if not ordered:
        return []
    sql = (f"SELECT * FROM {OrderingLane._meta.db_table} WHERE id = ANY(%s::bigint[]) ORDER BY id FOR UPDATE")
    return list(OrderingLane.objects.raw(sql, [ordered]))



# The advisory-lock namespace of the succession roots barrier (CV2-11-005, D-315), next to connector's
# (connector.locks.ADVISORY_LOCK_KEYS; 0x43563206 is unused there). Keyed by the predecessor epoch pk. Every new
# root bound to the epoch takes it shared in its insert trigger (migration 0014) until its commit; opening the
# epoch's succession drain takes it exclusive, at order 0 (before every row lock, like the owner barriers).
SUCCESSION_ROOTS_LOCK_KEY = 0x43563206


def succession_roots_lock(epoch_pk: int) -> None:
    """Close the epoch's roots barrier for this transaction: wait for every root writer that already passed it."""
    assert transaction.get_connection().in_atomic_block, "the roots lock is held until the transaction ends"
    with transaction.get_connection().cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [SUCCESSION_ROOTS_LOCK_KEY, int(epoch_pk) % 2_147_483_647])
