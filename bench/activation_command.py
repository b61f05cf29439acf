"""The `bench activation` subcommand: its options, the run over scenarios and cardinalities (one throwaway
database each), the table, --json, --chart, --from-json and --check (ceilings and goals: bench/activation_goals.py).
Moved out of bench/activation.py, which may not grow (tests/test_layout.py)."""
from __future__ import annotations

import json
from pathlib import Path

from django.db import DatabaseError

from bench import activation
from bench.activation import (DEFAULT_ACCOUNTS, DEFAULT_DATABASE, SCENARIO_CHOICES, SCENARIO_SETS, ActivationReport,
                              format_table)
from bench.activation_kill import KILL_POINTS
from bench.activation_world import ActivationBenchError, Progress
from bench.activation_chart import draw
from bench.activation_coord import DEFAULT_PARTITIONS, HANDOFF_PATHS
from bench.activation_goals import (
    BUDGET_SECTION,
    DURATION_HEADROOM,
    GOALS_KEY,
    SMALL_DURATION_FLOOR_MS,
    WAL_HEADROOM,
    check_budgets,
    check_goals,
    format_goals,
    goal_failures,
    load_budgets,
    load_goals,
    suggest_budgets,
)
from bench.activation_scenarios import SCENARIOS
from bench.options import integer_list
from bench.subcommand import Subcommand


def add_arguments(parser) -> None:
    from django.conf import settings

    parser.add_argument("--accounts", default=DEFAULT_ACCOUNTS,
                        help=f"account cardinalities, comma-separated (default {DEFAULT_ACCOUNTS})")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON to FILE ('-': stdout)")
    parser.add_argument("--check", action="store_true",
                        help="exit non-zero naming every figure above its ceiling in the budgets' "
                             f"{BUDGET_SECTION!r} section and every broken goal of its {GOALS_KEY!r} block (a goal "
                             "whose N was not measured is reported as not checked)")
    parser.add_argument("--budgets", metavar="PATH", default=str(Path(settings.BASE_DIR) / "bench" / "budgets.json"),
                        help="budget file (default bench/budgets.json)")
    parser.add_argument("--kill-at", choices=KILL_POINTS, default="before_commit",
                        help="where the killed attempt is paused and SIGKILLed (default before_commit: after the "
                             "last write: the product's crash point activation.before_commit for cutover, "
                             "succession.before_commit for successor)")
    parser.add_argument("--scenario", choices=SCENARIO_CHOICES, default="first",
                        help="first: the first activation (epoch_activate_first); cutover: the V1 -> V2 "
                             "coordinator's first_activation_commit (barrier set held, CutoverDecision rollback_open, "
                             "dual approval); successor: the V2 -> V2 successor activation (successor_activate) with "
                             "--partitions lanes per account handed off; both: cutover and successor; all: every "
                             "scenario; each N of each scenario in its own throwaway database (default first)")
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS,
                        help=f"successor: ordering lanes per account on the predecessor, each handed off before the "
                             f"activation (default {DEFAULT_PARTITIONS}; 0: no lanes)")
    parser.add_argument("--handoffs", choices=HANDOFF_PATHS, default="bulk",
                        help="successor: write the handoffs in bulk exactly as ordering_handoff does (default), or "
                             "run succession_phases.handoff_all (one transaction per lane, each share-locking every "
                             "gate today)")
    parser.add_argument("--chart", metavar="FILE.svg", help="draw transaction, raw shape, owner reread and recovery "
                        "against N for each scenario (matplotlib, from the report's JSON)")
    parser.add_argument("--from-json", metavar="REPORT.json", help="measure nothing: read a report written by --json "
                        "(to redraw --chart, or to --check it)")
    parser.add_argument("--readback-repeat", type=int, default=10,
                        help="readbacks of the activated gate set, for p50/p95/p99 (default 10)")
    parser.add_argument("--database-name", default=DEFAULT_DATABASE,
                        help="prefix of the throwaway databases: <name>_<accounts> and <name>_<accounts>_journal, "
                             f"created and dropped per cardinality (default {DEFAULT_DATABASE})")
    parser.add_argument("--keep", action="store_true", help="keep the throwaway databases")
    parser.add_argument("--suggest-budgets", action="store_true",
                        help=f"print ceilings from this run ({DURATION_HEADROOM:g}x durations, at least "
                             f"{SMALL_DURATION_FLOOR_MS} ms for COMMIT, readback and lock release; {WAL_HEADROOM:g}x "
                             "WAL bytes; row locks exactly what the transaction locks)")


