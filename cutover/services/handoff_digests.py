"""A successor's OrderingHandoffs checked against their digests and their lanes (issue 19, D-280, D-288, D-289).

A handoff's digest is the sha256 of a JSON list of its columns (`_handoff_digest_of`), written once when the
handoff is (`succession.ordering_handoff`, `succession_handoffs.handoff_chunk`) and recomputed before every
successor activation: by PostgreSQL for every row whose texts it can escape as Python does
(HANDOFF_DIGEST_CHECK_SQL), by Python for the others. Under the activation's lane locks one aggregate compares
every handoff with both of its lanes (HANDOFF_LANE_COMPARISON_SQL). Read-only: no function here writes.
"""
from __future__ import annotations

import hashlib
import hmac
import json

from django.db import transaction

from cutover.errors import SuccessorActivationRefused
from cutover.models import OrderingHandoff


def same_digest(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return hmac.compare_digest(bytes(a), bytes(b))


# The columns a handoff's digest covers, in the digest's order (byte-identical for an instance and a values_list row).
HANDOFF_DIGEST_FIELDS = ("predecessor_epoch_id", "successor_epoch_id", "account_id", "predecessor_lane_id",
                         "predecessor_lane_fence", "successor_lane_id", "route", "predecessor_route_version",
                         "successor_route_version", "partition", "contract", "contract_digest", "high_water",
                         "high_water_tie", "derived_from_id")


# One encoder for every handoff digest: `json.dumps` with separators builds a new JSONEncoder per call (a fifth of
# the verification's time at 40,000 handoffs). The same bytes: `json.dumps(body, separators=(",", ":"))`.
_HANDOFF_JSON = json.JSONEncoder(separators=(",", ":")).encode


def _handoff_digest_of(values) -> bytes:
    *head, contract_digest, high_water, tie, derived_from = values
    body = [*head, bytes(contract_digest).hex(), None if high_water is None else str(high_water),
            None if tie is None else bytes(tie).hex(), derived_from]
    return hashlib.sha256(_HANDOFF_JSON(body).encode()).digest()


def digest_of_handoff(h: OrderingHandoff) -> bytes:
    return _handoff_digest_of([getattr(h, f) for f in HANDOFF_DIGEST_FIELDS])


# A handoff's digest recomputed by PostgreSQL, byte for byte `_handoff_digest_of`'s JSON (D-289): int8::text and
# encode(..., 'hex') are Python's repr() and bytes.hex(); high_water is numeric(38, 0), whose text is str() of its
# Decimal (digits only, never an exponent); a text is written bare between quotes, which is `json.dumps`'s
# (ensure_ascii) escaping only when every character is printable ASCII other than '"' and '\\' (SAFE_TEXT). A row
# with another text is not judged here: `ok` is NULL and Python recomputes it (HANDOFF_PREIMAGE_PARTS_SQL).
# `{rows}` is the relation: the handoff table, or a VALUES list in tests/cutover/test_handoff_digest_sql.py.
SAFE_TEXT = "'^[ !#-\\[\\]-~]*$'"
_HEAD = ("concat('[', h.predecessor_epoch_id, ',', h.successor_epoch_id, ',', h.account_id, ',', "
         "h.predecessor_lane_id, ',', h.predecessor_lane_fence, ',', h.successor_lane_id, ',')")
_VERSIONS = "concat(',', h.predecessor_route_version, ',', h.successor_route_version, ',')"
_TAIL = ("concat(',\"', encode(h.contract_digest, 'hex'), '\",', coalesce('\"' || h.high_water::text || '\"', 'null'), "
         "',', coalesce('\"' || encode(h.high_water_tie, 'hex') || '\"', 'null'), ',', "
         "coalesce(h.derived_from_id::text, 'null'), ']')")
HANDOFF_DIGEST_CHECK_SQL = f"""
SELECT h.id, CASE WHEN h.route ~ {SAFE_TEXT} AND h.partition ~ {SAFE_TEXT} AND h.contract ~ {SAFE_TEXT}
  THEN sha256(convert_to(concat({_HEAD}, '"', h.route, '"', {_VERSIONS}, '"', h.partition, '","', h.contract, '"',
                                {_TAIL}), 'UTF8')) = h.handoff_digest END AS ok
  FROM {{rows}} AS h
"""
# The same preimage in parts, for the rows PostgreSQL did not judge: Python JSON-escapes the three texts.
HANDOFF_PREIMAGE_PARTS_SQL = f"""
SELECT h.id, h.handoff_digest, {_HEAD}, h.route, {_VERSIONS}, h.partition, h.contract, {_TAIL}
  FROM {{rows}} AS h
"""


def handoff_digests_from_parts(rows) -> list[tuple[int, bytes, bytes]]:
    """(pk, stored digest, recomputed digest) of each row of HANDOFF_PREIMAGE_PARTS_SQL: the bytes of
    `_handoff_digest_of` (tests/cutover/test_handoff_digest_sql.py compares both on edge cases)."""
    return [(pk, stored, hashlib.sha256("".join((head, json.dumps(route), versions, json.dumps(partition), ",",
                                                 json.dumps(contract), tail)).encode()).digest())
            for pk, stored, head, route, versions, partition, contract, tail in rows]


def verify_handoff_digests(queryset) -> int:
    """Recompute each handoff's digest from its columns; refuse on a difference. Returns how many were verified.
    Handoff rows are append-only (trigger `cutover_orderinghandoff_append_only`), so a digest verified before the
    activation transaction still holds inside it (D-280). PostgreSQL recomputes and compares every digest it can
    write byte for byte (HANDOFF_DIGEST_CHECK_SQL) and returns only the count and the rows it did not confirm;
    Python recomputes those from their parts, so a row that does not match is named by Python's own digest
    (D-289: 40,000 handoffs in a fifth of the time of building every row's JSON in Python)."""
    subquery, params = queryset.values("pk").query.sql_with_params()
    scope = f" WHERE h.id IN ({subquery}) ORDER BY h.id"
    table = OrderingHandoff._meta.db_table
    with transaction.get_connection(queryset.db).cursor() as cursor:
        cursor.execute(HANDOFF_DIGEST_CHECK_SQL.format(rows=table) + scope, params)
        rows = cursor.fetchall()
        unconfirmed = [pk for pk, ok in rows if not ok]
        if unconfirmed:
            cursor.execute(HANDOFF_PREIMAGE_PARTS_SQL.format(rows=table) + " WHERE h.id = ANY(%s) ORDER BY h.id",
                           [unconfirmed])
            for pk, stored, digest in handoff_digests_from_parts(cursor.fetchall()):
                if not same_digest(stored, digest):
                    raise SuccessorActivationRefused(f"OrderingHandoff #{pk} does not byte-match its recomputed "
                                                     "digest")
    return len(rows)


# Every handoff of the successor compared with both of its lanes, after `cutover.locks.epoch_lanes_for_update`
# locked every lane of both epochs (D-288; D-280 before it): one row, the handoff count and the first ten handoffs
# that differ. The predecessor lane must be the predecessor's, frozen at the handoff's fence and high-water with
# the handoff halt reason; the successor lane the successor's, its baseline and high-water the handoff's, tie
# byte-equal, no active execution. Both lanes are joined by primary key only (the epoch is compared in the
# filter): a join condition on the lane's epoch let the planner scan the epoch's lanes once per handoff
# (quadratic). An aggregate, not `LIMIT 10`: a limit made the planner probe both lanes by index once per handoff
# (85 ms at 40,000 handoffs) where hash joins take a third of that. A separate statement from the lock on purpose:
# it reads the lanes' committed versions after the locks are held, and the tables' statistics keep its plan (and
# its cost estimate, under the JIT threshold) small, which a join of a locking CTE with itself did not (24 ms of
# JIT compilation at 1,000 accounts).
HANDOFF_LANE_COMPARISON_SQL = """
SELECT count(*), (array_agg(h.id ORDER BY h.id) FILTER (WHERE
           o.id IS NULL OR n.id IS NULL OR o.epoch_id IS DISTINCT FROM %(pred)s
        OR o.fence IS DISTINCT FROM h.predecessor_lane_fence
        OR o.high_water IS DISTINCT FROM h.high_water OR o.halt_reason IS DISTINCT FROM %(halt_reason)s
        OR n.epoch_id IS DISTINCT FROM %(succ)s OR n.baseline IS DISTINCT FROM h.high_water
        OR n.high_water IS DISTINCT FROM h.high_water OR n.high_water_tie IS DISTINCT FROM h.high_water_tie
        OR n.active_execution_id IS NOT NULL))[1:10]
  FROM cutover_orderinghandoff AS h
  LEFT JOIN connector_orderinglane AS o ON o.id = h.predecessor_lane_id
  LEFT JOIN connector_orderinglane AS n ON n.id = h.successor_lane_id
 WHERE h.successor_epoch_id = %(succ)s
"""
# The predecessor lanes no handoff names (the refusal's detail, read only when the counts say there is one: handoffs
# are unique per (successor, predecessor lane), so when every handoff matches a predecessor lane, as many handoffs
# as predecessor lanes means every lane has one).
LANES_WITHOUT_HANDOFF_SQL = """
SELECT o.id FROM connector_orderinglane AS o
 WHERE o.epoch_id = %(pred)s AND NOT EXISTS (
       SELECT 1 FROM cutover_orderinghandoff AS h WHERE h.predecessor_lane_id = o.id AND h.successor_epoch_id = %(succ)s)
 ORDER BY o.id LIMIT 10
"""
