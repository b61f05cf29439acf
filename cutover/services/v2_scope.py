"""What "V2 touched this attempt" means, as queries (decision 2): any row in a V2 execution table for the
attempt's accounts (receipts = admission and source ack, events, projections and windows, executions and their
attempts = Runtime submission, ordering lanes, outbound commands, remote effects and their attempts and dispatch
permits = provider I/O), or the candidate epoch (or any epoch of the configuration) active.

`v2_rows_sql` runs on a raw cursor so the restore point checks the very snapshot it dumps."""
from __future__ import annotations

from connector.selectors.rows import (
    AccountServingGate, Event, Execution, OrderingLane, Projection, ProjectionWindow, Receipt, ServingEpoch,
)
from cutover.models import ServiceCutoverAttempt
from effects.selectors import DispatchPermit, OutboundCommand, RemoteEffect

__all__ = ["attempt_account_ids", "v2_rows", "active_epochs", "gate_rows"]

# (what it proves, model); every one has an `account` foreign key
ACCOUNT_SCOPED = (
    ("V2 admission / source ack (Receipt)", Receipt),
    ("V2 event (Event)", Event),
    ("V2 projection (Projection)", Projection),
    ("V2 projection window (ProjectionWindow)", ProjectionWindow),
    ("Runtime submission (Execution)", Execution),
    ("ordering lane (OrderingLane)", OrderingLane),
    ("V2 command (OutboundCommand)", OutboundCommand),
    ("provider effect (RemoteEffect)", RemoteEffect),
)


def attempt_account_ids(attempt: ServiceCutoverAttempt) -> list[int]:
    return sorted(attempt.configuration.accounts.values_list("account_id", flat=True))


def v2_rows(cursor, account_ids: list[int]) -> list[str]:
    """Every V2 table holding a row for these accounts, as `label: count` (empty = no V2 mutation)."""
    found = []
    for label, model in ACCOUNT_SCOPED:
        cursor.execute(f'SELECT count(*) FROM "{model._meta.db_table}" WHERE account_id = ANY(%s)', [account_ids])
        count = cursor.fetchone()[0]
        if count:
            found.append(f"{label}: {count}")
    cursor.execute(f'SELECT count(*) FROM "{DispatchPermit._meta.db_table}" p JOIN "{AccountServingGate._meta.db_table}"'
                   " g ON g.id = p.gate_id WHERE g.account_id = ANY(%s)", [account_ids])
    count = cursor.fetchone()[0]
    if count:
        found.append(f"provider I/O permit (DispatchPermit): {count}")
    return found


def active_epochs(cursor) -> list[str]:
    """Every ServingEpoch that ever became active (a state at or past `active`): once one exists, V1 is never
    restored or downgraded to (CV2-12-076/098)."""
    cursor.execute(f'SELECT epoch_id, state FROM "{ServingEpoch._meta.db_table}" '
                   "WHERE state NOT IN ('prepared', 'verified', 'rejected') ORDER BY id")
    return [f"{epoch_id} ({state})" for epoch_id, state in cursor.fetchall()]


def gate_rows(cursor, account_ids: list[int]) -> list[tuple[int, str, int]]:
    cursor.execute(f'SELECT account_id, mode, fence FROM "{AccountServingGate._meta.db_table}" '
                   "WHERE account_id = ANY(%s) ORDER BY account_id", [account_ids])
    return [tuple(r) for r in cursor.fetchall()]