def command_line(options: dict) -> str:
    words = ["manage.py bench activation", f"--accounts {options['accounts']}", f"--kill-at {options['kill_at']}",
             f"--readback-repeat {options['readback_repeat']}"]
    if options.get("scenario", "first") != "first":
        words.append(f"--scenario {options['scenario']}")
    if options.get("scenario") in ("successor", "both", "all"):
        words.append(f"--partitions {options.get('partitions', DEFAULT_PARTITIONS)} "
                     f"--handoffs {options.get('handoffs') or 'bulk'}")
    if options["database_name"] != DEFAULT_DATABASE:
        words.append(f"--database-name {options['database_name']}")
    if options.get("check"):
        words.append(f"--check --budgets {options['budgets']}")
    return " ".join(words)


def run(options: dict, say: Progress) -> ActivationReport:
    """One throwaway database per cardinality (ThrowawayDatabases of bench history), measured in turn."""
    from django.core.management.base import CommandError

    from connector.errors import ConnectorError
    from bench.databases import NAME_RE, ThrowawayDatabases

    counts = integer_list(options["accounts"], "--accounts", low=1,
                          needs="--accounts needs at least one cardinality, each at least 1")
    base = options["database_name"]
    for n in counts:
        for name in (f"{base}_{n}", f"{base}_{n}_journal"):
            if not NAME_RE.match(name):
                raise CommandError(f"--database-name {base!r} makes {name!r}, which must match {NAME_RE.pattern}")
    report = ActivationReport(command=command_line(options), kill_at=options["kill_at"],
                              readback_repeat=options["readback_repeat"], machine=activation.machine(),
                              commit=activation.product_commit())
    chosen = options.get("scenario") or "first"
    scenarios = SCENARIO_SETS.get(chosen, (chosen,))
    for scenario in scenarios:
        for n in counts:
            with ThrowawayDatabases([f"{base}_{n}"], f"{base}_{n}_journal", keep=options["keep"], say=say):
                if not report.postgres:
                    report.postgres, report.settings = activation.server_facts()
                try:
                    # looked up at call time, so a replaced module function is the one run
                    measure = activation.measure_activation if scenario == "first" else SCENARIOS[scenario]
                    extra = {} if scenario != "successor" else {
                        "partitions": options.get("partitions", DEFAULT_PARTITIONS),
                        "handoffs": options.get("handoffs") or "bulk"}
                    report.results.append(measure(
                        n, kill_at=options["kill_at"], readback_repeat=options["readback_repeat"], progress=say,
                        **extra))
                except (ActivationBenchError, ConnectorError, DatabaseError) as exc:
                    # a cardinality the product (or the bench) cannot handle is a finding: keep the others
                    label = "" if scenario == "first" else f" ({scenario})"
                    say(f"{n:,} accounts{label}: NOT MEASURED: {type(exc).__name__}: {exc}")
                    failure = {"accounts": n, "error": f"{type(exc).__name__}: {exc}"}
                    report.failures.append(failure if scenario == "first" else {**failure, "scenario": scenario})
            write_json(report, options.get("json"))  # after each cardinality: a long run keeps what it measured
    return report


def write_json(report: ActivationReport, target: str | None) -> None:
    if target and target != "-":
        Path(target).write_text(json.dumps(report.as_dict(), indent=2) + "\n")


def handle(command, options: dict) -> None:
    """`manage.py bench activation`: measure (or read --from-json), print the table (stdout), write --json, draw
    --chart, then --check the ceilings and the goals."""
    import logging

    from django.conf import settings
    from django.core.management.base import CommandError

    if options["readback_repeat"] < 1:
        raise CommandError("--readback-repeat must be at least 1")
    if options.get("partitions", 0) < 0:
        raise CommandError("--partitions must be at least 0")
    if options.get("from_json"):
        return _handle_stored(command, options)
    budgets = None
    if options["check"]:
        try:
            budgets = load_budgets(Path(options["budgets"]))
        except ActivationBenchError as exc:
            raise CommandError(str(exc)) from exc
    connector_log = logging.getLogger("connector")
    saved_level, saved_debug = connector_log.level, settings.DEBUG
    if options["verbosity"] < 2:
        connector_log.setLevel(logging.WARNING)
    settings.DEBUG = False  # no per-query debug cursor: it would time Django's query log, not the transaction
    try:
        report = run(options, command.progress)
    except ActivationBenchError as exc:
        raise CommandError(str(exc)) from exc
    finally:
        connector_log.setLevel(saved_level)
        settings.DEBUG = saved_debug
    command.stdout.write(f"bench activation at {report.commit}: {report.machine}; PostgreSQL {report.postgres} "
                         f"({', '.join(f'{k}={v}' for k, v in report.settings.items())})")
    for r in report.results:
        rate = r.setup_rows / r.setup_seconds["total"] if r.setup_seconds.get("total") else 0
        command.stdout.write(f"  {r.scenario} {r.accounts:,} accounts: setup {r.setup_seconds.get('total', 0):,.1f} s "
                             f"({', '.join(f'{k} {v:,.1f}' for k, v in r.setup_seconds.items() if k != 'total')}); "
                             f"{r.setup_rows:,} bulk rows, {rate:,.0f} rows/s overall; load {r.load_average}")
    command.stdout.write(format_table(report))
    if options["suggest_budgets"]:
        command.stdout.write(json.dumps({BUDGET_SECTION: suggest_budgets(report)}, indent=2))
    broken = []
    if budgets is not None:
        broken = [f"ceiling: {b}" for b in check_budgets(report, budgets)]
        broken += _judge_goals(command, options, report.as_dict(), report)
    if options["json"] == "-":
        command.stdout.write(json.dumps(report.as_dict(), indent=2))
    else:
        write_json(report, options["json"])
    if options.get("chart"):
        command.stdout.write(f"chart: {draw(report.as_dict(), Path(options['chart']))}")
    _conclude(command, options, broken, report.failures)


