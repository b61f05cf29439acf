"""`manage.py bench burst`: a burst of signed deliveries against the processes `make run` starts.

On a throwaway database (`--database-name`, default `connector_bench_burst` and `<name>_journal`) with the push demo
world, this starts `scripts/run.py` itself — the web server, the Celery worker children, beat and the demo
receiver, exactly as `make run` does — against a private Redis (scripts/services.py PrivateRedis on a spare port;
`--redis-url` to use another), waits until the web port answers and every worker child logged `ready.`, then
`--clients` threads post `--deliveries` signed one-event deliveries (each its own record, so each its own lane)
to the admission API as fast as the server answers. It records, on the machine's wall clock:

- the first and last 201, and every non-201 answer;
- the first ApplicationResult (its `committed_at`) after the first 201: the starvation figure, budget 2 s;
- the last materialization (the latest Event) and the last ApplicationResult;
- the last finalized effect (its RemoteEffect's `changed_at` in state `finalized`): the burst end to end, and
  events/s end to end = accepted deliveries / (last finalized effect - first 201) (issue 40, goal 1);
- every effect exactly once at the receiver: the demo CRM's `/_demo/state` holds each delivery's record once, at
  version 1 (`receiver`: applied_once, missing, applied_more_than_once, repeats);
- ApplicationResults that existed 2, 10, 30 and 160 s after the first 201;
- each delivery's own wait, from its receipt's commit to its ApplicationResult's commit (p50, p95, max);
- the busy CPU per finalized effect of each process role from the first POST to the last finalized effect: the
  web, each Celery stage, the sweeper, beat, the receiver, run.py, the clients and the PostgreSQL backends by the
  role of their client (bench/burst_cpu.py, D-358); `total` is the product's CPU per event (goal 2).

`--phases cold` (the default) is one burst on the database migrated seconds before, whose tables autovacuum has
never analyzed; `--phases cold,analyzed` then runs ANALYZE and a second burst of as many new deliveries against the
same processes, and reports `first_minute_ratio` = cold / analyzed events/s end to end (goal 3). Each phase's
figures are under `phases`; the top level repeats the first phase's.

Then it stops run.py with SIGINT (the way Ctrl-C stops make run) and drops the databases unless `--keep`.
`--check` exits non-zero below the goals of bench/budgets.json "burst" (issue 40: events/s end to end, product CPU
per event, first-minute ratio when both phases ran), when the first result came later than `--first-result-budget`
seconds, a delivery was not accepted, an effect was not finalized within `--timeout` or not exactly once at the
receiver. See docs/benchmarks.md.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

from bench.burst_cpu import per_event
from bench.burst_report import check_burst, format_report, receiver_check
from bench.burst_sweep import add_sweep_arguments

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATABASE = "connector_bench_burst"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _url(settings_dict: dict, name: str) -> str:
    user = quote(settings_dict.get("USER") or "postgres", safe="")
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{quote(password, safe='')}" if password else user
    return f"postgres://{auth}@{settings_dict.get('HOST') or '127.0.0.1'}:{settings_dict.get('PORT') or 5432}/{name}"


class PrivateBroker:
    """A private Redis on a spare loopback port (scripts/services.py), removed afterwards."""

    def __init__(self) -> None:
        from scripts import services

        self.services = services
        binary = services.find_redis_server()
        if binary is None:
            raise RuntimeError("no redis-server binary: pass --redis-url")
        self.port = services.free_loopback_port()
        self.server = services.PrivateRedis(self.port)
        self.server.start(binary, "127.0.0.1")
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        import shutil

        self.server.stop()
        home = self.server.home
        if home.is_symlink():
            target = home.resolve()
            home.unlink()
            shutil.rmtree(target, ignore_errors=True)
        else:
            shutil.rmtree(home, ignore_errors=True)


class RunPy:
    """scripts/run.py as a child process in its own session; its output goes to a log file and is scanned for
    each worker child's `ready.` line."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        from scripts.run import worker_children

        self.ready: set[str] = set()
        self.pids: dict[str, int] = {}  # child name -> pid, from run.py's "started <name> (pid <n>)" lines
        self.names: set[str] = {name for name, _ in worker_children()}  # the children run.py will start
        self.proc = subprocess.Popen([sys.executable, "scripts/run.py"], cwd=ROOT, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self) -> None:
        with self.log_path.open("wb") as log:
            for raw in iter(self.proc.stdout.readline, b""):
                log.write(raw)
                line = raw.decode(errors="replace")
                name, bar, text = line.partition("|")
                name = name.strip()
                if bar and name in self.names and "ready." in text:
                    self.ready.add(name)
                started = started_pid(line)
                if started is not None:
                    self.pids[started[0]] = started[1]

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)  # run.py stops its children like Ctrl-C does
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.pump.join(timeout=5)
        return self.proc.returncode


