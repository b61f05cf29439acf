"""`manage.py bench history`: admission latency (receipt_admit + receipt_materialize of a 1-event body) and claim
latency (lane_advance + execution_claim) for one account as its retained history grows from 10 to 1,000,000
receipts/events (CV2-14-010, CV2-14-011: the hot path must not depend on retained history).

`history` creates its own throwaway databases on the PostgreSQL server of DATABASE_URL (`--database-name`, default
`connector_bench`: `connector_bench_<size>` per size and `connector_bench_journal`), migrates them, builds the
demo world in each through the services, generates the retained history with bulk `INSERT ... SELECT
generate_series` statements, `ANALYZE`s, then times sequential operations with fresh keys, in blocks that
alternate between the sizes so that load from other processes on a shared machine affects every size alike.
`--sequential` instead grows one database through the sizes and times each size in turn. The databases are
dropped afterwards unless `--keep`. See docs/benchmarks.md.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections

from bench import history_ratio_limit
from bench.databases import NAME_RE, ThrowawayDatabases
from bench.history_data import CHANNEL, analyze, generate_history, history_count, retained_counts
from bench.options import integer_list
from bench.stats import Stats
from bench.subcommand import Subcommand
from connector.demo import demo_event_body

CHECK_TOLERANCE = 0.20

Progress = Callable[[str], None]


@dataclass
class SizeResult:
    size: int
    retained: dict[str, int]
    generated_rows: int
    generation_seconds: float
    admission_ms: Stats
    claim_ms: Stats
    load_average: float = 0.0  # 1-minute load average of the machine right after timing (noise indicator)

    @property
    def rows_per_second(self) -> float:
        return self.generated_rows / self.generation_seconds if self.generation_seconds else 0.0


@dataclass
class HistoryReport:
    account_key: str
    iterations: int
    results: list[SizeResult] = field(default_factory=list)
    postgres: str = ""
    cpus: int = 0
    database: str = ""
    mode: str = "sequential"

    def as_dict(self) -> dict:
        return {"account_key": self.account_key, "iterations": self.iterations, "postgres": self.postgres,
                "cpus": self.cpus, "database": self.database, "mode": self.mode,
                "sizes": [{**asdict(r), "rows_per_second": round(r.rows_per_second, 1)} for r in self.results]}

    def admission_ratio(self) -> float:
        """p50 admission latency of the largest size over that of the smallest."""
        first, last = self.results[0], self.results[-1]
        return last.admission_ms.p50 / first.admission_ms.p50

    def claim_ratio(self) -> float:
        first, last = self.results[0], self.results[-1]
        return last.claim_ms.p50 / first.claim_ms.p50


# -- the timed operations ---------------------------------------------------------------------------------------

def _body(tag: str) -> bytes:
    return demo_event_body(tag)


def _admit(account_key: str, tag: str):
    from connector.actors import Actor
    from connector.services.admission import receipt_admit
    from connector.services.materialize import receipt_materialize

    began = time.perf_counter()
    admission = receipt_admit(account_key=account_key, channel=CHANNEL, transport_key=f"bench-{tag}",
                              body=_body(tag), actor=Actor.system("bench"))
    receipt_materialize(receipt_pk=admission.receipt.pk)
    elapsed = time.perf_counter() - began
    assert admission.outcome == "created", admission.outcome
    return elapsed, admission.receipt.pk


def _claim(account_id: int, receipt_pk: int) -> float:
    from connector.models import Projection
    from connector.services.execution import execution_claim, execution_run, lane_advance

    lane_pk = Projection.objects.filter(event__receipt_id=receipt_pk).values_list("lane_id", flat=True).get()
    began = time.perf_counter()
    minted = lane_advance(lane_pk=lane_pk)
    token = execution_claim(holder="bench", lease_seconds=60, account_id=account_id)
    elapsed = time.perf_counter() - began
    assert minted is not None and token is not None and token.execution_pk == minted.pk, (minted, token)
    execution_run(token=token)  # untimed: completes it, so the ready set stays as small as in production
    return elapsed


def _time_block(account, tag: str, count: int) -> tuple[list[float], list[float]]:
    """Time `count` sequential admissions (with materialization), then as many claims; milliseconds."""
    admissions, receipts = [], []
    gc.collect()
    for i in range(count):
        elapsed, receipt_pk = _admit(account.account_key, f"{tag}-{i}")
        admissions.append(elapsed * 1000)
        receipts.append(receipt_pk)
    gc.collect()
    return admissions, [_claim(account.pk, receipt_pk) * 1000 for receipt_pk in receipts]


def _warm(account, tag: str, warmup: int) -> None:
    for i in range(warmup):
        _, receipt_pk = _admit(account.account_key, f"{tag}-w{i}")
        _claim(account.pk, receipt_pk)


def _grow(account_key: str, size: int, say: Progress):
    """Grow the account's retained history on the current database to `size` receipts, then ANALYZE.
    Returns (account, generated rows, seconds)."""
    from connector.services.admission import account_get

    account = account_get(account_key)
    have = history_count(account.pk)
    missing = max(0, size - retained_counts(account.pk)["receipts"])
    say(f"size {size:,}: generating {missing:,} retained receipts/events")
    began = time.monotonic()
    rows = generate_history(account=account, epoch=account.serving_gate.epoch, start=have, count=missing,
                            progress=say)
    analyze()
    return account_get(account_key), rows, time.monotonic() - began


def _new_report(account_key: str, iterations: int) -> HistoryReport:
    report = HistoryReport(account_key=account_key, iterations=iterations, cpus=os.cpu_count() or 0,
                           database=connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        report.postgres = cursor.fetchone()[0]
    return report


def measure_history(*, account_key: str, sizes: Sequence[int], iterations: int,
                    progress: Progress | None = None, warmup: int = 20) -> HistoryReport:
    """Sequential mode, one database: for each size N (ascending) grow the account's retained history to N
    receipts/events in bulk SQL, ANALYZE, and time `iterations` admissions and claims. Runs on the current
    `default` database, which must hold a world whose account `account_key` is `v2_serving` on the demo route
    (connector.demo.build_world). The receipts admitted while timing a size count towards the next size."""
    say = progress or (lambda _msg: None)
    report = _new_report(account_key, iterations)
    run_tag = f"{int(time.time() * 1000):x}"
    for size in sorted(set(sizes)):
        account, rows, seconds = _grow(account_key, size, say)
        retained = retained_counts(account.pk)
        say(f"size {size:,}: {retained['receipts']:,} receipts retained; timing {iterations} admissions "
            f"and {iterations} claims")
        _warm(account, f"{run_tag}-{size}", warmup)
        admissions, claims = _time_block(account, f"{run_tag}-{size}", iterations)
        report.results.append(SizeResult(size=size, retained=retained, generated_rows=rows,
                                         generation_seconds=round(seconds, 3), admission_ms=Stats.of(admissions),
                                         claim_ms=Stats.of(claims), load_average=round(os.getloadavg()[0], 2)))
    return report


def measure_history_interleaved(*, account_key: str, databases: dict[int, object], iterations: int,
                                progress: Progress | None = None, warmup: int = 20,
                                block: int = 10) -> HistoryReport:
    """Interleaved mode, one database per size (`databases` maps size -> DatabaseWrapper, each holding the demo
    world): grow each to its size, then time blocks of `block` admissions and claims in turn on each database,
    alternating the order, so a load change on a shared machine hits every size alike."""
    say = progress or (lambda _msg: None)
    original = connections["default"]
    try:
        prepared = {}
        for size, wrapper in sorted(databases.items()):
            connections["default"] = wrapper
            account, rows, seconds = _grow(account_key, size, say)
            prepared[size] = (wrapper, account, rows, seconds, retained_counts(account.pk))
        report = _new_report(account_key, iterations)
        report.database = ", ".join(w.settings_dict["NAME"] for w in databases.values())
        run_tag = f"{int(time.time() * 1000):x}"
        samples = {size: ([], []) for size in prepared}
        say(f"timing {iterations} admissions and {iterations} claims per size, in blocks of {block}, interleaved")
        for size, (wrapper, account, *_rest) in prepared.items():
            connections["default"] = wrapper
            _warm(account, f"{run_tag}-{size}", warmup)
        done, order = 0, sorted(prepared)
        while done < iterations:
            count = min(block, iterations - done)
            for size in order:
                wrapper, account, *_rest = prepared[size]
                connections["default"] = wrapper
                admissions, claims = _time_block(account, f"{run_tag}-{size}-{done}", count)
                samples[size][0].extend(admissions)
                samples[size][1].extend(claims)
            done += count
            order.reverse()
        load = round(os.getloadavg()[0], 2)
        for size, (_wrapper, _account, rows, seconds, retained) in prepared.items():
            report.results.append(SizeResult(size=size, retained=retained, generated_rows=rows,
                                             generation_seconds=round(seconds, 3),
                                             admission_ms=Stats.of(samples[size][0]),
                                             claim_ms=Stats.of(samples[size][1]), load_average=load))
        return report
    finally:
        connections["default"] = original


def format_table(report: HistoryReport) -> str:
    head = (f"{'retained':>12} {'operation':<10} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
            f"{'mean ms':>8} {'max ms':>8} {'load':>5}")
    lines = [head, "-" * len(head)]
    for r in report.results:
        for name, s in (("admission", r.admission_ms), ("claim", r.claim_ms)):
            lines.append(f"{r.retained['receipts']:>12,} {name:<10} {s.n:>5} {s.p50:>8.2f} {s.p95:>8.2f} "
                         f"{s.p99:>8.2f} {s.mean:>8.2f} {s.max:>8.2f} {r.load_average:>5.2f}")
    if len(report.results) > 1:
        lines.append(f"p50 ratio largest/smallest: admission {report.admission_ratio():.2f}, "
                     f"claim {report.claim_ratio():.2f}")
    return "\n".join(lines)


class History(Subcommand):
    name = "history"
    help = ("Admission and claim latency for one account with N retained receipts/events of history, for each "
            "N in --sizes, on a throwaway database.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--sizes", default="10,100000,1000000",
                            help="retained history sizes, comma-separated (default 10,100000,1000000)")
        parser.add_argument("--iterations", type=int, default=300,
                            help="timed admissions and claims per size (default 300)")
        parser.add_argument("--warmup", type=int, default=20,
                            help="untimed admission+claim rounds before each size (default 20)")
        parser.add_argument("--database-name", default="connector_bench",
                            help="prefix of the throwaway databases the run creates and drops: <name>_<size> "
                                 "per size (one <name> with --sequential) and <name>_journal "
                                 "(default connector_bench)")
        parser.add_argument("--sequential", action="store_true",
                            help="one database whose history grows through the sizes, each size timed in turn, "
                                 "instead of one database per size timed in interleaved blocks")
        parser.add_argument("--block", type=int, default=10,
                            help="interleaved mode: timed operations per size before switching (default 10)")
        parser.add_argument("--keep", action="store_true", help="keep the throwaway database afterwards")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--check", action="store_true",
                            help="exit non-zero if the largest size's p50 admission latency is more than "
                                 f"{CHECK_TOLERANCE:.0%}% above the smallest size's (limit from bench/budgets.json)")

    def handle(self, command: BaseCommand, options: dict) -> None:
        sizes = integer_list(options["sizes"], "--sizes", low=0, needs="--sizes needs at least one non-negative size")
        if options["iterations"] < 1:
            raise CommandError("--iterations must be at least 1")
        if options["check"] and len(sizes) < 2:
            raise CommandError("--check compares two sizes at least")
        if options["block"] < 1 or options["warmup"] < 0:
            raise CommandError("--block must be at least 1 and --warmup not negative")
        for name in (options["database_name"], f"{options['database_name']}_journal"):
            if not NAME_RE.match(name):
                raise CommandError(f"--database-name {options['database_name']!r} must match {NAME_RE.pattern}")
        say = command.progress
        quiet = options["verbosity"] < 2  # the services log one INFO line per admission: keep the output readable
        connector_log = logging.getLogger("connector")
        saved_level = connector_log.level
        if quiet:
            connector_log.setLevel(logging.WARNING)
        try:
            report = self._run(options, sizes, say)
        finally:
            connector_log.setLevel(saved_level)
        self._print(command, options, report)

    def _run(self, options: dict, sizes: list[int], say: Progress) -> HistoryReport:
        from connector.demo import build_world

        base = options["database_name"]
        names = [base] if options["sequential"] else [f"{base}_{size}" for size in sizes]
        with ThrowawayDatabases(names, f"{base}_journal", keep=options["keep"], say=say) as databases:
            account_keys = set()
            for name, wrapper in databases.wrappers.items():
                connections["default"] = wrapper
                say(f"database {name}: building the demo world through the services")
                account_keys.add(build_world("").accounts[0].account_key)
            (account_key,) = account_keys
            if options["sequential"]:
                report = measure_history(account_key=account_key, sizes=sizes, iterations=options["iterations"],
                                         warmup=options["warmup"], progress=say)
                report.mode = "sequential"
            else:
                report = measure_history_interleaved(
                    account_key=account_key, iterations=options["iterations"], warmup=options["warmup"],
                    block=options["block"], progress=say,
                    databases={size: databases.wrappers[f"{base}_{size}"] for size in sizes})
                report.mode = f"interleaved, blocks of {options['block']}"
        return report

    def _print(self, command: BaseCommand, options: dict, report: HistoryReport) -> None:
        if options["json"]:
            command.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            command.stdout.write(f"bench history: account {report.account_key}, PostgreSQL {report.postgres}, "
                                 f"{report.cpus} CPUs, {report.iterations} timed operations per size "
                                 f"({report.mode})")
            for r in report.results:
                command.stdout.write(f"  size {r.size:,}: generated {r.generated_rows:,} rows in "
                                     f"{r.generation_seconds:,.1f} s ({r.rows_per_second:,.0f} rows/s incl. ANALYZE)")
            command.stdout.write(format_table(report))
        if options["check"]:
            limit = history_ratio_limit(default=1 + CHECK_TOLERANCE)
            ratio = report.admission_ratio()
            if ratio > limit:
                raise CommandError(f"admission p50 grew {ratio:.2f}x from {report.results[0].retained['receipts']:,} "
                                   f"to {report.results[-1].retained['receipts']:,} retained receipts "
                                   f"(limit {limit:.2f}x)")
            command.stdout.write(command.style.SUCCESS(f"check passed: admission p50 ratio {ratio:.2f}"))
