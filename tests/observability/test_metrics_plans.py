"""Issue 21: the queries behind /metrics, the stage samples, stuck work and the overview's pipeline pictures cost
the same whatever the retained history (CV2-14-011): partial indexes of live work and BRIN indexes on
append-ordered times. Measured in PostgreSQL's own unit, buffers touched (EXPLAIN ANALYZE BUFFERS), which does
not depend on the machine's load: every statement is run once over 1,000 retained receipts (with their events,
projections, completed executions, attempts and results) and again, the same statement text, over 20,000; no
statement may touch more than a small constant more (two BRIN ranges of 8 pages per table it counts by time).
`make bench` keeps the history bench's 1,000,000-row sizes; this is the same property at test size."""
from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from bench.history_data import generate_history
from bench.metrics_plans import HISTORY_TABLES, capture_statements, grew, measure, recent_work, vacuum_analyze
from connector.demo import build_world

pytestmark = pytest.mark.usefixtures("administrator")

SMALL, BIG = 1_000, 20_000


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_the_metrics_and_overview_queries_touch_as_many_buffers_over_10x_the_history(settings):
    world = build_world("mp-")
    account = world.accounts[0]
    generate_history(account=account, epoch=world.active_epoch, start=0, count=SMALL)
    recent_work(account)
    vacuum_analyze()
    with CaptureQueriesContext(connection) as over_http:
        assert Client().get("/metrics").status_code == 200
    statements = capture_statements(settings.CONNECTOR["STAGE_BUDGETS_SECONDS"])
    assert len(statements) >= 20
    def shape(sql: str) -> str:  # the statement text without the moment it was read at
        return re.sub(r"'[^']*'::timestamptz", "'T'::timestamptz", sql)

    scrape = {shape(q["sql"]) for q in over_http.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")}
    assert scrape and scrape <= {shape(sql) for sql in statements}, "the HTTP scrape runs a SELECT not measured"
    small = {sql: measure(sql) for sql in statements}
    generate_history(account=account, epoch=world.active_epoch, start=SMALL, count=BIG - SMALL)
    vacuum_analyze()
    big = {sql: measure(sql) for sql in statements}
    found = grew(small, big)
    assert not found, "\n".join(f"{b[0]} -> {b[1]} buffers: {sql[:200]}" for sql, b in found.items())
    assert not {t for m in big.values() for t in m["seq_scans"]} & HISTORY_TABLES
    print("buffers per statement, 1,000 -> 20,000 retained receipts:",
          sorted((small[sql]["buffers"], big[sql]["buffers"]) for sql in statements))
