"""Issue 21: the queries behind /metrics, the stage samples, stuck work and the overview's pipeline pictures cost
the same whatever the retained history (CV2-14-011): partial indexes of live work and BRIN indexes on
append-ordered times. Measured in PostgreSQL's own unit, buffers touched (EXPLAIN ANALYZE BUFFERS), which does
not depend on the machine's load: every statement is run once over 1,000 retained receipts (with their events,
projections, completed executions, attempts and results) and again, the same statement text, over 20,000; no
statement may touch more than a small constant more (two BRIN ranges of 8 pages per table it counts by time).
`make bench` keeps the history bench's 1,000,000-row sizes; this is the same property at test size."""
from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from bench.management.commands.bench import generate_history
from connector.actors import Actor
from connector.demo import build_world
from connector.services.admission import receipt_admit
from governance import selectors
from observability import readings
from observability.services import stage_samples_record

pytestmark = pytest.mark.usefixtures("administrator")

SMALL, BIG = 1_000, 20_000
SLACK_BLOCKS = 24  # two 8-page BRIN ranges (the recent rows may straddle a boundary) and index pages
BODY = (b'{"events":[{"data":{"email":"e@example.com","name":"E"},"id":"ev-%d",'
        b'"occurred_at":"2025-01-01T00:00:00Z","record_id":"rec-%d","sequence":1,"type":"record.updated"}]}')


def _vacuum_analyze() -> None:
    """What autovacuum does between the sizes (it also summarizes the BRIN ranges filled since; autosummarize
    asks it to)."""
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def _buffers(sql: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    top = plan[0]["Plan"]
    return top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_the_metrics_and_overview_queries_touch_as_many_buffers_over_10x_the_history(settings):
    world = build_world("mp-")
    account = world.accounts[0]
    generate_history(account=account, epoch=world.active_epoch, start=0, count=SMALL)
    for i in range(5):  # recent work: the last hour is not empty
        receipt_admit(account_key=account.account_key, channel="records.webhook", transport_key=f"recent-{i}",
                      body=BODY % (i, i), actor=Actor.system("plans"))
    _vacuum_analyze()
    with CaptureQueriesContext(connection) as captured:
        assert Client().get("/metrics").status_code == 200
        stage_samples_record()
        readings.stuck(settings.CONNECTOR["STAGE_BUDGETS_SECONDS"])
        selectors.pipeline()
    statements = list(dict.fromkeys(q["sql"] for q in captured.captured_queries
                                    if q["sql"].lstrip().upper().startswith("SELECT")))
    assert len(statements) >= 20
    small = {sql: _buffers(sql) for sql in statements}
    generate_history(account=account, epoch=world.active_epoch, start=SMALL, count=BIG - SMALL)
    _vacuum_analyze()
    big = {sql: _buffers(sql) for sql in statements}
    grew = {sql[:200]: (small[sql], big[sql]) for sql in statements if big[sql] > small[sql] + SLACK_BLOCKS}
    assert not grew, "\n".join(f"{s[0]} -> {s[1]} buffers: {sql}" for sql, s in grew.items())
    print("buffers per statement, 1,000 -> 20,000 retained receipts:",
          sorted((small[sql], big[sql]) for sql in statements))
