"""Every row lock of the connector app, in the canonical order (docs/locking.md):

  1. publication barrier set  2. ServingEpoch(s)  3. AccountServingGate (by account id)
  4. CredentialGenerationDispatchGate  5. OrderingLane  6. entity rows

Within one model, rows are locked by ascending primary key. Transitions of gates and epochs take FOR UPDATE;
production writes that only need them to stay as they are take FOR SHARE (docs/architecture.md, "Lock modes").
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from django.db import transaction

from connector.models import AccountServingGate, CredentialGenerationDispatchGate, ServingEpoch

# Advisory-lock namespaces (one registry; STYLE R9). PostgreSQL grants a new row share lock even while a
# FOR UPDATE waits on the same row, so under steady writes a gate transition could wait without bound. The
# heavyweight advisory lock queues fairly: once a transition waits for it exclusively, later writers queue behind
# it. Writers take it shared, transitions exclusive, always at the gate's place in the canonical order.
ADVISORY_LOCK_KEYS = {"account_gate": 0x43563203, "credential_gate": 0x43563204}


def _fair(kind: str, row_id: int, *, exclusive: bool) -> None:
    fn = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(f"SELECT {fn}(%s, %s)", [ADVISORY_LOCK_KEYS[kind], int(row_id) % 2_147_483_647])


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


def forget_serving() -> None:
    """A transaction about to change a gate or an epoch drops what its guard memoized (connector.services.guard):
    a later guard in the same transaction must read the rows again."""
    connection = transaction.get_connection()
    if getattr(connection, "connector_serving_memo", None) is not None:
        connection.connector_serving_memo = None


def gate_for_update(account_id: int) -> AccountServingGate:
    forget_serving()
    _fair("account_gate", account_id, exclusive=True)
    return AccountServingGate.objects.select_for_update(of=("self",)).get(account_id=account_id)


def gates_for_update(account_ids: Iterable[int]) -> list[AccountServingGate]:
    """Whole-service transitions (activation) lock every gate row; they take no per-gate advisory lock: one per
    gate would exhaust PostgreSQL's shared lock table beyond ~12,800 accounts (bench activation), and no guarded
    writer holds a gate in the modes these transitions start from (v2_validating, v2_halted, and the V1 modes of
    V1 shutdown's set-based steps, D-208). halt_v2 (from v2_serving, where writers hold the gate) stays per gate
    through gate_for_update and its advisory lock (D-209)."""
    forget_serving()
    ordered = sorted(set(account_ids))
    return list(AccountServingGate.objects.filter(account_id__in=ordered).order_by("account_id")
                .select_for_update(of=("self",)))


def credential_gate_for_update(credential_generation_pk: int) -> CredentialGenerationDispatchGate:
    _fair("credential_gate", credential_generation_pk, exclusive=True)
    return CredentialGenerationDispatchGate.objects.select_for_update(of=("self",)).get(
        credential_generation_id=credential_generation_pk)


def credential_gate_for_share(credential_generation_pk: int) -> CredentialGenerationDispatchGate:
    _fair("credential_gate", credential_generation_pk, exclusive=False)
    return _share_one(CredentialGenerationDispatchGate.objects.filter(
        credential_generation_id=credential_generation_pk))


def _share_one(queryset):
    """`SELECT ... FOR SHARE` of exactly one row. Django's select_for_update has no share mode, so the lock
    clause is appended to the compiled single-table query."""
    sql, params = queryset.order_by().query.sql_with_params()
    rows = list(queryset.model.objects.raw(sql + " FOR SHARE", params))
    if len(rows) != 1:
        raise queryset.model.DoesNotExist(f"{queryset.model.__name__} matching query does not exist")
    return rows[0]


# -- inbound chain (entity rows come last in the canonical order) ----------------------------------------------

def lane_for_update(lane_pk: int):
    from connector.models import OrderingLane

    return OrderingLane.objects.select_for_update(of=("self",)).get(pk=lane_pk)


def receipt_for_update(receipt_pk: int):
    from connector.models import Receipt

    return Receipt.objects.select_for_update(of=("self",)).get(pk=receipt_pk)


def open_window_for_update(*, epoch_pk: int, route: str, grouping_key: str):
    from connector.models import ProjectionWindow

    return (ProjectionWindow.objects.select_for_update(of=("self",))
            .filter(epoch_id=epoch_pk, route=route, grouping_key=grouping_key, state="open").first())


def window_for_update(window_pk: int):
    from connector.models import ProjectionWindow

    return ProjectionWindow.objects.select_for_update(of=("self",)).get(pk=window_pk)


def execution_for_update(execution_pk: int, *, skip_locked: bool = False):
    from connector.models import Execution

    return (Execution.objects.select_for_update(of=("self",), skip_locked=skip_locked)
            .filter(pk=execution_pk).first())


def dependency_for_update(dependency_pk: int):
    from connector.models import ExecutionDependency

    return ExecutionDependency.objects.select_for_update(of=("self",)).get(pk=dependency_pk)
