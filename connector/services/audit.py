"""The audit write path. Called inside the transaction of the state change it records (STYLE R12)."""
from __future__ import annotations

import re
from collections.abc import Sequence

from django.db import transaction
from django.utils import timezone

from connector.actors import Actor
from connector.models import AuditRecord

# One audit row per (entity pk, fence) pair, in the order given, with the same columns `audit_record` writes (R31:
# N rows, one statement). `at` is one timestamp for the whole set, taken like auto_now_add (timezone.now()).
AUDIT_INSERT_MANY_SQL = """
INSERT INTO connector_auditrecord (at, actor, actor_user_id, entity_type, entity_id, action, from_state, to_state,
                                   fence, evidence_digest, reason)
SELECT %(at)s::timestamptz, %(actor)s, %(actor_user_id)s::bigint, %(entity_type)s, v.entity_id, %(action)s,
       %(from_state)s, %(to_state)s, v.fence, %(evidence_digest)s::bytea, %(reason)s
  FROM unnest(%(entity_ids)s::text[], %(fences)s::bigint[]) WITH ORDINALITY AS v(entity_id, fence, ordinal)
 ORDER BY v.ordinal
"""

# The audit rows of the rows a data-modifying statement moves, written by that same statement (D-279): `moved` is
# an `UPDATE ... RETURNING` whose rows name `id` (the entity pk) and `fence` (the new fence); one audit row per
# moved row, in `ORDER BY moved.<order_by>`. The UPDATE's row triggers fire before the INSERT reads its rows, and a
# trigger's refusal aborts the one statement: nothing of either half is written.
AUDIT_MOVED_SQL = """
WITH moved AS ({moved})
INSERT INTO connector_auditrecord (at, actor, actor_user_id, entity_type, entity_id, action, from_state, to_state,
                                   fence, evidence_digest, reason)
SELECT %(at)s::timestamptz, %(actor)s, %(actor_user_id)s::bigint, %(entity_type)s, moved.id::text, %(action)s,
       %(from_state)s, %(to_state)s, moved.fence, %(evidence_digest)s::bytea, %(reason)s
  FROM moved
 ORDER BY moved.{order_by}
"""
_COLUMN = re.compile(r"^[a-z_][a-z0-9_]*$")


def audit_record(*, actor: Actor, entity, action: str, from_state: str = "", to_state: str = "",
                 fence: int | None = None, evidence_digest: bytes | None = None, reason: str = "") -> AuditRecord:
    assert transaction.get_connection().in_atomic_block, "audit rows are written inside the audited transaction"
    return AuditRecord.objects.create(
        actor=str(actor), actor_user_id=getattr(actor.user, "pk", None), entity_type=type(entity)._meta.label, entity_id=str(entity.pk), action=action,
        from_state=from_state, to_state=to_state, fence=fence, evidence_digest=evidence_digest, reason=reason)


def audit_records(*, actor: Actor, model, rows: Sequence[tuple[int, int | None]] = (), action: str,
                  from_state: str = "", to_state: str = "", evidence_digest: bytes | None = None, reason: str = "",
                  moved: tuple[str, dict, str] | None = None) -> int:
    """The rows `audit_record` would write for each (entity pk, fence) of `rows` (same actor, action, states,
    evidence and reason), in that order, with one INSERT ... SELECT. Returns the number of rows written. Used by
    whole-service transitions that move N rows of `model` with one statement.

    With `moved` = (UPDATE ... RETURNING id, fence, ..., its parameters, the returned column to order by) instead
    of `rows`, the UPDATE and the INSERT of its audit rows are ONE statement (AUDIT_MOVED_SQL, D-279): the count
    returned is then the number of rows the UPDATE moved, which the caller compares with what it expected."""
    assert transaction.get_connection().in_atomic_block, "audit rows are written inside the audited transaction"
    assert AuditRecord._meta.db_table == "connector_auditrecord"
    params = {"at": timezone.now(), "actor": str(actor), "actor_user_id": getattr(actor.user, "pk", None),
              "entity_type": model._meta.label, "action": action, "from_state": from_state, "to_state": to_state,
              "evidence_digest": evidence_digest, "reason": reason}
    if moved is not None:
        assert not rows, "either the rows or the statement that moves them"
        statement, moved_params, order_by = moved
        assert _COLUMN.match(order_by) and not set(moved_params) & set(params), "a column name; distinct parameters"
        with transaction.get_connection().cursor() as cursor:
            cursor.execute(AUDIT_MOVED_SQL.format(moved=statement.strip(), order_by=order_by),
                           {**moved_params, **params})
            return cursor.rowcount
    if not rows:
        return 0
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(AUDIT_INSERT_MANY_SQL, {**params, "entity_ids": [str(pk) for pk, _ in rows],
                                               "fences": [fence for _, fence in rows]})
        written = cursor.rowcount
    if written != len(rows):
        raise AssertionError(f"{written} audit rows written for {len(rows)} transitions")
    return written


