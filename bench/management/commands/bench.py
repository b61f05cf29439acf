"""`manage.py bench <subcommand>`: measurements of the connector's hot paths on a throwaway database.

Subcommands (each is one `Subcommand` in SUBCOMMANDS; add a new one by writing its `add_arguments` and
`handle` and registering it):

  history   admission latency (receipt_admit + receipt_materialize of a 1-event body) and claim latency
            (lane_advance + execution_claim) for one account as its retained history grows from 10 to
            1,000,000 receipts/events (CV2-14-010, CV2-14-011: the hot path must not depend on retained history).

`history` creates its own throwaway databases on the PostgreSQL server of DATABASE_URL (`--database-name`, default
`connector_bench`: `connector_bench_<size>` per size and `connector_bench_journal`), migrates them, builds the
demo world in each through the services, generates the retained history with bulk `INSERT ... SELECT
generate_series` statements, `ANALYZE`s, then times sequential operations with fresh keys, in blocks that
alternate between the sizes so that load from other processes on a shared machine affects every size alike.
`--sequential` instead grows one database through the sizes and times each size in turn. The databases are
dropped afterwards unless `--keep`. See docs/benchmarks.md.
"""
from __future__ import annotations

import abc

import gc
import json
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections

from bench.options import integer_list
from connector.demo import DEMO_CHANNEL, HISTORY_BODY_SQL, demo_event_body

CHANNEL = DEMO_CHANNEL
HISTORY_PARTITIONS = 1000  # history records: each retained event updates one of this many CRM records (lanes)
HISTORY_BATCH = 50_000
HISTORY_KEY_PREFIX = "hist-"
CHECK_TOLERANCE = 0.20

Progress = Callable[[str], None]


# -- statistics -----------------------------------------------------------------------------------------------

@dataclass
class Stats:
    n: int
    mean: float
    p50: float
    p95: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> Stats:
        ordered = sorted(samples_ms)
        if len(ordered) == 1:
            only = ordered[0]
            return cls(1, only, only, only, only, only, only)
        cuts = statistics.quantiles(ordered, n=100, method="inclusive")
        return cls(len(ordered), statistics.fmean(ordered), cuts[49], cuts[94], cuts[98], ordered[0], ordered[-1])


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


# -- retained history, in bulk SQL --------------------------------------------------------------------------------

def _reserve_ids(cursor, table: str, count: int) -> int:
    """Reserve `count` consecutive ids of `table`'s identity sequence; returns the first."""
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
    sequence = cursor.fetchone()[0]
    cursor.execute("SELECT nextval(%s)", [sequence])
    first = cursor.fetchone()[0]
    if count > 1:
        cursor.execute("SELECT setval(%s, %s)", [sequence, first + count - 1])
    return first