def _judge_goals(command, options: dict, data: dict, report=None) -> list[str]:
    """The goals of the budgets' goals block judged on `data` (printed, and kept in the report's JSON)."""
    try:
        goals = load_goals(Path(options["budgets"]))
    except ActivationBenchError as exc:
        return [f"goals: {exc}"]
    judgements = check_goals(data, goals)
    if report is not None:
        report.goals = judgements
    command.stdout.write(format_goals(judgements))
    return [f"goal: {b}" for b in goal_failures(judgements)]


class _Stored:
    """One result of a JSON report, as check_budgets reads it."""

    def __init__(self, data: dict) -> None:
        self.accounts, self.scenario = data["accounts"], data.get("scenario", "first")
        self.rows, self._figures = data.get("rows") or {}, data.get("figures") or {}

    def figures(self) -> dict:
        return self._figures


def _handle_stored(command, options: dict) -> None:
    """--from-json: redraw --chart and/or --check a stored report (nothing is measured)."""
    from types import SimpleNamespace

    from django.core.management.base import CommandError

    try:
        data = json.loads(Path(options["from_json"]).read_text())
    except (OSError, ValueError) as exc:
        raise CommandError(f"--from-json {options['from_json']}: {exc}") from exc
    if options.get("chart"):
        command.stdout.write(f"chart: {draw(data, Path(options['chart']))}")
    broken = []
    if options["check"]:
        try:
            budgets = load_budgets(Path(options["budgets"]))
        except ActivationBenchError as exc:
            raise CommandError(str(exc)) from exc
        stored = SimpleNamespace(failures=data.get("failures", []), results=[
            _Stored(r) for results in (data.get("scenarios") or {}).values() for r in results])
        broken = [f"ceiling: {b}" for b in check_budgets(stored, budgets)]
        broken += _judge_goals(command, options, data)
    _conclude(command, options, broken, [])


def _conclude(command, options: dict, broken: list[str], failures: list[dict]) -> None:
    from django.core.management.base import CommandError

    if broken:
        raise CommandError(f"activation budget broken ({options['budgets']}):\n  " + "\n  ".join(broken))
    if options["check"]:
        command.stdout.write(command.style.SUCCESS(f"check passed: every activation figure within its ceiling and "
                                                   f"every checked goal met ({options['budgets']})"))
    if failures:
        raise CommandError("not measured: " + "; ".join(f"{f['accounts']:,} accounts: {f['error']}"
                                                       for f in failures))


class Activation(Subcommand):
    """`bench activation`: registered in bench/management/commands/bench.py's SUBCOMMANDS."""

    name = "activation"
    help = ("Whole-service activation at N accounts (first: epoch_activate_first; cutover: the V1 -> V2 coordinator's "
            "first_activation_commit through the barrier set and the CutoverDecision; successor: successor_activate "
            "with K lanes per account handed off), in a throwaway database per N: owner reread, locked transaction, "
            "COMMIT, readback, WAL, locks held, recovery after a kill mid-transaction, and the raw set-based shape "
            "of the same rows; --check against the 'activation' section of bench/budgets.json (ceilings and goals), "
            "--chart draws cost against N.")

    def add_arguments(self, parser) -> None:
        add_arguments(parser)

    def handle(self, command, options: dict) -> None:
        handle(command, options)