# `AUDIT_INSERT_MANY_SQL` where each row carries its own evidence digest and reason (handoffs, D-282).
AUDIT_INSERT_EACH_SQL = """
INSERT INTO connector_auditrecord (at, actor, actor_user_id, entity_type, entity_id, action, from_state, to_state,
                                   fence, evidence_digest, reason)
SELECT %(at)s::timestamptz, %(actor)s, %(actor_user_id)s::bigint, %(entity_type)s, v.entity_id, %(action)s,
       %(from_state)s, %(to_state)s, v.fence, v.evidence_digest, v.reason
  FROM unnest(%(entity_ids)s::text[], %(fences)s::bigint[], %(evidence)s::bytea[], %(reasons)s::text[])
       WITH ORDINALITY AS v(entity_id, fence, evidence_digest, reason, ordinal)
 ORDER BY v.ordinal
"""


def audit_records_each(*, actor: Actor, model, rows: Sequence[tuple[int, int | None, bytes | None, str]], action: str,
                       from_state: str = "", to_state: str = "") -> int:
    """The rows `audit_record` would write for each (entity pk, fence, evidence digest, reason) of `rows`, in that
    order, with one INSERT ... SELECT. Returns the number of rows written."""
    assert transaction.get_connection().in_atomic_block, "audit rows are written inside the audited transaction"
    if not rows:
        return 0
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(AUDIT_INSERT_EACH_SQL, {
            "at": timezone.now(), "actor": str(actor), "actor_user_id": getattr(actor.user, "pk", None),
            "entity_type": model._meta.label, "action": action, "from_state": from_state, "to_state": to_state,
            "entity_ids": [str(r[0]) for r in rows], "fences": [r[1] for r in rows],
            "evidence": [None if r[2] is None else bytes(r[2]) for r in rows], "reasons": [r[3] for r in rows]})
        written = cursor.rowcount
    if written != len(rows):
        raise AssertionError(f"{written} audit rows written for {len(rows)} records")
    return written



# The audit rows of a caller's data-modifying WITH chain, written by that same statement: the chain (`ctes`, which
# starts with WITH) names a CTE `rows` whose rows carry `entity_id`, `fence`, `reason` and `ord`; one audit row per
# row of it, in `ord`; then the caller's final SELECT runs over its own CTEs. A trigger's refusal anywhere aborts the
# one statement: nothing of the chain or of its audit rows is written.
AUDIT_CHAIN_SQL = """
{ctes}, audit_written AS (
    INSERT INTO connector_auditrecord (at, actor, actor_user_id, entity_type, entity_id, action, from_state, to_state,
                                       fence, evidence_digest, reason)
    SELECT %(audit_at)s::timestamptz, %(audit_actor)s, %(audit_actor_user_id)s::bigint, %(audit_entity_type)s,
           r.entity_id::text, %(audit_action)s, %(audit_from_state)s, %(audit_to_state)s, r.fence, NULL, r.reason
      FROM {rows} r ORDER BY r.ord
)
{select}
"""


def audit_records_in(*, actor: Actor, model, action: str, from_state: str = "", to_state: str = "",
                     chain: tuple[str, str, str, dict]) -> list[tuple]:
    """The rows `audit_record` would write for each row of the caller's CTE, written by the caller's own statement
    (AUDIT_CHAIN_SQL): `chain` = (the WITH chain, the name of its CTE of audited rows, the final SELECT, its
    parameters). One statement for N transitions and their audit rows, the audit table's INSERT this module's.
    Returns the final SELECT's rows."""
    assert transaction.get_connection().in_atomic_block, "audit rows are written inside the audited transaction"
    assert AuditRecord._meta.db_table == "connector_auditrecord"
    ctes, rows, select, params = chain
    assert ctes.lstrip().upper().startswith("WITH") and _COLUMN.match(rows), "a WITH chain and a CTE name"
    audit = {"audit_at": timezone.now(), "audit_actor": str(actor),
             "audit_actor_user_id": getattr(actor.user, "pk", None), "audit_entity_type": model._meta.label,
             "audit_action": action, "audit_from_state": from_state, "audit_to_state": to_state}
    assert not set(params) & set(audit), "the chain's parameters are not named audit_*"
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(AUDIT_CHAIN_SQL.format(ctes=ctes.strip(), rows=rows, select=select.strip()),
                       {**params, **audit})
        return cursor.fetchall()