# One statement per table; %(lo)s..%(hi)s is the batch of global history indexes g, and each table's ids are
# base + (g - lo) in a reserved range, so children reference parents without a lookup. Every row satisfies the
# table's constraints (unique keys, check constraints) and the immutable/append-only triggers (BEFORE UPDATE
# only: inserts are allowed). Bodies look like a real 1-event webhook delivery.
HISTORY_SQL = [
    # lanes of the partitions this batch touches (upsert: the high-water only grows, the fence advances)
    """
    INSERT INTO connector_orderinglane (epoch_id, account_id, route, route_version, partition, contract,
        baseline, baseline_origin, high_water, high_water_tie, active_execution_id, state, halt_reason, gap_since,
        fence, changed_at)
    SELECT %(epoch)s, %(account)s, %(route)s, 1, 'hist-r' || (g %% %(parts)s), 'latest_source_position', NULL,
        'empty_new_partition', max(g / %(parts)s + 1), NULL, NULL, 'open', '', NULL, 1, now()
    FROM generate_series(%(lo)s, %(hi)s) g GROUP BY g %% %(parts)s
    ON CONFLICT (epoch_id, account_id, route, route_version, partition) DO UPDATE
        SET high_water = GREATEST(connector_orderinglane.high_water, EXCLUDED.high_water),
            fence = connector_orderinglane.fence + 1, changed_at = now()
    """,
    "DROP TABLE IF EXISTS bench_batch",
    """
    CREATE TEMP TABLE bench_batch ON COMMIT DROP AS
    SELECT g, g - %(lo)s AS o, 'hist-r' || (g %% %(parts)s) AS rkey, (g / %(parts)s + 1) AS pos,
        convert_to(__HISTORY_BODY_SQL__, 'UTF8') AS body,
        now() - interval '400 days' + g * interval '10 seconds' AS at
    FROM generate_series(%(lo)s, %(hi)s) g
    """,
    """
    INSERT INTO connector_receipt (id, account_id, epoch_id, epoch_digest, gate_fence, kind, channel, payload,
        payload_digest, component_count, replay_request_id, created_at)
    SELECT %(receipt)s + o, %(account)s, %(epoch)s, %(epoch_digest)s, %(fence)s, 'transport', %(route)s, body,
        sha256(body), 1, NULL, at
    FROM bench_batch
    """,
    """
    INSERT INTO connector_receiptadmissionkey (id, account_id, channel, transport_key, receipt_id, tombstone_id)
    SELECT %(key)s + o, %(account)s, %(route)s, %(key_prefix)s || g, %(receipt)s + o, NULL FROM bench_batch
    """,
    """
    INSERT INTO connector_event (id, account_id, epoch_id, receipt_id, route, event_kind, source_locator,
        occurred_at, source_event_key, payload, payload_digest, ordering_contract, contract_digest, partition,
        position_kind, position, position_bytes, tie_breaker, grouping_key, replay_request_id, predecessor_id,
        created_at)
    SELECT %(event)s + o, %(account)s, %(epoch)s, %(receipt)s + o, %(route)s, 'record.updated', rkey,
        '2025-01-01T00:00:00Z', 'hist-ev-' || g, p.payload, sha256(p.payload), 'latest_source_position',
        sha256(convert_to('bench-contract', 'UTF8')), rkey, 'integer', pos, convert_to(pos::text, 'UTF8'),
        convert_to('hist-ev-' || g, 'UTF8'), '', NULL, NULL, at
    FROM bench_batch, LATERAL (SELECT convert_to('{"email":"r' || (g %% %(parts)s) || '@example.com","name":"Record '
        || (g %% %(parts)s) || ' v' || pos || '"}', 'UTF8') AS payload) p
    """,
    """
    INSERT INTO connector_receiptcomponent (id, receipt_id, ordinal, payload, payload_digest, disposition,
        event_id, reason_code)
    SELECT %(component)s + o, %(receipt)s + o, 0, body, sha256(body), 'event', %(event)s + o, '' FROM bench_batch
    """,
    """
    INSERT INTO connector_projection (id, account_id, epoch_id, route, route_version, identity_digest, event_id,
        window_id, lane_id, position, tie_breaker, input, input_digest, suppress_external_effects,
        execution_generation, lane_status, created_at)
    SELECT %(projection)s + o, %(account)s, %(epoch)s, %(route)s, 1,
        sha256(convert_to('bench-projection:' || %(account)s || ':' || g, 'UTF8')), %(event)s + o, NULL, l.id, pos,
        convert_to('hist-ev-' || g, 'UTF8'), body, sha256(body), false, 1, 'minted', at
    FROM bench_batch JOIN connector_orderinglane l ON l.epoch_id = %(epoch)s AND l.account_id = %(account)s
        AND l.route = %(route)s AND l.route_version = 1 AND l.partition = rkey
    """,
    """
    INSERT INTO connector_execution (id, projection_id, generation, account_id, epoch_id, lane_id, state,
        command_id, execution_ref, execution_ref_digest, lease_holder, lease_expires_at, lease_fence,
        attempt_count, result_outcome, result_digest, runtime_receipt, quarantine_reason, created_at, changed_at)
    SELECT %(execution)s + o, %(projection)s + o, 1, %(account)s, %(epoch)s, p.lane_id, 'completed',
        'cmd-hist-' || %(account)s || '-' || g, convert_to('ref:' || g, 'UTF8'),
        sha256(convert_to('ref:' || g, 'UTF8')), '', NULL, 1, 1, 'applied',
        sha256(convert_to('result:' || g, 'UTF8')), convert_to('receipt:' || g, 'UTF8'), '', at, at
    FROM bench_batch JOIN connector_projection p ON p.id = %(projection)s + o
    """,
    """
    INSERT INTO connector_executionattempt (id, execution_id, ordinal, holder, lease_fence, claimed_at,
        lease_expires_at)
    SELECT %(attempt)s + o, %(execution)s + o, 1, 'bench-history', 1, at, at + interval '60 seconds'
    FROM bench_batch
    """,
    """
    INSERT INTO connector_applicationresult (id, command_id, execution_ref_digest, outcome, result_digest, receipt,
        detail, committed_at)
    SELECT %(result)s + o, 'cmd-hist-' || %(account)s || '-' || g, sha256(convert_to('ref:' || g, 'UTF8')),
        'applied', sha256(convert_to('result:' || g, 'UTF8')), convert_to('receipt:' || g, 'UTF8'), 'applied', at
    FROM bench_batch
    """,
    """
    INSERT INTO connector_crmrecord (account_id, record_key, fields, version, last_command_id, updated_at)
    SELECT %(account)s, rkey, '{}'::jsonb, count(*), 'cmd-hist-' || %(account)s || '-' || max(g), now()
    FROM bench_batch GROUP BY rkey
    ON CONFLICT (account_id, record_key) DO UPDATE
        SET version = connector_crmrecord.version + EXCLUDED.version, last_command_id = EXCLUDED.last_command_id
    """,
]
HISTORY_SQL = [statement.replace("__HISTORY_BODY_SQL__", HISTORY_BODY_SQL) for statement in HISTORY_SQL]
TABLES_PER_HISTORY_ROW = 8  # receipt, key, event, component, projection, execution, attempt, result


