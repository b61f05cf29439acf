"""`manage.py bench metrics-plans`: the queries behind `/metrics`, the stage samples, stuck work and the overview's
pipeline pictures, over 1,000,000 retained receipts (issue 21: "the metrics queries use indexes and stay flat with
1M retained rows"; CV2-14-011).

Every SELECT those four readers run is captured once over a small retained history, then each statement (the same
text) is run under `EXPLAIN (ANALYZE, BUFFERS)` at every size as the history grows through `--sizes`: buffers
touched (PostgreSQL's own unit, independent of the machine's load), its time, and whether its plan reads any table
with a sequential scan. A statement is flat when its buffers at the largest size exceed those at the smallest by at
most `SLACK_BLOCKS` (two 8-page BRIN ranges the recent rows may straddle, and index pages). The test suite proves
the same property from 1,000 to 20,000 (tests/observability/test_metrics_plans.py, with these functions); this
command runs the 1,000,000 size on a throwaway database. The history is generate_history's: receipts with their
admission keys, components, events, projections, completed executions, attempts and results."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

Progress = Callable[[str], None]
SLACK_BLOCKS = 24
# The tables generate_history fills: a sequential scan of one of them at 1,000,000 receipts is a defect; the small
# tables (gates, epochs, lanes, work queues) are rightly scanned whole when the planner finds that cheaper.
HISTORY_TABLES = frozenset({"connector_receipt", "connector_receiptadmissionkey", "connector_event",
                            "connector_receiptcomponent", "connector_projection", "connector_execution",
                            "connector_executionattempt", "connector_applicationresult"})
DEFAULT_DATABASE = "connector_bench_metrics"
RECENT_BODY = (b'{"events":[{"data":{"email":"e@example.com","name":"E"},"id":"ev-%d",'
               b'"occurred_at":"2025-01-01T00:00:00Z","record_id":"rec-%d","sequence":1,"type":"record.updated"}]}')


def vacuum_analyze() -> None:
    """What autovacuum does between the sizes (it also summarizes the BRIN ranges filled since)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
        # Every full range summarized, as autosummarize does shortly after a range fills: a scan must not depend on
        # whether autovacuum got to it yet (unsummarized ranges are read whole).
        cursor.execute("SELECT brin_summarize_new_values(c.oid) FROM pg_class c JOIN pg_am a ON a.oid = c.relam "
                       "WHERE a.amname = 'brin' AND c.relkind = 'i'")


def recent_work(account, n: int = 5) -> None:
    """A few receipts admitted now, so "the last hour" is not empty."""
    from connector.actors import Actor
    from connector.services.admission import receipt_admit

    for i in range(n):
        receipt_admit(account_key=account.account_key, channel="records.webhook", transport_key=f"recent-{i}",
                      body=RECENT_BODY % (i, i), actor=Actor.system("metrics-plans"))


def _selects(*readers: Callable[[], object]) -> list[str]:
    """The distinct SELECTs `readers` run, in the order they ran."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        for reader in readers:
            reader()
    return list(dict.fromkeys(q["sql"] for q in captured.captured_queries
                              if q["sql"].lstrip().upper().startswith("SELECT")))


def _scrape() -> None:
    from prometheus_client import generate_latest

    from observability.metrics import _registry

    generate_latest(_registry())  # what the /metrics view answers


def scrape_statements() -> list[str]:
    """The distinct SELECTs of one `/metrics` scrape alone."""
    return _selects(_scrape)


def capture_statements(budgets: dict) -> list[str]:
    """The distinct SELECTs of one `/metrics` scrape, one stage-sample recording, the stuck-work reading and the
    overview's pipeline pictures, in the order they ran."""
    from governance import selectors
    from observability import readings
    from observability.services import stage_samples_record

    return _selects(_scrape, stage_samples_record, lambda: readings.stuck(budgets), selectors.pipeline)


def _walk(node: dict):
    yield node
    for child in node.get("Plans", ()):
        yield from _walk(child)


