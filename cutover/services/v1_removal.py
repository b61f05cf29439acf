"""Removing the V1 tables after the cutover (seed "Offline V1 shutdown, cold rollback, and V2 cutover";
CV2-12-078), operator-run and audited: `manage.py v1_tables check|remove`.

V1 is retired (terminal read-only by trigger, D-292) at the first `v2_committed`; its tables stay as evidence
until nothing depends on them. Each dependency is one database query that lists the rows still depending on V1
(empty = satisfied); the removal refuses with V1_REMOVAL_REFUSED naming every non-empty one by its stable code and
changes nothing:

- `v1_not_retired`: no service cutover attempt is `v2_committed` (V1 is still recoverable authority);
- `not_table_owner`: the connected role does not own a V1 table (the application role never does: run the command
  with the owner's credentials, as migrations are);
- `v2_foreign_key`: a constraint of a non-V1 table references a V1 table;
- `tombstone_missing`: an accepted V1 transport identity without its exact V1AcceptanceTombstone (account,
  channel, transport key, payload digest, predecessor `v1:workitem:<id>`) -- the tombstone is what keeps a
  redelivery from executing twice once the row is gone;
- `baseline_missing`: a drained V1 high-water of a route the committed certificate does not call
  order-independent without its exact OrderingBaseline of the committed attempt;
- `replay_predecessor_unresolved`: a tombstone whose V1 predecessor reference does not name a V1 row with the same
  account, transport key and payload digest (the predecessor evidence would be unverifiable after the drop);
- `audit_retention_pending`: an audit record or `v1_stopped` reconciliation about V1 rows, or the V2 commit itself,
  younger than CUTOVER_V1_AUDIT_RETENTION_SECONDS (the V1 rows are that period's audit trail). Retention only
  delays the removal; it never makes anything else safe.

`v1_tables_remove` locks every V1 table ACCESS EXCLUSIVE, reruns every check inside the same transaction, records
each table's row count and content digest, drops them all with one DROP TABLE and writes the V1TableRemoval and
its audit record in that one transaction. Afterwards no V1 read path exists: the rows are gone, V2 never imported
V1 (tests/cutover/test_v1_table_removal.py).
"""
from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import connection, transaction

from connector.actors import Actor
from connector.services.audit import audit_record
from cutover.errors import V1RemovalRefused
from cutover.models import (
    AttemptOutcome,
    CutoverReadinessCertificate,
    OrderingDisposition,
    ServiceCutoverAttempt,
    V1TableRemoval,
)
from cutover.ports import v1_owner
from cutover.services.preflight import attempt_account_keys, evidence_digest, require_coordinator

DEFAULT_RETENTION_SECONDS = 90 * 24 * 3600
SAMPLE = 10
RETAINED_ACTIONS = ("v1_reconcile",)  # audit actions whose records are about V1 rows