def history_count(account_id: int) -> int:
    """Retained history rows of the account (admission keys with the history prefix)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM connector_receiptadmissionkey WHERE account_id = %s "
                       "AND transport_key LIKE %s", [account_id, HISTORY_KEY_PREFIX + "%"])
        return cursor.fetchone()[0]


def generate_history(*, account, epoch, start: int, count: int, progress: Progress | None = None,
                     batch: int = HISTORY_BATCH) -> int:
    """Insert `count` retained receipts (indexes start..start+count-1) with their admission keys, components,
    events, projections, completed executions, attempts and application results, in batches of bulk SQL.
    Returns the number of rows inserted (all tables)."""
    from django.db import transaction

    if not connection.in_atomic_block:
        # A fresh session: PostgreSQL caches the plans of its foreign-key checks per session, and plans made
        # while the tables were tiny (sequential scans) would make each check of a large batch scan the table.
        connection.close()
    gate = account.serving_gate
    rows = 0
    began = time.monotonic()
    done = 0
    while done < count:
        n = min(batch, count - done)
        lo = start + done
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
            params = {"lo": lo, "hi": lo + n - 1, "parts": HISTORY_PARTITIONS, "account": account.pk,
                      "epoch": epoch.pk, "epoch_digest": bytes(epoch.digest), "fence": gate.fence, "route": CHANNEL,
                      "key_prefix": HISTORY_KEY_PREFIX}
            for name, table in (("receipt", "connector_receipt"), ("key", "connector_receiptadmissionkey"),
                                ("event", "connector_event"), ("component", "connector_receiptcomponent"),
                                ("projection", "connector_projection"), ("execution", "connector_execution"),
                                ("attempt", "connector_executionattempt"),
                                ("result", "connector_applicationresult")):
                params[name] = _reserve_ids(cursor, table, n)
            for statement in HISTORY_SQL:
                cursor.execute(statement, params)
        done += n
        rows += n * TABLES_PER_HISTORY_ROW
        if progress is not None:
            elapsed = time.monotonic() - began
            progress(f"  history {done:,}/{count:,} receipts ({rows:,} rows, "
                     f"{rows / elapsed if elapsed else 0:,.0f} rows/s, {elapsed:,.1f} s)")
    return rows


def analyze() -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def retained_counts(account_id: int) -> dict[str, int]:
    counts = {}
    with connection.cursor() as cursor:
        for name, table in (("receipts", "connector_receipt"), ("admission_keys", "connector_receiptadmissionkey"),
                            ("events", "connector_event"), ("projections", "connector_projection"),
                            ("executions", "connector_execution")):
            cursor.execute(f"SELECT count(*) FROM {table} WHERE account_id = %s", [account_id])
            counts[name] = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM connector_applicationresult")
        counts["application_results"] = cursor.fetchone()[0]
    return counts


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


# -- the throwaway database ---------------------------------------------------------------------------------------

NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


class ThrowawayDatabases:
    """Create the databases `names` (each migrated for `default`) and `journal` (migrated for `journal`) on the
    server of DATABASES['default']; `wrappers[name]` is a `default` connection to each, installed with
    `connections["default"] = wrapper`. The first is installed on entry. On exit the original connections and
    settings come back and the databases are dropped (unless keep). The secret backend points at a temporary
    directory meanwhile."""

    def __init__(self, names: Sequence[str], journal: str, *, keep: bool, say: Progress) -> None:
        configured = {connections[a].settings_dict["NAME"] for a in ("default", "journal")}
        for name in (*names, journal):
            if not NAME_RE.match(name):
                raise CommandError(f"database name {name!r} must match {NAME_RE.pattern}")
            if name in configured:
                raise CommandError(f"refusing to use the configured database {name!r} as a throwaway")
        self.names, self.journal = list(names), journal
        self.keep, self.say = keep, say
        self.wrappers: dict[str, object] = {}
        self.original = None
        self.saved_journal = ""
        self.saved_connector = None

    def _admin(self):
        import psycopg

        s = connections["default"].settings_dict
        return psycopg.connect(host=s.get("HOST") or None, port=s.get("PORT") or None, user=s.get("USER") or None,
                               password=s.get("PASSWORD") or None, dbname="postgres", autocommit=True)

    def _drop(self, admin) -> None:
        from psycopg import sql

        for name in (*self.names, self.journal):
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def __enter__(self) -> ThrowawayDatabases:
        import copy

        from psycopg import sql

        connections.close_all()
        with self._admin() as admin:
            self._drop(admin)
            for name in (*self.names, self.journal):
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.saved_connector = settings.CONNECTOR
        settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": tempfile.mkdtemp(prefix="bench-secrets-")}
        journal = connections["journal"]
        self.saved_journal = journal.settings_dict["NAME"]
        journal.settings_dict["NAME"] = self.journal
        began = time.monotonic()
        self.say(f"database {self.journal}: migrating (the journal's few tables) ...")
        call_command("migrate", database="journal", interactive=False, verbosity=0)
        self.say(f"database {self.journal}: migrated in {time.monotonic() - began:.0f} s")
        self.original = connections["default"]
        for name in self.names:
            settings_dict = copy.deepcopy(self.original.settings_dict)
            settings_dict["NAME"] = name
            wrapper = self.original.__class__(settings_dict, alias="default")
            self.wrappers[name] = wrapper
            connections["default"] = wrapper
            began = time.monotonic()
            self.say(f"database {name}: migrating (every app, about a minute) ...")
            call_command("migrate", database="default", interactive=False, verbosity=0)
            self.say(f"database {name}: migrated in {time.monotonic() - began:.0f} s")
        connections["default"] = self.wrappers[self.names[0]]
        return self

    def __exit__(self, *exc) -> None:
        for wrapper in self.wrappers.values():
            wrapper.close()
        if self.original is not None:
            connections["default"] = self.original
        connections.close_all()
        if self.saved_journal:
            connections["journal"].settings_dict["NAME"] = self.saved_journal
        if self.saved_connector is not None:
            shutil.rmtree(settings.CONNECTOR["SECRET_BACKEND_DIR"], ignore_errors=True)
            settings.CONNECTOR = self.saved_connector
        if self.keep:
            self.say(f"kept databases {', '.join((*self.names, self.journal))}")
            return
        with self._admin() as admin:
            self._drop(admin)


# -- subcommands --------------------------------------------------------------------------------------------------




class Subcommand(abc.ABC):
    name = ""
    help = ""

    @abc.abstractmethod
    def add_arguments(self, parser) -> None:
        """Declare the subcommand's options."""

    @abc.abstractmethod
    def handle(self, command: Command, options: dict) -> None:
        """Run the subcommand."""


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

    def handle(self, command: Command, options: dict) -> None:
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

    def _print(self, command: Command, options: dict, report: HistoryReport) -> None:
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
            from bench import history_ratio_limit  # bench/budgets.json "history", else the default

            limit = history_ratio_limit(default=1 + CHECK_TOLERANCE)
            ratio = report.admission_ratio()
            if ratio > limit:
                raise CommandError(f"admission p50 grew {ratio:.2f}x from {report.results[0].retained['receipts']:,} "
                                   f"to {report.results[-1].retained['receipts']:,} retained receipts "
                                   f"(limit {limit:.2f}x)")
            command.stdout.write(command.style.SUCCESS(f"check passed: admission p50 ratio {ratio:.2f}"))