def measure(sql: str) -> dict:
    """Buffers touched, execution time and the tables read by sequential scan, from EXPLAIN ANALYZE BUFFERS."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    top = plan[0]["Plan"]
    indexes = sorted({n["Index Name"] for n in _walk(top) if n.get("Index Name")})
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(sum(pg_relation_size(c.oid)), 0) / current_setting('block_size')::int "
                       "FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'brin' "
                       "AND c.relname = ANY(%s)", [indexes])
        brin_pages = int(cursor.fetchone()[0])
    return {"buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
            "ms": round(plan[0].get("Execution Time", 0.0), 3),
            "seq_scans": sorted({n["Relation Name"] for n in _walk(top) if n.get("Node Type") == "Seq Scan"}),
            "brin_pages": brin_pages}


def grew(small: dict[str, dict], big: dict[str, dict], slack: int = SLACK_BLOCKS) -> dict[str, tuple[int, int]]:
    """The statements whose buffers grew by more than `slack` from `small` to `big`, beyond what the BRIN indexes
    they scan grew: a BRIN scan reads its whole (small) index, one summary per 8 heap pages, so its own pages are
    allowed to grow with the table (about 50 per million receipts, docs/benchmarks.md); the heap pages it reads
    are not."""
    return {sql: (small[sql]["buffers"], big[sql]["buffers"]) for sql in small
            if big[sql]["buffers"] > small[sql]["buffers"] + slack
            + max(0, big[sql].get("brin_pages", 0) - small[sql].get("brin_pages", 0))}


def run_metrics_plans(*, sizes: Sequence[int], budgets: dict, say: Progress) -> dict:
    from bench.history_data import generate_history
    from connector.demo import build_world

    world = build_world("mp-")
    account = world.accounts[0]
    sizes = sorted(sizes)
    say(f"history: {sizes[0]:,} receipts")
    generate_history(account=account, epoch=world.active_epoch, start=0, count=sizes[0], progress=say)
    recent_work(account)
    vacuum_analyze()
    statements = capture_statements(budgets)
    scrape = set(scrape_statements()) & set(statements)  # the same text unless it holds the moment it was read
    report = {"bench": "metrics-plans", "sizes": sizes, "statements": len(statements),
              "scrape_statements": len(scrape), "by_size": {},
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    done = sizes[0]
    for size in sizes:
        if size > done:
            say(f"history: {done:,} -> {size:,} receipts")
            began = time.monotonic()
            generate_history(account=account, epoch=world.active_epoch, start=done, count=size - done, progress=say)
            say(f"  generated in {time.monotonic() - began:.0f} s; VACUUM ANALYZE")
            vacuum_analyze()
            done = size
        report["by_size"][size] = {sql: measure(sql) for sql in statements}
    first, last = report["by_size"][sizes[0]], report["by_size"][sizes[-1]]
    found = grew(first, last)
    report["grew"] = {sql[:300]: b for sql, b in found.items()}
    report["scrape_grew"] = {sql[:300]: b for sql, b in found.items() if sql in scrape}
    report["scrape_max_buffers"] = {size: max((m["buffers"] for sql, m in by.items() if sql in scrape), default=0)
                                    for size, by in report["by_size"].items()}
    report["scrape_total_ms"] = {size: round(sum(m["ms"] for sql, m in by.items() if sql in scrape), 2)
                                 for size, by in report["by_size"].items()}
    report["seq_scans_at_largest"] = sorted({t for m in last.values() for t in m["seq_scans"]})
    report["history_seq_scans_at_largest"] = sorted(set(report["seq_scans_at_largest"]) & HISTORY_TABLES)
    report["total_ms"] = {size: round(sum(m["ms"] for m in by.values()), 2) for size, by in report["by_size"].items()}
    report["max_buffers"] = {size: max(m["buffers"] for m in by.values()) for size, by in report["by_size"].items()}
    report["rows"] = [{"sql": sql[:160], "scrape": sql in scrape, **{f"buffers_{s}": report["by_size"][s][sql]["buffers"] for s in sizes},
                       **{f"ms_{s}": report["by_size"][s][sql]["ms"] for s in sizes}} for sql in statements]
    return report


def format_report(report: dict) -> str:
    sizes = report["sizes"]
    lines = [f"bench metrics-plans: {report['statements']} statements at {', '.join(f'{s:,}' for s in sizes)} "
             f"retained receipts (started {report['started_at']})",
             "  ".join([f"buffers@{s:,}" for s in sizes] + [f"ms@{s:,}" for s in sizes] + ["statement"])]
    for row in report["rows"]:
        lines.append("  ".join([f"{row[f'buffers_{s}']:>{len(f'buffers@{s:,}')}}" for s in sizes]
                               + [f"{row[f'ms_{s}']:>{len(f'ms@{s:,}')}}" for s in sizes] + [row["sql"][:90]]))
    lines.append("total ms per scrape-equivalent: " + ", ".join(f"{s:,}: {report['total_ms'][s]}" for s in sizes))
    lines.append("largest buffers of one statement: " + ", ".join(f"{s:,}: {report['max_buffers'][s]}"
                                                                   for s in sizes))
    history = report["history_seq_scans_at_largest"] or "none"
    small = sorted(set(report["seq_scans_at_largest"]) - HISTORY_TABLES) or "none"
    lines.append(f"sequential scans at the largest size: of history tables {history}; of small tables {small}")
    lines.append(f"/metrics scrape ({report['scrape_statements']} statements): total ms "
                 + ", ".join(f"{s:,}: {report['scrape_total_ms'][s]}" for s in sizes) + "; largest buffers "
                 + ", ".join(f"{s:,}: {report['scrape_max_buffers'][s]}" for s in sizes)
                 + f"; grew: {len(report['scrape_grew'])}")
    lines.append(f"grew beyond {SLACK_BLOCKS} buffers (any reader): {len(report['grew'])}"
                 + "".join(f"\n  {b[0]} -> {b[1]}: {sql[:150]}" for sql, b in report["grew"].items()))
    return "\n".join(lines) + "\n"


class MetricsPlans:
    """`bench metrics-plans`: registered in bench/management/commands/bench.py's SUBCOMMANDS."""

    name = "metrics-plans"
    help = ("Buffers and time of every query behind /metrics, stage samples, stuck work and the overview, as the "
            "retained history grows to 1,000,000 receipts, on a throwaway database (issue 21, CV2-14-011).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--sizes", default="1000,1000000", help="retained receipts (default 1000,1000000)")
        parser.add_argument("--json", metavar="FILE", help="write the JSON report to FILE")
        parser.add_argument("--check", action="store_true",
                            help="exit non-zero if a /metrics statement grew beyond the slack or any statement scans a "
                                 "history table sequentially")
        parser.add_argument("--database-name", default=DEFAULT_DATABASE,
                            help=f"throwaway database (default {DEFAULT_DATABASE}; <name>_journal too)")
        parser.add_argument("--keep", action="store_true", help="keep the throwaway databases afterwards")

    def handle(self, command, options: dict) -> None:
        from django.conf import settings
        from django.core.management.base import CommandError

        from bench.databases import ThrowawayDatabases
        from django.db import connections

        try:
            sizes = sorted({int(s) for s in options["sizes"].split(",") if s.strip()})
        except ValueError as exc:
            raise CommandError(f"--sizes: {exc}") from exc
        if len(sizes) < 2 or sizes[0] < 1:
            raise CommandError("--sizes needs at least two positive sizes")
        name = options["database_name"]
        say = command.progress
        with ThrowawayDatabases([name], f"{name}_journal", keep=options["keep"], say=say) as databases:
            connections["default"] = databases.wrappers[name]
            report = run_metrics_plans(sizes=sizes, budgets=settings.CONNECTOR["STAGE_BUDGETS_SECONDS"], say=say)
        report["command"] = f"manage.py bench metrics-plans --sizes {','.join(map(str, sizes))}"
        if options["json"]:
            Path(options["json"]).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
        command.stdout.write(format_report(report))
        # --check holds the /metrics scrape to flatness (issue 21); the other readers' growth is reported above.
        if options["check"] and (report["scrape_grew"] or report["history_seq_scans_at_largest"]):
            raise CommandError(f"{len(report['scrape_grew'])} scrape statement(s) grew; sequential scans of "
                               f"history tables: {report['history_seq_scans_at_largest']}")