def started_pid(line: str) -> tuple[str, int] | None:
    """(child name, pid) from run.py's own `run | started <name> (pid <n>): ...` line, else None."""
    name, bar, text = line.partition("|")
    if not bar or name.strip() != "run" or not text.startswith(" started ") or " (pid " not in text:
        return None
    child, _, rest = text[len(" started "):].partition(" (pid ")
    pid = rest.split(")", 1)[0]
    return (child, int(pid)) if pid.isdigit() else None


def _body(n: int, tag: str) -> bytes:
    from connector.demo import demo_event_body  # the demo pack's delivery shape (L1 data lives in demo.py)

    return demo_event_body(f"burst-{tag}-{n}")


def _progress(first_201: float, timeout: float, expected: int, say, since: float = 0.0) -> dict:
    """Poll PostgreSQL until every delivery posted since `since` has its ApplicationResult (or the timeout); returns
    the figures, all from the rows' own commit times (so they do not depend on when the polling started)."""
    from django.db import connection
    from django.db.models import Max, Min

    from connector.models import ApplicationResult, Event

    results_since = ApplicationResult.objects.filter(committed_at__gte=_aware(since))
    deadline = time.time() + timeout
    last_say = 0.0
    count = 0
    while True:
        count = results_since.count()
        now = time.time()
        if count >= expected or now > deadline:
            break
        if now - last_say > 10:
            say(f"  {count}/{expected} ApplicationResults {now - first_201:.0f} s after the first 201")
            last_say = now
        time.sleep(0.2)
        connection.close_if_unusable_or_obsolete()
    results = results_since.aggregate(first=Min("committed_at"), last=Max("committed_at"))
    events = Event.objects.filter(created_at__gte=_aware(since)).aggregate(last=Max("created_at"))
    marks = {str(mark): results_since.filter(committed_at__lte=_aware(first_201 + mark)).count()
             for mark in (2, 10, 30, 160)}
    with connection.cursor() as cursor:
        # Each delivery's own wait: its receipt's commit to its ApplicationResult's commit.
        cursor.execute(
            "SELECT percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY s), max(s) FROM ("
            " SELECT extract(epoch FROM r.committed_at - rc.created_at) AS s FROM connector_applicationresult r"
            " JOIN connector_execution e ON e.command_id = r.command_id"
            " JOIN connector_projection p ON p.id = e.projection_id JOIN connector_event ev ON ev.id = p.event_id"
            " JOIN connector_receipt rc ON rc.id = ev.receipt_id WHERE rc.created_at >= %s) waits", [_aware(since)])
        quantiles, longest = cursor.fetchone()
    return {
        "delivery_wait_s": {"p50": float(quantiles[0]), "p95": float(quantiles[1]), "max": float(longest)}
        if quantiles and quantiles[0] is not None else None,
        "application_results": count,
        "first_result_s": results["first"].timestamp() - first_201 if results["first"] else None,
        "last_result_s": results["last"].timestamp() - first_201 if results["last"] else None,
        "last_materialization_s": events["last"].timestamp() - first_201 if events["last"] else None,
        "results_at_s": marks,
    }


def _finalized(first_201: float, timeout: float, expected: int, say, since: float) -> dict:
    """Poll PostgreSQL until every effect authored since `since` is `finalized` (or the timeout): the end of the
    burst end to end, the last finalized effect's commit (its `changed_at`, set by the finalizing transaction)."""
    from django.db import connection

    deadline = time.time() + timeout
    last_say = 0.0
    sql = ("SELECT count(*) FILTER (WHERE state = 'finalized'), max(changed_at) FILTER (WHERE state = 'finalized'),"
           " count(*) FROM effects_remoteeffect WHERE id > %s")
    floor = _effect_floor(since)
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, [floor])
            finalized, last, authored = cursor.fetchone()
        now = time.time()
        if finalized >= expected or now > deadline:
            break
        if now - last_say > 10:
            say(f"  {finalized}/{expected} effects finalized ({authored} authored) {now - first_201:.0f} s after "
                "the first 201")
            last_say = now
        time.sleep(0.2)
        connection.close_if_unusable_or_obsolete()
    last_s = last.timestamp() - first_201 if last else None
    return {"effects_finalized": finalized, "effects_authored": authored, "last_finalized_s": last_s,
            "end_to_end_events_per_s": round(expected / last_s, 2) if last_s and finalized >= expected else None}


