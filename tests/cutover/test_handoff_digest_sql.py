"""The successor activation's handoff digest check in PostgreSQL (D-289) computes the bytes of
`handoff_digests._handoff_digest_of` exactly: every integer, hex, null and numeric high-water as Python writes it, and a
text PostgreSQL cannot escape as `json.dumps` does (a quote, a backslash, a control character, DEL, anything
outside ASCII) is left to Python, whose recomputation from the parts is again the same bytes. A stored digest that
differs is never confirmed.

Proves: CV2-11-023 (each handoff byte-checked against its recomputed digest), CV2-11-052
"""
from __future__ import annotations

import random
from decimal import Decimal

import pytest
from django.db import connection

from cutover.services import handoff_digests

COLUMNS = ("id", "handoff_digest", *handoff_digests.HANDOFF_DIGEST_FIELDS)
TYPES = {"id": "bigint", "handoff_digest": "bytea", "predecessor_epoch_id": "bigint", "successor_epoch_id": "bigint",
         "account_id": "bigint", "predecessor_lane_id": "bigint", "predecessor_lane_fence": "bigint",
         "successor_lane_id": "bigint", "route": "varchar", "predecessor_route_version": "integer",
         "successor_route_version": "integer", "partition": "varchar", "contract": "varchar",
         "contract_digest": "bytea", "high_water": "numeric(38, 0)", "high_water_tie": "bytea",
         "derived_from_id": "bigint"}
SAFE = ["crm.contact", "p-0", "", " ", "~", "[x]", "a!#$%&'()*+,-./:;<=>?@^_`{|}", "ordering.v1"]
UNSAFE = ['q"uote', "back\\slash", "new\nline", "tab\t", "del\x7f", "caf\u00e9", "\u2603 snow", "emoji \U0001F600",
          "nul-less \x01"]


def _row(pk: int, route: str, partition: str, contract: str, rng: random.Random) -> list:
    high_water = rng.choice([None, Decimal(0), Decimal(-5), Decimal("9" * 38), Decimal(rng.randrange(10 ** 12))])
    tie = rng.choice([None, b"", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))])
    values = [rng.randrange(1, 2 ** 62), rng.randrange(1, 2 ** 62), rng.randrange(1, 10 ** 9), rng.randrange(1, 10 ** 9),
              rng.randrange(0, 2 ** 63), rng.randrange(1, 10 ** 9), route, rng.randrange(0, 2 ** 31),
              rng.randrange(0, 2 ** 31), partition, contract, bytes(rng.randrange(256) for _ in range(32)), high_water,
              tie, rng.choice([None, rng.randrange(1, 10 ** 9)])]
    return [pk, handoff_digests._handoff_digest_of(values), *values]


def _relation(rows: list[list]) -> tuple[str, list]:
    placeholders = ", ".join("(" + ", ".join(f"%s::{TYPES[c]}" for c in COLUMNS) + ")" for _ in rows)
    return f"(SELECT * FROM (VALUES {placeholders}) AS v({', '.join(COLUMNS)}))", [v for row in rows for v in row]


def _run(sql_template: str, rows: list[list]) -> list[tuple]:
    relation, params = _relation(rows)
    with connection.cursor() as cursor:
        cursor.execute(sql_template.format(rows=relation) + " ORDER BY h.id", params)
        return cursor.fetchall()


@pytest.mark.django_db
def test_postgres_recomputes_python_digest_or_leaves_the_row_to_python():
    rng = random.Random(19)
    rows, expect_judged = [], {}
    for pk, (route, partition, contract) in enumerate(
            [(r, p, c) for r in SAFE for p in SAFE[:3] for c in SAFE[:2]]
            + [(u, "p-0", "ordering.v1") for u in UNSAFE] + [("crm", u, "c") for u in UNSAFE]
            + [("crm", "p", u) for u in UNSAFE], start=1):
        rows.append(_row(pk, route, partition, contract, rng))
        expect_judged[pk] = all(t in SAFE for t in (route, partition, contract))
    checked = dict(_run(handoff_digests.HANDOFF_DIGEST_CHECK_SQL, rows))
    assert {pk: ok is not None for pk, ok in checked.items()} == expect_judged
    assert all(ok for ok in checked.values() if ok is not None)  # every judged digest is Python's
    parts = handoff_digests.handoff_digests_from_parts(_run(handoff_digests.HANDOFF_PREIMAGE_PARTS_SQL, rows))
    assert [(pk, bytes(stored)) for pk, stored, _ in parts] == [(row[0], row[1]) for row in rows]
    assert all(bytes(stored) == recomputed for _, stored, recomputed in parts)


@pytest.mark.django_db
def test_a_stored_digest_that_differs_is_never_confirmed():
    rng = random.Random(20)
    rows = [_row(1, "crm.contact", "p-0", "ordering.v1", rng), _row(2, "caf\u00e9", "p-1", "ordering.v1", rng)]
    for row in rows:
        row[1] = bytes([row[1][0] ^ 1]) + row[1][1:]
    assert dict(_run(handoff_digests.HANDOFF_DIGEST_CHECK_SQL, rows)) == {1: False, 2: None}
    parts = handoff_digests.handoff_digests_from_parts(_run(handoff_digests.HANDOFF_PREIMAGE_PARTS_SQL, rows))
    assert all(bytes(stored) != recomputed for _, stored, recomputed in parts)
