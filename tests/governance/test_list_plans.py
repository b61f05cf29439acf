"""Issue 38 item 2: the list pages (receipts, lanes, executions, remote effects) cost the same whatever the
retained history, the same kind of proof `/metrics` has (tests/observability/test_metrics_plans.py). Every SELECT
each list page runs over HTTP, with every filter (account, state, reason code, age, lane) and a page deep in the
history, is captured over 1,000 retained receipts (with their events, projections, completed executions, results,
and as many finalized remote effects) and run again, the same statement text, under EXPLAIN (ANALYZE, BUFFERS)
over 20,000 in the suite and 100,000 in `make bench`: no statement may touch more than a small constant more
buffers, none reads a history table by sequential scan, and each page runs the same number of statements at both sizes (pinned: no query per row)."""
from __future__ import annotations

import os

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from bench.history_data import generate_history
from bench.metrics_plans import HISTORY_TABLES, grew, measure, recent_work, vacuum_analyze
from connector.demo import build_world
from connector.models import Execution, OrderingLane, Receipt
from effects.models import OutboundCommand
from tests.effects.test_remote_identity import push

pytestmark = pytest.mark.usefixtures("administrator")

# The suite grows the history 20x; `make bench` runs this test at 100x (LIST_PLANS_RECEIPTS=100000), the issue's
# figure. A statement that is not flat (a sequential scan, a sort of the history) grows with either factor.
SMALL, BIG = 1_000, int(os.environ.get("LIST_PLANS_RECEIPTS", "20000"))
LIST_TABLES = HISTORY_TABLES | {"effects_remoteeffect", "effects_outboundcommand"}


def _columns(cursor, table: str) -> list[str]:
    cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s AND column_name <> 'id' "
                   "ORDER BY ordinal_position", [table])
    return [c for (c,) in cursor.fetchall()]


def effect_history(account, start: int, count: int) -> None:
    """`count` finalized RemoteEffects (with their OutboundCommands), copies of the account's first real command
    and effect under new EffectRoots, changed long ago: the effect history a year of pushes leaves."""
    template = OutboundCommand.objects.filter(account=account).order_by("pk").first()
    with connection.cursor() as cursor:
        columns = _columns(cursor, "effects_outboundcommand")
        chosen = {"effect_root_id": "'hist-root-' || g", "effect_generation_id": "'hist-gen-' || g",
                  "idempotency_key": "sha256(convert_to('hist-cmd-' || g, 'UTF8'))",
                  "created_at": "now() - interval '400 days' + g * interval '10 seconds'"}
        cursor.execute(f"INSERT INTO effects_outboundcommand ({', '.join(columns)}) "
                       f"SELECT {', '.join(chosen.get(c, c) for c in columns)} FROM effects_outboundcommand, "
                       f"generate_series(%s, %s) g WHERE id = %s", [start, start + count - 1, template.pk])
        columns = _columns(cursor, "effects_remoteeffect")
        chosen = {"command_id": "c.id", "logical_effect_digest": "c.idempotency_key", "state": "'finalized'",
                  "lease_holder": "''", "lease_expires_at": "NULL", "lease_fence": "0", "attempt_count": "1",
                  "remote_id": "'remote-' || c.id", "quarantine_reason": "''", "changed_at": "c.created_at"}
        cursor.execute(f"INSERT INTO effects_remoteeffect ({', '.join(columns)}) "
                       f"SELECT {', '.join(chosen.get(col, 'e.' + col) for col in columns)} "
                       "FROM effects_outboundcommand c, effects_remoteeffect e WHERE e.command_id = %s "
                       "AND c.effect_root_id LIKE 'hist-root-%%' "
                       "AND NOT EXISTS (SELECT 1 FROM effects_remoteeffect x WHERE x.command_id = c.id)",
                       [template.pk])