_EFFECT_FLOORS: dict[float, int] = {}


def _effect_floor(since: float) -> int:
    """The highest RemoteEffect id before a phase began (its effects are the ones above it), read once per phase."""
    if since not in _EFFECT_FLOORS:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT coalesce(max(id), 0) FROM effects_remoteeffect")
            _EFFECT_FLOORS[since] = cursor.fetchone()[0]
    return _EFFECT_FLOORS[since]


def _aware(ts: float):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, tz=timezone.utc)


def run_burst(*, deliveries: int, clients: tuple[int, ...], timeout: float, redis_url: str | None,
              log_dir: Path, say, phases: tuple[str, ...] = ("cold",)) -> dict:
    """Run the burst against the current `default`/`journal` databases (which hold the push demo world), with
    run.py's processes bound to them. Returns the report dict. Several client counts are a sweep
    (bench/burst_sweep.py): each phase of `phases` runs once per count, in that order."""
    runs = [(phase, count) for phase in phases for count in clients]
    from django.conf import settings
    from django.db import connections

    from bench.hot_report import machine_facts
    from connector.demo import DEMO_CHANNEL
    from connector.models import ConnectorAccount, CredentialGeneration
    from connector.secrets import secret_backend

    account = ConnectorAccount.objects.order_by("pk").first().account_key
    generation = CredentialGeneration.objects.get(generation_id=f"{account}.webhook-signing.g1")
    secret = secret_backend().read(generation.secret_version_ref)
    broker = None if redis_url else PrivateBroker()
    port, receiver_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("CONNECTOR_FAULT_POINT", "TEST_DB_SUFFIX")}
    env.update({
        "DATABASE_URL": _url(connections["default"].settings_dict, connections["default"].settings_dict["NAME"]),
        "JOURNAL_DATABASE_URL": _url(connections["journal"].settings_dict,
                                     connections["journal"].settings_dict["NAME"]),
        "REDIS_URL": redis_url or broker.url, "PORT": str(port), "DEMO_RECEIVER_PORT": str(receiver_port),
        "DEMO_RECEIVER_JOURNAL": "",  # throwaway databases, a CRM in memory only (D-440)
        "CONNECTOR_EGRESS_BASE_URL": f"http://127.0.0.1:{receiver_port}",
        "CONNECTOR_SECRET_DIR": settings.CONNECTOR["SECRET_BACKEND_DIR"],
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE") or "config.django.local",
        "PYTHONUNBUFFERED": "1"})
    connections.close_all()
    report = {"bench": "burst", "deliveries": deliveries, "clients": clients[0] if len(clients) == 1 else list(clients),
              "machine": machine_facts(),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_average_before": list(os.getloadavg())}
    log_path = log_dir / f"burst-run-{int(time.time())}.log"
    say(f"starting scripts/run.py (web :{port}, workers, beat, demo receiver :{receiver_port}); log {log_path}")
    run = RunPy(env, log_path)
    cpu = None
    try:
        deadline = time.monotonic() + 120
        while True:
            if run.proc.poll() is not None:
                raise RuntimeError(f"scripts/run.py exited with {run.proc.returncode}; see {log_path}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                web = True
            except OSError:
                web = False
            if web and run.ready >= run.names:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"run.py not ready after 120 s (web {web}, workers ready {sorted(run.ready)} of "
                                   f"{sorted(run.names)}); see {log_path}")
            time.sleep(0.2)
        report["worker_children"] = sorted(run.names)
        say(f"ready: web and {', '.join(sorted(run.ready))}; phases {', '.join(phases)}")
        url = f"http://127.0.0.1:{port}/api/v2/accounts/{account}/channels/{DEMO_CHANNEL}/receipts"
        report["phases"] = []
        analyzed = False
        for phase, count in runs:
            if phase == "analyzed" and not analyzed:
                began = time.monotonic()
                with connections["default"].cursor() as cursor:
                    cursor.execute("ANALYZE")
                analyzed = True
                say(f"ANALYZE of the database in {time.monotonic() - began:.1f} s; the analyzed burst")
            cpu = _cpu_window(run)
            result = _phase(url=url, secret=secret, deliveries=deliveries, clients=count, timeout=timeout,
                            receiver_port=receiver_port, cpu=cpu, say=say)
            cpu = None
            result["phase"], result["clients"] = phase, count
            report["phases"].append(result)
        report.update({k: v for k, v in report["phases"][0].items() if k != "phase"})  # the first phase's figures
        by_phase = {p["phase"]: p for p in report["phases"]}
        if "cold" in by_phase and "analyzed" in by_phase:
            cold, warm = (by_phase[k].get("end_to_end_events_per_s") for k in ("cold", "analyzed"))
            report["first_minute_ratio"] = round(cold / warm, 3) if cold and warm else None
        report["remote_effects"] = _effects_summary()
    finally:
        report["run_py_exit"] = run.stop()
        report["load_average_after"] = list(os.getloadavg())
        if broker is not None:
            broker.close()
    return report


def _phase(*, url: str, secret: bytes, deliveries: int, clients: int, timeout: float, receiver_port: int, cpu,
           say) -> dict:
    """One burst: post every delivery, wait for every ApplicationResult and then for every effect's finalization,
    stop the CPU window at the last finalized effect (the end of the burst end to end), then ask the receiver
    whether each effect arrived exactly once."""
    from bench.burst_client import post_all  # the load generator lives outside the product packages

    tag = f"{int(time.time() * 1000):x}"
    since = time.time() - 1.0  # rows of this phase only (the clocks of this process and PostgreSQL's are one)
    _effect_floor(since)
    result: dict = {}
    try:
        say(f"posting {deliveries} deliveries from {clients} clients")
        posted = post_all(url=url, secret=secret, bodies=[_body(n, tag) for n in range(deliveries)], clients=clients,
                          key_prefix=f"burst-{tag}-")
        result["admission"] = {k: v for k, v in posted.items() if k not in ("began", "first_201", "last_201")}
        if posted["first_201"] is None:
            raise RuntimeError(f"no delivery was accepted: {posted['statuses']} {posted['transport_errors']}")
        result["admission"]["seconds_first_to_last_201"] = posted["last_201"] - posted["first_201"]
        say(f"admitted {posted['accepted']} in {posted['last_201'] - posted['first_201']:.1f} s; waiting for the "
            "ApplicationResults and the finalized effects")
        result.update(_progress(posted["first_201"], timeout, posted["accepted"], say, since))
        result.update(_finalized(posted["first_201"], timeout, posted["accepted"], say, since))
        result["cpu"] = cpu.stop() if cpu is not None else None
        events = result["effects_finalized"]
        result["cpu_per_event_ms"] = per_event(result["cpu"], events)
        result["load_average"] = list(os.getloadavg())
        result["receiver"] = receiver_check(receiver_port, [f"bench-r-burst-{tag}-{n}" for n in range(deliveries)])
        say(f"last effect finalized {result['last_finalized_s']} s after the first 201: "
            f"{result['end_to_end_events_per_s']} events/s end to end; receiver {result['receiver']}")
    finally:
        if cpu is not None and "cpu" not in result:
            cpu.stop()  # its connection would keep the throwaway database from being dropped
    return result


def _cpu_window(run: RunPy):
    """The per-role busy CPU sampler (bench/burst_cpu.py), begun now; None (and the report says so) if it cannot
    start, e.g. without /proc."""
    from django.db import connections

    from bench.burst_cpu import ROLE_NAMES, BurstCpu
    from bench.hot_pool import _conninfo

    roots = {ROLE_NAMES.get(name, name): pid for name, pid in run.pids.items()}
    databases = [connections[alias].settings_dict["NAME"] for alias in ("default", "journal")]
    try:
        return BurstCpu(_conninfo(connections["default"].settings_dict), databases, roots, os.getpid(),
                        run.proc.pid).start()
    except Exception:  # noqa: BLE001 - the burst's figures do not depend on it
        return None


def _effects_summary() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT state, count(*) FROM effects_remoteeffect GROUP BY state ORDER BY state")
        return {state: n for state, n in cursor.fetchall()}


class Burst:
    """`bench burst`: registered in bench/management/commands/bench.py's SUBCOMMANDS."""

    name = "burst"
    help = ("A burst of signed deliveries against the processes make run starts (scripts/run.py: web, the Celery "
            "worker children, beat, demo receiver) on a throwaway database: from the first 201 to the first "
            "ApplicationResult and to the last finalized effect, each effect checked once at the receiver, with the "
            "CPU per event of each role.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--deliveries", type=int, default=2000, help="deliveries to post (default 2000)")
        parser.add_argument("--clients", default="8", help="posting threads (default 8); a list (1,2,4,8,16) runs "
                            "each phase once per count against the same processes: docs/benchmarks.md's chart")
        add_sweep_arguments(parser)
        parser.add_argument("--timeout", type=float, default=900.0,
                            help="seconds to wait for every ApplicationResult, then for every finalized effect, "
                                 "after the burst (default 900)")
        parser.add_argument("--redis-url", default=None,
                            help="broker for run.py's processes (default: a private Redis on a spare port)")
        parser.add_argument("--first-result-budget", type=float, default=2.0,
                            help="--check: the first ApplicationResult's budget in seconds (default 2)")
        parser.add_argument("--phases", default="cold",
                            help="cold: one burst on the database migrated seconds before (no planner statistics); "
                                 "cold,analyzed: then ANALYZE and a second burst, and the first-minute ratio "
                                 "(default cold)")
        parser.add_argument("--check", action="store_true",
                            help="exit non-zero below the goals of bench/budgets.json \"burst\" (issue 40: end to end "
                                 "events/s, CPU per event, first minute / analyzed), if the first result is over "
                                 "budget, a delivery was refused, an effect was not finalized or not exactly once "
                                 "at the receiver")
        parser.add_argument("--json", metavar="FILE", help="write the JSON report to FILE")
        parser.add_argument("--database-name", default=DEFAULT_DATABASE,
                            help=f"throwaway database (default {DEFAULT_DATABASE}; <name>_journal too)")
        parser.add_argument("--keep", action="store_true", help="keep the throwaway databases afterwards")

    def handle(self, command, options: dict) -> None:
        import logging

        from django.core.management.base import CommandError
        from django.db import connections

        from connector.demo import build_world
        from bench.databases import NAME_RE, ThrowawayDatabases

        from bench.burst_sweep import draw, parse_clients, redraw, sweep_table

        say = command.progress
        if options["from_json"]:
            return redraw(command, options)
        try:
            counts = parse_clients(options["clients"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        name = options["database_name"]
        if not NAME_RE.match(name) or not NAME_RE.match(f"{name}_journal"):
            raise CommandError(f"--database-name {name!r} must match {NAME_RE.pattern}")
        if options["deliveries"] < 1:
            raise CommandError("--deliveries must be positive")
        phases = tuple(options["phases"].split(","))
        if not phases or any(p not in ("cold", "analyzed") for p in phases) or len(set(phases)) != len(phases):
            raise CommandError("--phases is cold, analyzed or cold,analyzed")
        logging.getLogger("connector").setLevel(logging.WARNING)
        logging.getLogger("httpx").setLevel(logging.WARNING)
        log_dir = Path(tempfile.gettempdir())
        with ThrowawayDatabases([name], f"{name}_journal", keep=options["keep"], say=say) as databases:
            connections["default"] = databases.wrappers[name]
            say(f"database {name}: building the demo world (push=True) through the services")
            build_world("", push=True)
            try:
                report = run_burst(deliveries=options["deliveries"], clients=counts,
                                   timeout=options["timeout"], redis_url=options["redis_url"], log_dir=log_dir,
                                   say=say, phases=phases)
            except RuntimeError as exc:
                raise CommandError(str(exc)) from exc
        report["command"] = (f"manage.py bench burst --deliveries {options['deliveries']} "
                             f"--clients {','.join(map(str, counts))} --phases {','.join(phases)}")
        if options["json"]:
            Path(options["json"]).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            say(f"report written to {options['json']}")
        command.stdout.write(format_report(report))
        if len(counts) > 1 or options["table"]:
            command.stdout.write(sweep_table(report))
        if options["chart"]:
            say(f"chart written to {draw(report, Path(options['chart']))}")
        if options["check"]:
            from bench import load_budgets

            goals = dict(load_budgets().get("burst") or {})
            if "cold" not in phases or "analyzed" not in phases:
                goals.pop("min_first_minute_ratio", None)
            failures = check_burst(report, goals, deliveries=options["deliveries"],
                                   first_result_budget=options["first_result_budget"])
            if failures:
                raise CommandError("burst budget broken:\n  " + "\n  ".join(failures))
            command.stdout.write(command.style.SUCCESS("check passed"))
