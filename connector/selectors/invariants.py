"""The system invariants as read-only, set-based queries over production data (`manage.py check_invariants`).

Each invariant is one SQL statement over whole tables (joins and GROUP BY, never a per-row Python loop) that
returns the offending rows with their ids; an empty result means the invariant holds. All statements of one run
read one snapshot (a REPEATABLE READ, READ ONLY transaction), so work committing meanwhile cannot produce a
false violation between two checks. Nothing is written, locked or repaired: the checker only reports.

The outbound tables belong to the `effects` app, which depends on `connector`: they are named by table (no
import of `effects`), and their invariants are skipped when that app is not installed.

What is checked locally about the receiver: "at most one attempt per effect with outcome remote_confirmed". The
receiver-side count itself (each logical effect applied at most once at the provider) is outside this database;
the tests measure it against their loopback receiver (tests/effects/receiver.py), keyed by Idempotency-Key.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from django.apps import apps
from django.db import connections, transaction

__all__ = ["Invariant", "Violation", "InvariantReport", "INVARIANTS", "invariant_check"]

EXECUTION_ACTIVE = "('ready', 'waiting_dependency')"
PERMIT_OPEN = "('granted', 'sending')"


@dataclass(frozen=True)
class Invariant:
    code: str
    statement: str  # what must hold, for the operator
    sql: str  # returns one row per violation; columns are the offending ids and facts
    needs: tuple[str, ...] = ("connector",)  # app labels whose tables the query reads


@dataclass(frozen=True)
class Violation:
    invariant: str
    ids: dict  # column -> value of one offending row (ids, counts, the facts that disagree)

    def as_text(self) -> str:
        return ", ".join(f"{k}={_text(v)}" for k, v in self.ids.items())


@dataclass
class InvariantReport:
    checked: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)  # code -> number of offending rows (may exceed `limit`)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations

    def codes(self) -> set[str]:
        return {v.invariant for v in self.violations}

    def of(self, code: str) -> list[Violation]:
        return [v for v in self.violations if v.invariant == code]


def _text(value) -> str:
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    return str(value)


INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "receipt_children_missing",
        "An accepted Receipt has all its Components, or a MaterializationDue row through which the sweeper "
        "reconciles the missing ones (never more Components than its component_count).",
        """
        SELECT r.id AS receipt, r.component_count AS expected, coalesce(c.n, 0) AS found
        FROM connector_receipt r
        LEFT JOIN (SELECT receipt_id, count(*) AS n FROM connector_receiptcomponent GROUP BY receipt_id) c
            ON c.receipt_id = r.id
        LEFT JOIN connector_materializationdue d ON d.receipt_id = r.id
        WHERE coalesce(c.n, 0) <> r.component_count AND (d.id IS NULL OR coalesce(c.n, 0) > r.component_count)
        """),
    Invariant(
        "event_descendants_missing",
        "Every Event has its Projection (immediate routes) or its window membership (windowed routes), unless "
        "its Receipt is still due for materialization.",
        """
        SELECT e.id AS event, e.receipt_id AS receipt
        FROM connector_event e
        WHERE NOT EXISTS (SELECT 1 FROM connector_projection p WHERE p.event_id = e.id)
          AND NOT EXISTS (SELECT 1 FROM connector_windowmember w WHERE w.event_id = e.id)
          AND NOT EXISTS (SELECT 1 FROM connector_materializationdue d WHERE d.receipt_id = e.receipt_id)
        """),
    Invariant(
        "execution_active_duplicate",
        "At most one active (ready or waiting_dependency) Execution per Projection.",
        f"""
        SELECT projection_id AS projection, array_agg(id ORDER BY id) AS executions
        FROM connector_execution WHERE state IN {EXECUTION_ACTIVE}
        GROUP BY projection_id HAVING count(*) > 1
        """),
    Invariant(
        "application_result_duplicate",
        "At most one ApplicationResult per Execution generation (command ID).",
        """
        SELECT command_id, array_agg(id ORDER BY id) AS results
        FROM connector_applicationresult GROUP BY command_id HAVING count(*) > 1
        """),
    Invariant(
        "execution_result_mismatch",
        "Every Execution closed from a result (completed, or quarantined with a result) has its ApplicationResult "
        "with the same ExecutionRef digest and result digest; no ApplicationResult of an Execution's command "
        "names another ExecutionRef.",
        """
        SELECT e.id AS execution, e.command_id, e.state, a.id AS result,
               CASE WHEN a.id IS NULL THEN 'no ApplicationResult'
                    WHEN a.execution_ref_digest <> e.execution_ref_digest THEN 'ExecutionRef digest differs'
                    ELSE 'result digest differs' END AS problem
        FROM connector_execution e
        LEFT JOIN connector_applicationresult a ON a.command_id = e.command_id
        WHERE (a.id IS NOT NULL AND a.execution_ref_digest <> e.execution_ref_digest)
           OR ((e.state = 'completed' OR (e.state = 'quarantined' AND e.result_digest IS NOT NULL))
               AND (a.id IS NULL OR a.result_digest IS DISTINCT FROM e.result_digest))
        """),
    Invariant(
        "lane_high_water_mismatch",
        "A lane's high-water equals the greatest position of its completed Executions (or of a gap skipped with "
        "evidence), or its baseline when there is none; no completed Execution lies above it.",
        """
        SELECT l.id AS lane, l.high_water, x.max_completed, l.baseline, s.skipped_to
        FROM connector_orderinglane l
        LEFT JOIN (SELECT e.lane_id, max(p.position) AS max_completed
                   FROM connector_execution e JOIN connector_projection p ON p.id = e.projection_id
                   WHERE e.state = 'completed' AND e.lane_id IS NOT NULL GROUP BY e.lane_id) x ON x.lane_id = l.id
        LEFT JOIN (SELECT lane_id, max(next_available) - 1 AS skipped_to FROM connector_gapdecision
                   WHERE disposition = 'skip_with_evidence' AND next_available IS NOT NULL GROUP BY lane_id) s
            ON s.lane_id = l.id
        WHERE l.high_water IS DISTINCT FROM GREATEST(x.max_completed, l.baseline, s.skipped_to)
        """),
    Invariant(
        "remote_effect_not_exactly_one",
        "Exactly one RemoteEffect per OutboundCommand.",
        """
        SELECT c.id AS command, count(f.id) AS effects,
               coalesce(array_agg(f.id ORDER BY f.id) FILTER (WHERE f.id IS NOT NULL), '{}') AS effect_ids
        FROM effects_outboundcommand c LEFT JOIN effects_remoteeffect f ON f.command_id = c.id
        GROUP BY c.id HAVING count(f.id) <> 1
        """, ("connector", "effects")),
    Invariant(
        "remote_effect_key_mismatch",
        "A RemoteEffect repeats its command's logical-effect digest (the idempotency key) and account.",
        """
        SELECT f.id AS effect, c.id AS command,
               CASE WHEN f.logical_effect_digest <> c.idempotency_key THEN 'logical_effect_digest differs'
                    ELSE 'account differs' END AS problem
        FROM effects_remoteeffect f JOIN effects_outboundcommand c ON c.id = f.command_id
        WHERE f.logical_effect_digest <> c.idempotency_key OR f.account_id <> c.account_id
        """, ("connector", "effects")),
    Invariant(
        "permit_outside_gate_set",
        "Every open DispatchPermit (granted, sending) is in exactly one gate's open-permit set: it references an "
        "existing AccountServingGate of its effect's account.",
        f"""
        SELECT p.id AS permit, p.effect_id AS effect, p.gate_id AS gate, g.account_id AS gate_account,
               f.account_id AS effect_account
        FROM effects_dispatchpermit p
        JOIN effects_remoteeffect f ON f.id = p.effect_id
        LEFT JOIN connector_accountservinggate g ON g.id = p.gate_id
        WHERE p.state IN {PERMIT_OPEN} AND (g.id IS NULL OR g.account_id <> f.account_id)
        """, ("connector", "effects")),
    Invariant(
        "permit_open_duplicate",
        "At most one open DispatchPermit per RemoteEffect.",
        f"""
        SELECT effect_id AS effect, array_agg(id ORDER BY id) AS permits
        FROM effects_dispatchpermit WHERE state IN {PERMIT_OPEN}
        GROUP BY effect_id HAVING count(*) > 1
        """, ("connector", "effects")),
    Invariant(
        "dispatch_permit_mismatch",
        "Every `dispatching` RemoteEffect has an open DispatchPermit (or is marked for an operator by a "
        "quarantine_reason), and an open permit's effect is `dispatching`.",
        f"""
        SELECT f.id AS effect, f.state, NULL::bigint AS permit, 'dispatching without an open permit' AS problem
        FROM effects_remoteeffect f
        WHERE f.state = 'dispatching' AND f.quarantine_reason = ''
          AND NOT EXISTS (SELECT 1 FROM effects_dispatchpermit p WHERE p.effect_id = f.id AND p.state IN {PERMIT_OPEN})
        UNION ALL
        SELECT f.id, f.state, p.id, 'open permit of an effect that is not dispatching'
        FROM effects_dispatchpermit p JOIN effects_remoteeffect f ON f.id = p.effect_id
        WHERE p.state IN {PERMIT_OPEN} AND f.state <> 'dispatching'
        """, ("connector", "effects")),
    Invariant(
        "remote_confirmed_attempt_duplicate",
        "At most one Attempt per RemoteEffect settled `remote_confirmed` (the local expression of \"the receiver "
        "applied each logical effect at most once\").",
        """
        SELECT effect_id AS effect, array_agg(id ORDER BY id) AS attempts
        FROM effects_remoteeffectattempt WHERE outcome = 'remote_confirmed'
        GROUP BY effect_id HAVING count(*) > 1
        """, ("connector", "effects")),
    Invariant(
        "delivery_submitting_without_marker",
        "Every delivery operation in SUBMITTING has the MAY_ATTEMPT marker and attempt row of its current attempt "
        "ordinal (they commit with the CAS to SUBMITTING).",
        """
        SELECT o.id AS operation, o.attempt_ordinal, m.id AS marker, a.id AS attempt
        FROM effects_deliveryoperation o
        LEFT JOIN effects_mayattemptmarker m ON m.operation_id = o.id AND m.attempt_ordinal = o.attempt_ordinal
        LEFT JOIN effects_deliveryattempt a ON a.operation_id = o.id AND a.ordinal = o.attempt_ordinal
        WHERE o.execution = 'SUBMITTING' AND (m.id IS NULL OR a.id IS NULL)
        """, ("connector", "effects")),
    Invariant(
        "delivery_marker_without_attempt",
        "Every MAY_ATTEMPT marker has its journal attempt (a marker alone blocks the delivery mutation gate).",
        """
        SELECT m.id AS marker, m.operation_id AS operation, m.attempt_ordinal
        FROM effects_mayattemptmarker m
        WHERE NOT EXISTS (SELECT 1 FROM effects_deliveryattempt a WHERE a.marker_id = m.id)
        """, ("connector", "effects")),
    Invariant(
        "delivery_capacity_over_semaphore",
        "Reserved remote job capacity never exceeds its semaphore's capacity.",
        """
        SELECT s.id AS semaphore, s.capacity, count(a.id) AS reserved
        FROM effects_remotejobsemaphore s JOIN effects_deliveryattempt a ON a.semaphore_id = s.id
        WHERE a.capacity_state = 'reserved'
        GROUP BY s.id, s.capacity HAVING count(a.id) > s.capacity
        """, ("connector", "effects")),
    Invariant(
        "delivery_child_before_parent_admission",
        "No child of a parent still PLANNING exists, and no child has an attempt before its parent's admission.",
        """
        SELECT o.id AS operation, p.id AS parent, p.state AS parent_state
        FROM effects_deliveryoperation o JOIN effects_deliveryparent p ON p.id = o.parent_id
        WHERE p.state <> 'ADMITTED'
           OR EXISTS (SELECT 1 FROM effects_deliveryattempt a WHERE a.operation_id = o.id
                      AND a.created_at < p.admitted_at)
        """, ("connector", "effects")),
    Invariant(
        "delivery_checkpoint_without_full_effect",
        "A parent's contiguous checkpoint frontier counts exactly its promoted children, and they are its first "
        "children in frontier order: no checkpoint beyond the verified full effects. (That a child's own "
        "ELIGIBLE or PROMOTED checkpoint comes with FULLY_APPLIED and PASSED is held by the schema: the axes are "
        "generated from `state`, which a CHECK constraint keeps to the contract's tuples, and every tuple with a "
        "checkpoint pairs it with a verified full effect.)",
        """
        SELECT p.id AS parent, p.contiguous_checkpoint_frontier AS frontier,
               count(o.id) FILTER (WHERE o.checkpoint = 'PROMOTED') AS promoted,
               coalesce(array_agg(o.id ORDER BY o.frontier_order) FILTER (
                   WHERE (o.checkpoint = 'PROMOTED') <> (o.frontier_order <= p.contiguous_checkpoint_frontier)),
                   '{}') AS out_of_frontier
        FROM effects_deliveryparent p LEFT JOIN effects_deliveryoperation o ON o.parent_id = p.id
        GROUP BY p.id
        HAVING count(o.id) FILTER (WHERE o.checkpoint = 'PROMOTED') <> p.contiguous_checkpoint_frontier
            OR bool_or((o.checkpoint = 'PROMOTED') <> (o.frontier_order <= p.contiguous_checkpoint_frontier))
        """, ("connector", "effects")),
)


def _installed(labels: tuple[str, ...]) -> bool:
    return all(apps.is_installed(label) for label in labels)


def _run(cursor, invariant: Invariant, limit: int, report: InvariantReport) -> None:
    cursor.execute(f"SELECT v.*, count(*) OVER () AS _total FROM ({invariant.sql}) v ORDER BY 1 LIMIT %s",
                   [limit])
    columns = [c.name for c in cursor.description]
    rows = cursor.fetchall()
    report.totals[invariant.code] = rows[0][-1] if rows else 0
    for row in rows:
        report.violations.append(Violation(invariant.code, dict(zip(columns[:-1], row[:-1]))))


def invariant_check(*, using: str = "default", limit: int = 100, only: tuple[str, ...] = ()) -> InvariantReport:
    """Run every invariant (or those named in `only`) in one read-only snapshot; at most `limit` offending rows
    are returned per invariant (`totals` counts them all)."""
    report = InvariantReport()
    began = time.monotonic()
    selected = [i for i in INVARIANTS if not only or i.code in only]
    connection = connections[using]
    own_transaction = not connection.in_atomic_block
    with transaction.atomic(using=using):
        with connection.cursor() as cursor:
            if own_transaction:  # not nested in a caller's transaction: pin one snapshot, refuse any write
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            for invariant in selected:
                if not _installed(invariant.needs):
                    report.skipped.append(invariant.code)
                    continue
                _run(cursor, invariant, limit, report)
                report.checked.append(invariant.code)
    report.seconds = time.monotonic() - began
    return report