CHECKS: dict[str, str] = {
    "not_table_owner": """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = current_schema() AND c.relname = ANY(%(tables)s)
   AND NOT pg_has_role(current_user, c.relowner, 'USAGE') ORDER BY 1 LIMIT %(sample)s""",
    "v2_foreign_key": """
SELECT r.relname || '.' || k.conname FROM pg_constraint k JOIN pg_class r ON r.oid = k.conrelid
  JOIN pg_class f ON f.oid = k.confrelid
 WHERE k.contype = 'f' AND f.relname = ANY(%(tables)s) AND NOT (r.relname = ANY(%(tables)s))
 ORDER BY 1 LIMIT %(sample)s""",
    # The V1 rows come through the V1 owner port (V2 code never names a V1 table, CV2-12-006), as arrays.
    "tombstone_missing": """
SELECT w.ref FROM unnest(%(w_ref)s::text[], %(w_account)s::text[], %(w_source)s::text[], %(w_transport)s::text[],
                         %(w_digest)s::bytea[]) AS w(ref, account_key, source_key, transport_key, payload_digest)
 WHERE NOT EXISTS (
   SELECT 1 FROM connector_v1acceptancetombstone t JOIN connector_connectoraccount a ON a.id = t.account_id
    WHERE a.account_key = w.account_key AND t.channel = w.source_key AND t.transport_key = w.transport_key
      AND t.payload_digest = w.payload_digest AND t.predecessor_ref = w.ref)
 ORDER BY w.ref LIMIT %(sample)s""",
    "baseline_missing": """
SELECT 'v1:highwater:' || h.account_key || '/' || h.route_key || '/' || h.partition
  FROM unnest(%(h_account)s::text[], %(h_route)s::text[], %(h_partition)s::text[], %(h_value)s::numeric[])
       AS h(account_key, route_key, partition, high_water)
 WHERE NOT (h.route_key = ANY(%(order_independent)s))
   AND NOT EXISTS (
   SELECT 1 FROM cutover_orderingbaseline b JOIN connector_connectoraccount a ON a.id = b.account_id
    WHERE b.attempt_id = %(attempt)s AND a.account_key = h.account_key AND b.route_key = h.route_key
      AND b.partition = h.partition AND b.high_water = h.high_water)
 ORDER BY 1 LIMIT %(sample)s""",
    "replay_predecessor_unresolved": """
SELECT 'tombstone:' || t.id FROM connector_v1acceptancetombstone t JOIN connector_connectoraccount a
    ON a.id = t.account_id
 WHERE t.predecessor_ref LIKE 'v1:%%' AND NOT EXISTS (
   SELECT 1 FROM unnest(%(w_ref)s::text[], %(w_account)s::text[], %(w_source)s::text[], %(w_transport)s::text[],
                        %(w_digest)s::bytea[]) AS w(ref, account_key, source_key, transport_key, payload_digest)
    WHERE t.predecessor_ref = w.ref AND w.account_key = a.account_key
      AND w.source_key = t.channel AND w.transport_key = t.transport_key AND w.payload_digest = t.payload_digest)
 ORDER BY t.id LIMIT %(sample)s""",
    "audit_retention_pending": """
(SELECT 'audit:' || r.id FROM connector_auditrecord r
  WHERE (r.action = ANY(%(retained_actions)s) OR r.entity_type LIKE 'v1.%%')
    AND r.at > now() - make_interval(secs => %(retention)s)
 UNION ALL
 SELECT 'reconciliation:' || c.id FROM cutover_v1reconciliation c
  WHERE c.created_at > now() - make_interval(secs => %(retention)s)
 UNION ALL
 SELECT 'v2_committed:' || s.attempt_key FROM cutover_servicecutoverattempt s
  WHERE s.outcome = 'v2_committed' AND s.closed_at > now() - make_interval(secs => %(retention)s))
 ORDER BY 1 LIMIT %(sample)s""",
}


def retention_seconds() -> float:
    return float(getattr(settings, "CUTOVER_V1_AUDIT_RETENTION_SECONDS", DEFAULT_RETENTION_SECONDS))


def committed_attempt() -> ServiceCutoverAttempt | None:
    return ServiceCutoverAttempt.objects.filter(outcome=AttemptOutcome.V2_COMMITTED).order_by("pk").first()


def _present(tables: tuple[str, ...]) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                       "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND relname = ANY(%s)",
                       [list(tables)])
        return [r[0] for r in cursor.fetchall()]


def _v1_rows(attempt: ServiceCutoverAttempt) -> dict[str, list]:
    """The V1 work-item identities and drained high-waters of the attempt's accounts, read by the V1 owner port
    (the only reader of V1 tables), as the check queries' array parameters."""
    owner, keys = v1_owner(), attempt_account_keys(attempt)
    items = owner.transport_identities(keys)
    waters = owner.high_waters(keys)
    return {"w_ref": [i.predecessor_ref for i in items], "w_account": [i.account_key for i in items],
            "w_source": [i.source_key for i in items],
            "w_transport": [bytes(i.transport_identity).decode() for i in items],
            "w_digest": [bytes(i.payload_digest) for i in items],
            "h_account": [w.account_key for w in waters], "h_route": [w.route_key for w in waters],
            "h_partition": [bytes(w.partition_key).decode() for w in waters],
            "h_value": [int(bytes(w.high_water).decode()) for w in waters]}