SUBCOMMANDS: dict[str, Subcommand] = {s.name: s for s in (History(),)}

from bench.hot_account import HotAccount  # noqa: E402 - hot-account capacity bench (its own module)

SUBCOMMANDS[HotAccount.name] = HotAccount()

from bench.activation import Activation  # noqa: E402 - whole-service activation bench (its own module)

SUBCOMMANDS[Activation.name] = Activation()

from bench.burst import Burst  # noqa: E402 - burst against make run's processes (its own module)

SUBCOMMANDS[Burst.name] = Burst()

from bench.accounts import Accounts  # noqa: E402 - account flatness (issue 18, goal 7; its own module)

SUBCOMMANDS[Accounts.name] = Accounts()

from bench.claims import Claims  # noqa: E402 - batched fair claims against procrastinate (its own module)

SUBCOMMANDS[Claims.name] = Claims()

from bench.overhead import Overhead  # noqa: E402 - metrics and tracing overhead (issue 21; its own module)

SUBCOMMANDS[Overhead.name] = Overhead()

from bench.metrics_plans import MetricsPlans  # noqa: E402 - metrics queries over 1M retained rows (issue 21)

SUBCOMMANDS[MetricsPlans.name] = MetricsPlans()


def run_as_administrator(command: Command) -> None:
    """The benches create, migrate and drop throwaway databases, which the application role may not. When
    `.data/services.env` names the administrator (DATABASE_ADMIN_URL) and this process connects as someone else,
    start the same command again as the administrator, the way `make bench` runs it (children inherit it)."""
    admin = os.environ.get("DATABASE_ADMIN_URL")
    if not getattr(command, "_called_from_command_line", False) or not admin \
            or os.environ.get("DATABASE_URL") == admin:
        return
    command.progress("bench: throwaway databases need the administrator; running as DATABASE_ADMIN_URL "
                     f"({admin.split('@')[-1]})")
    env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_DATABASE_URL", "DATABASE_ASSUME_ROLE")}
    env["DATABASE_URL"] = admin
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