def pages(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_relation_size(%s) / current_setting('block_size')::int", [table])
        return cursor.fetchone()[0]


def list_urls(account_pk: int, lane_pk: int, receipt_pk: int, execution_pk: int) -> list[str]:
    urls = []
    for path, states, reason in (("/receipts/", ("waiting", "held", "materialized"), "EVENT_KEY_CONFLICT"),
                                 ("/executions/", ("ready", "waiting_dependency", "completed", "quarantined"),
                                  "RESULT_FAILED"),
                                 ("/lanes/", ("open", "halted"), "GAP_DEADLINE"),
                                 ("/effects/", ("prepared", "dispatching", "uncertain", "quarantined",
                                               "remote_confirmed", "no_effect", "finalized"),
                                  "REMOTE_LINK_CONFLICT")):
        urls += [path, f"{path}?account={account_pk}", f"{path}?reason={reason}", f"{path}?older_than=1440",
                 f"{path}?older_than=5", *(f"{path}?state={s}" for s in states),
                 f"{path}?account={account_pk}&state={states[-1]}&older_than=60"]
    urls += [f"/executions/?lane={lane_pk}", f"/receipts/?before={receipt_pk}",
             f"/executions/?before={execution_pk}", f"/receipts/?reason=EVENT_KEY_CONFLICT&before={receipt_pk}"]
    return urls


def capture(client: Client, urls: list[str]) -> tuple[dict[str, int], list[str]]:
    """Per URL the number of statements its page ran; every distinct SELECT, in order."""
    counts, selects = {}, []
    for url in urls:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url).status_code == 200, url
        counts[url] = len(captured.captured_queries)
        selects += [q["sql"] for q in captured.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]
    return counts, list(dict.fromkeys(selects))


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_every_list_statement_touches_as_many_buffers_over_a_longer_history(people):
    """Proves: issue 38 item 2 (each list page's statements pinned and flat over the retained history; `make bench`
    runs it over 100,000 retained receipts)."""
    world = build_world("lp-", push=True)
    account = world.accounts[0]
    push(account, "lp-r1", 1)
    generate_history(account=account, epoch=world.active_epoch, start=0, count=SMALL)
    effect_history(account, 0, SMALL)
    recent_work(account)
    vacuum_analyze()
    client = Client()
    client.force_login(people["auditor"])
    lane_pk = Execution.objects.filter(lane__isnull=False).order_by("pk").values_list("lane_id", flat=True)[0]
    middle = Receipt.objects.order_by("pk").values_list("pk", flat=True)[SMALL // 2]
    execution_middle = Execution.objects.order_by("pk").values_list("pk", flat=True)[SMALL // 2]
    urls = list_urls(account.pk, lane_pk, middle, execution_middle)
    small_counts, statements = capture(client, urls)
    assert len(statements) >= 40
    small = {sql: measure(sql) for sql in statements}
    lanes, lane_pages = OrderingLane.objects.count(), pages("connector_orderinglane")

    generate_history(account=account, epoch=world.active_epoch, start=SMALL, count=BIG - SMALL)
    effect_history(account, SMALL, BIG - SMALL)
    vacuum_analyze()
    big_counts, big_statements = capture(client, urls)
    assert big_counts == small_counts, "a list page runs more statements over a longer history"
    big = {sql: measure(sql) for sql in statements}
    # A lane is one per partition, not per receipt (1,001 at both sizes): a statement that reads the lane table
    # whole may grow by the pages the lanes' rewrites left behind (each history batch moves every lane's
    # high-water), never by the history.
    assert OrderingLane.objects.count() == lanes
    lane_growth = pages("connector_orderinglane") - lane_pages
    found = {sql: b for sql, b in grew(small, big).items()
             if not ("connector_orderinglane" in big[sql]["seq_scans"]
                     and not set(big[sql]["seq_scans"]) & LIST_TABLES and b[1] - b[0] <= lane_growth + 24)}
    assert not found, "\n".join(f"{b[0]} -> {b[1]} buffers: {sql[-400:]}" for sql, b in found.items())
    scans = {sql[:200]: m["seq_scans"] for sql, m in big.items() if set(m["seq_scans"]) & LIST_TABLES}
    assert not scans, scans
    print(f"buffers per statement, {SMALL:,} -> {BIG:,} retained receipts:",
          sorted((small[sql]["buffers"], big[sql]["buffers"]) for sql in statements), f"lane pages +{lane_growth}")