def v1_removal_dependencies() -> list[tuple[str, list[str]]]:
    """Every dependency still holding the V1 tables: (stable code, up to SAMPLE dependent row references)."""
    attempt = committed_attempt()
    if attempt is None:
        return [("v1_not_retired", ["no service cutover attempt is v2_committed"])]
    routes = CutoverReadinessCertificate.objects.get(attempt=attempt).routes
    params = {"tables": list(v1_owner().tables()), "sample": SAMPLE, "attempt": attempt.pk,
              "order_independent": [r["route"] for r in routes
                                    if r["disposition"] == OrderingDisposition.ORDER_INDEPENDENT],
              "retained_actions": list(RETAINED_ACTIONS), "retention": retention_seconds(), **_v1_rows(attempt)}
    found = []
    with connection.cursor() as cursor:
        for code, sql in CHECKS.items():
            cursor.execute(sql, params)
            rows = [r[0] for r in cursor.fetchall()]
            if rows:
                found.append((code, rows))
    return found


def _refuse_if(found: list[tuple[str, list[str]]]) -> None:
    if found:
        raise V1RemovalRefused("the V1 tables cannot be removed yet: " + "; ".join(
            f"{code}: {', '.join(rows)}" for code, rows in found), reasons=[code for code, _ in found])


def _table_evidence(cursor, table: str) -> list:
    cursor.execute(f'SELECT t::text FROM "{table}" t ORDER BY 1')
    h = hashlib.sha256(b"nexuscrm.v1.table.v1")
    rows = 0
    for (text,) in cursor.fetchall():
        h.update(b"\x01" + text.encode())
        rows += 1
    return [table, rows, h.hexdigest()]


def _removed(tables: tuple[str, ...]) -> V1TableRemoval | None:
    """The removal record when the tables are gone; None when they are all present; refused when some are gone
    without a record (not this product's removal: nothing is assumed)."""
    present = _present(tables)
    existing = V1TableRemoval.objects.first()
    if existing is not None and not present:
        return existing
    if len(present) != len(tables):
        raise V1RemovalRefused("V1 tables are missing without a removal record: " + ", ".join(
            sorted(set(tables) - set(present))), reasons=["v1_tables_incomplete"])
    return None


def v1_tables_remove(*, reason: str, actor: Actor) -> V1TableRemoval:
    """Drop every V1 table in one transaction once no dependency holds them; idempotent (the record is returned
    when the tables are already gone)."""
    require_coordinator(actor)
    if not reason.strip():
        raise V1RemovalRefused("a removal needs a reason", reasons=["reason_missing"])
    tables = v1_owner().tables()
    existing = _removed(tables)
    if existing is not None:
        return existing
    _refuse_if(v1_removal_dependencies())  # fail fast, before any lock
    with transaction.atomic():
        # Concurrent removals serialize on the committed attempt's row; the later one finds the record.
        attempt = ServiceCutoverAttempt.objects.select_for_update().get(pk=committed_attempt().pk)
        existing = _removed(tables)
        if existing is not None:
            return existing
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE " + ", ".join(f'"{t}"' for t in tables) + " IN ACCESS EXCLUSIVE MODE")
        _refuse_if(v1_removal_dependencies())  # again, with the V1 tables locked
        with connection.cursor() as cursor:
            dropped = [_table_evidence(cursor, t) for t in tables]
            checks = [[code, 0] for code in ("v1_not_retired", *CHECKS)]
            value = {"attempt": attempt.attempt_key, "tables": dropped, "checks": checks,
                     "retention_s": retention_seconds(), "reason": reason, "actor": str(actor)}
            payload, digest = evidence_digest("v1_table_removal", value)
            cursor.execute("DROP TABLE " + ", ".join(f'"{t}"' for t in tables))
        removal = V1TableRemoval.objects.create(attempt=attempt, tables=dropped, checks=checks, reason=reason,
                                                removed_by=str(actor), payload=payload, digest=digest)
        audit_record(actor=actor, entity=removal, action="v1_tables_removed", evidence_digest=digest,
                     reason=reason)
    return removal