class Command(BaseCommand):
    help = "Performance measurements on a throwaway database. Subcommands: " + ", ".join(SUBCOMMANDS)

    def add_arguments(self, parser):
        subparsers = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")
        for sub in SUBCOMMANDS.values():
            sub.add_arguments(subparsers.add_parser(sub.name, help=sub.help, description=sub.help))

    def progress(self, message: str) -> None:
        """Progress goes to stderr, so `--json` output on stdout stays machine-readable."""
        self.stderr.write(message)
        self.stderr.flush()

    def handle(self, *args, subcommand: str, **options):
        run_as_administrator(self)
        SUBCOMMANDS[subcommand].handle(self, options)
        sys.stdout.flush()

from bench.outbound_rate import OutboundRate  # noqa: E402 - per-destination rate limits (issue 20)

SUBCOMMANDS[OutboundRate.name] = OutboundRate()

from bench.outbound import Outbound  # noqa: E402 - outbound against an at-least-once baseline (issue 20)

SUBCOMMANDS[Outbound.name] = Outbound()

from bench.halt_drain import HaltDrain  # noqa: E402 - last settlement -> confirm_halted (issue 20, goal 5)

SUBCOMMANDS[HaltDrain.name] = HaltDrain()

from bench.admission_profile import AdmissionProfile  # noqa: E402 - the web's own cost per delivery (issue 40)

SUBCOMMANDS[AdmissionProfile.name] = AdmissionProfile()
