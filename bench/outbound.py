"""`manage.py bench outbound`: effects finalized per second by the real egress dispatch loop against an
at-least-once baseline measured in the same run (issue 20, goals 1 and 3; decisions D-340..D-342).

On a throwaway database with the demo push world (`connector.demo.build_owners(push=True)`, `--accounts`
accounts), `--rounds` x `--effects` effects are authored up front through the real outbound authoring service
(`effects.services.outbound.outbound_commands_author`, the set-based author the batched Runtime calls,
under `lock_serving`; untimed). Then, `--rounds` times, two phases alternate:

* product: `--workers` spawned egress processes, one dispatch loop each (`effects.services.worker.
  effect_dispatch_batch` of CONNECTOR["EGRESS_BATCH"] effects per step, D-350: claim + permits, sending markers,
  HTTP POSTs, settlements + finalizations; `effect_dispatch_once` when EGRESS_BATCH is 0 or 1), for `--warm` +
  `--seconds`; the figure is the RemoteEffects that became `finalized` inside the measured window.
* baseline: the same number of spawned processes, each a procrastinate worker (concurrency 1) whose job reads
  its row of `bench_outbound_baseline` (a copy of one authored command's method, path and body), makes the same
  POST to the same receiver and marks its row done: at-least-once (a crash between the POST and the UPDATE sends
  again). The figure is the rows marked done inside the window.

Both send to one loopback test receiver (tests/effects/receiver.py) answering at once; it counts requests per
Idempotency-Key, so the run reports duplicates (a key requested more than once) and lost effects (a finalized
effect whose key never arrived, a key that arrived whose effect is not finalized) for the product, and the same for
the baseline. Busy CPU per completion (bench/cpu.py, D-271): the worker processes, the parent (whose threads are
the receiver) and the PostgreSQL backends of the bench's databases, over exactly each window.

`--check` compares against bench/budgets.json "outbound" (floors equal to the issue's goals). The chart
(`--chart`, bench/outbound_chart.py) is drawn from the JSON report, also from a saved one (`--from-json`).
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import traceback
from pathlib import Path

from bench.claims_cpu import CpuOfWindow
from bench.options import report_arguments, report_of, save_and_check

DEFAULT_DATABASE = "connector_bench_outbound"
BASELINE_TASK = "bench_outbound_post"
BASELINE_TOKEN = "bench-baseline"  # the baseline's bearer token: a constant, never a stored secret
AUTHOR_BATCH = 200
TAIL = 0.5  # seconds the workers run past the window, so they are alive while its CPU is sampled

BASELINE_TABLE = """
CREATE TABLE IF NOT EXISTS bench_outbound_baseline (
    id bigserial PRIMARY KEY, phase int NOT NULL, method text NOT NULL, path text NOT NULL, body bytea NOT NULL,
    idem_key text NOT NULL UNIQUE, status int, done_at timestamptz)
"""


# -- worker processes -----------------------------------------------------------------------------------------

def _worker_main(index: int, setup: dict, command: dict, inbox, out) -> None:
    """`claims._run_workers`'s target: bootstrap, warm up, report ready, wait for the common start, run."""
    try:
        from bench.claims import _bootstrap

        _bootstrap(setup)
        import logging

        for name in ("httpx", "httpcore"):  # one INFO line per request otherwise
            logging.getLogger(name).setLevel(logging.WARNING)
        if command["kind"] == "product":
            _product_warm()
        out.put(("ready", index, None))
        timing = inbox.get()
        command = {**command, "start_at": timing["start_at"], "stop_at": timing["start_at"] + command["run"]}
        result = (_product_worker if command["kind"] == "product" else _baseline_worker)(index, command)
        out.put(("ok", index, result))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put(("failed", index, traceback.format_exc()))


def _product_warm() -> None:
    """Untimed: the connection and the process's frozen-fact caches (as `bench outbound-rate`)."""
    from django.db import connection

    from effects.models import OutboundCommand
    from effects.services.outbound import frozen_path_template

    connection.ensure_connection()
    for command in OutboundCommand.objects.order_by("account_id", "pk").distinct("account_id"):
        frozen_path_template(command)


def _product_worker(index: int, command: dict) -> dict:
    """The real dispatch loop until the stop time, or until 1 s without claimable work."""
    from django.db import connections

    from effects.services import worker

    name = f"bench-outbound-{index}-{os.getpid()}"
    delay = command["start_at"] - time.time()
    if delay > 0:
        time.sleep(delay)
    done = idle_since = 0
    size = worker.egress_batch_size()  # CONNECTOR["EGRESS_BATCH"] (D-350): the batched step unless it is 0 or 1
    try:
        while time.time() < command["stop_at"]:
            step = (len(worker.effect_dispatch_batch(n=size, holder_name=name)) if size > 1
                    else int(worker.effect_dispatch_once(holder_name=name) is not None))
            if step:
                done, idle_since = done + step, 0
                continue
            idle_since = idle_since or time.time()
            if time.time() - idle_since > 1.0:
                break
            time.sleep(0.005)
    finally:
        connections.close_all()
    return {"dispatched": done}


def _baseline_worker(index: int, command: dict) -> dict:
    """procrastinate's worker (concurrency 1): each job POSTs its row to the receiver, then marks the row done."""
    import httpx
    import psycopg
    from procrastinate import App, PsycopgConnector

    from bench.claims import peer_window

    client = httpx.Client()
    rows = psycopg.connect(command["conninfo"], autocommit=True)
    url, done = command["url"].rstrip("/"), [0]

    async def run() -> None:
        app = App(connector=PsycopgConnector(conninfo=command["conninfo"], min_size=1, max_size=2))

        @app.task(name=BASELINE_TASK, queue=command["queue"])
        def post(row: int) -> None:
            method, path, body, key = rows.execute(
                "SELECT method, path, body, idem_key FROM bench_outbound_baseline WHERE id = %s", [row]).fetchone()
            response = client.request(method, url + path, content=bytes(body), timeout=5.0, headers={
                "Authorization": f"Bearer {BASELINE_TOKEN}", "Content-Type": "application/json",
                "Idempotency-Key": key})
            response.raise_for_status()  # a failed job is retried by nobody here: it counts as not done
            rows.execute("UPDATE bench_outbound_baseline SET status = %s, done_at = clock_timestamp() "
                         "WHERE id = %s", [response.status_code, row])
            done[0] += 1

        await peer_window(app, command, name=f"bench-outbound-{index}")

    try:
        asyncio.run(run())
    finally:
        rows.close()
        client.close()
    return {"done": done[0]}


# -- the parent: world, backlogs, phases ------------------------------------------------------------------------

def author_effects(world, count: int, say) -> float:
    """`count` effects through the set-based outbound author, spread round-robin over the world's accounts in
    transactions of AUTHOR_BATCH; returns the seconds it took."""
    from django.db import transaction

    from connector.demo import PUSH
    from connector.services.guard import lock_serving
    from effects.services.outbound import outbound_commands_author

    push, began, accounts = PUSH["push"], time.monotonic(), world.accounts
    for start in range(0, count, AUTHOR_BATCH):
        account = accounts[(start // AUTHOR_BATCH) % len(accounts)]
        with transaction.atomic():
            ctx = lock_serving(account_id=account.pk)
            outbound_commands_author(calls=[{
                "ctx": ctx, "account_key": account.account_key, "application_scope": "bench.outbound",
                "effect_root_id": f"ob-{i}", "effect_slot_id": "push", "effect_generation_id": "g1",
                "push_contract": push["contract"], "callout": push["callout"],
                "path_params": {"record_key": f"ob-{i}", "record_id": f"ob-{i}"},
                "body": {"record_key": f"ob-{i}", "name": f"Bench {i}"}, "suppress_external_effects": False}
                for i in range(start, min(count, start + AUTHOR_BATCH))])
    seconds = time.monotonic() - began
    say(f"authored {count} effects over {len(accounts)} accounts in {seconds:.1f} s")
    return seconds


def seed_baseline(conninfo: str, phase: int, jobs: int) -> str:
    """`jobs` baseline rows for `phase` (copies of the authored commands' method, path and body, cycling, under
    their own keys) and one procrastinate job per row on the phase's own queue; returns the queue name."""
    import psycopg

    queue = f"bench_outbound_{phase}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(BASELINE_TABLE)
        n = conn.execute("SELECT count(*) FROM effects_outboundcommand").fetchone()[0]
        conn.execute(
            "INSERT INTO bench_outbound_baseline (phase, method, path, body, idem_key) "
            "SELECT %(phase)s, c.method, c.path, c.request_body, 'baseline-' || %(phase)s || '-' || g "
            "FROM generate_series(0, %(jobs)s - 1) g JOIN (SELECT method, path, request_body, "
            "row_number() OVER (ORDER BY id) - 1 AS rn FROM effects_outboundcommand) c ON c.rn = g %% %(n)s "
            "ORDER BY g", {"phase": phase, "jobs": jobs, "n": n})
        conn.execute("INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
                     "SELECT %s, %s, json_build_object('row', id)::jsonb FROM bench_outbound_baseline "
                     "WHERE phase = %s ORDER BY id", [queue, BASELINE_TASK, phase])
        conn.execute("ANALYZE procrastinate_jobs")
        conn.execute("ANALYZE bench_outbound_baseline")
    return queue


class _CpuWithReceiver(CpuOfWindow):
    """The window's CPU of the workers, of this process (its threads are the receiver) and of the backends."""

    def __call__(self, start_at: float, pids: list[int]) -> None:
        super().__call__(start_at, [*pids, os.getpid()])


def run_phase(setup: dict, conninfo: str, *, kind: str, workers: int, warm: float, seconds: float,
              queue: str = "", url: str = "", say=print) -> dict:
    """One measured phase (`kind` product or baseline) of `workers` spawned processes."""
    from bench.claims import _rate as _window_rate, _run_workers

    say(f"{kind}: {workers} processes, {warm:g} s warm-up + {seconds:g} s window")
    command = {"kind": kind, "run": warm + seconds + TAIL, "conninfo": conninfo, "queue": queue, "url": url}
    cpu = _CpuWithReceiver(setup, conninfo, warm, seconds)
    start_at, results = _run_workers(setup, [dict(command) for _ in range(workers)], target=_worker_main,
                                     timeout=warm + seconds + 300, on_start=cpu)
    t0, t1 = start_at + warm, start_at + warm + seconds
    if kind == "product":
        out = _window_rate(conninfo, "SELECT count(*), extract(epoch FROM max(changed_at)) FROM effects_remoteeffect "
                           "WHERE state = 'finalized' AND changed_at >= to_timestamp(%s) "
                           "AND changed_at <= to_timestamp(%s)", [], t0, t1)
    else:
        out = _window_rate(conninfo, "SELECT count(*), extract(epoch FROM max(done_at)) FROM bench_outbound_baseline "
                           "WHERE phase = %s AND done_at >= to_timestamp(%s) AND done_at <= to_timestamp(%s)",
                           [int(queue.rsplit("_", 1)[-1])], t0, t1)
    phase = {"kind": kind, "workers": workers, **out, "per_worker": results, "cpu": cpu.result(out["count"]),
             "load_average": [round(v, 2) for v in os.getloadavg()]}
    say(json.dumps({k: v for k, v in phase.items() if k != "per_worker"}))
    return phase


# -- the accounting at the receiver -------------------------------------------------------------------------------

def receiver_accounting(requests: list[dict], done_keys: set[str], open_keys: set[str]) -> dict:
    """Exactly-once at the receiver for one side. `requests` are the receiver's records of that side (each with
    its `key`), `done_keys` the keys the side recorded as done (the product's finalized effects, the baseline's
    rows marked done), `open_keys` the keys not done. Duplicates: keys requested more than once; lost: a done key
    that never arrived (recorded done, never sent) or an arrived key not recorded done."""
    per_key: dict[str, int] = {}
    for request in requests:
        per_key[request["key"]] = per_key.get(request["key"], 0) + 1
    arrived = set(per_key)
    done_not_received = len(done_keys - arrived)
    received_not_done = len(arrived & open_keys) + len(arrived - done_keys - open_keys)
    return {"requests": len(requests), "keys_received": len(arrived), "done": len(done_keys),
            "duplicate_keys": sum(1 for n in per_key.values() if n > 1),
            "duplicate_requests": sum(n - 1 for n in per_key.values() if n > 1),
            "done_not_received": done_not_received, "received_not_done": received_not_done,
            "lost": done_not_received + received_not_done}


def _accounting(conninfo: str, receiver) -> dict:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        effects = conn.execute("SELECT c.provider_idempotency_key, e.state FROM effects_remoteeffect e "
                               "JOIN effects_outboundcommand c ON c.id = e.command_id").fetchall()
        baseline = conn.execute("SELECT idem_key, done_at IS NOT NULL FROM bench_outbound_baseline").fetchall()
    states: dict[str, int] = {}
    for _, state in effects:
        states[state] = states.get(state, 0) + 1
    # Effects still `prepared` were never claimed: not lost, left for later (their keys never arrived).
    finalized = {k for k, s in effects if s == "finalized"}
    open_product = {k for k, s in effects if s not in ("finalized", "prepared")}
    product = receiver_accounting([r for r in receiver.requests if not r["key"].startswith("baseline-")],
                                  finalized, open_product)
    base = receiver_accounting([r for r in receiver.requests if r["key"].startswith("baseline-")],
                               {k for k, d in baseline if d}, {k for k, d in baseline if not d})
    return {"product": {**product, "effect_states": states}, "baseline": base}


# -- the whole run -----------------------------------------------------------------------------------------------

def _world(accounts: int):
    from connector.actors import Actor
    from connector.demo import build_owners, walk_gates_to_validating
    from connector.services import serving

    actor = Actor.system("bench")
    world = build_owners("", account_keys=tuple(f"acct-{i:02d}" for i in range(accounts)), actor=actor, push=True)
    epoch = serving.epoch_prepare_from_owners(epoch_id="bench-epoch-1",
                                              configuration_generation_id=world.configuration.generation_id,
                                              actor=actor)
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=actor)
    walk_gates_to_validating(world, actor)
    serving.epoch_activate_first(epoch_pk=epoch.pk, actor=actor)
    return world


def summarize(report: dict) -> dict:
    """Totals per side over every phase and the ratios the goals name (product over baseline)."""
    totals = {}
    for kind in ("product", "baseline"):
        phases = [p for p in report["phases"] if p["kind"] == kind]
        count, seconds = sum(p["count"] for p in phases), sum(p["seconds"] for p in phases)
        busy = [((p.get("cpu") or {}).get("workers_ms", 0) + (p.get("cpu") or {}).get("backends_ms", 0), p["count"])
                for p in phases if (p.get("cpu") or {}).get("per_completion_ms")]
        busy_count = sum(c for _, c in busy)
        totals[kind] = {"phases": len(phases), "count": count, "seconds": round(seconds, 2),
                        "per_second": round(count / seconds, 2) if seconds else None,
                        "busy_ms_per_completion": round(sum(b for b, _ in busy) / busy_count, 3) if busy_count
                        else None, "shortest_window_s": min((p["seconds"] for p in phases), default=None)}
    prod, base = totals["product"], totals["baseline"]
    pairs = []
    products = [p for p in report["phases"] if p["kind"] == "product"]
    baselines = [p for p in report["phases"] if p["kind"] == "baseline"]
    for i, (p, b) in enumerate(zip(products, baselines), start=1):
        pc = ((p.get("cpu") or {}).get("per_completion_ms") or {}).get("busy_ms")
        bc = ((b.get("cpu") or {}).get("per_completion_ms") or {}).get("busy_ms")
        pairs.append({"round": i, "effects_per_s": p["per_second"], "baseline_jobs_per_s": b["per_second"],
                      "rate_ratio": round(p["per_second"] / b["per_second"], 3) if b["per_second"] else None,
                      "cpu_ratio": round(pc / bc, 3) if pc and bc else None})
    ratios = {"effects_over_baseline": round(prod["per_second"] / base["per_second"], 3)
              if prod["per_second"] and base["per_second"] else None,
              "cpu_over_baseline": round(prod["busy_ms_per_completion"] / base["busy_ms_per_completion"], 3)
              if prod["busy_ms_per_completion"] and base["busy_ms_per_completion"] else None}
    return {"totals": totals, "rounds": pairs, "ratios": ratios}


def run_outbound(*, workers: int = 8, seconds: float = 20.0, warm: float = 3.0, rounds: int = 2, accounts: int = 4,
                 effects: int = 6000, baseline_jobs: int = 12000, database: str = DEFAULT_DATABASE,
                 keep: bool = False, say=print) -> dict:
    """Every phase on a throwaway database; returns the report."""
    from django.conf import settings
    from django.db import connections

    from bench.hot_pool import _conninfo
    from bench.hot_raw import peer_schema_apply
    from bench.databases import ThrowawayDatabases
    from tests.effects.receiver import Receiver

    report = {"bench": "outbound", "workers": workers, "worker_shape": f"{workers} processes x 1 thread",
              "seconds": seconds, "warm": warm, "rounds": rounds, "accounts": accounts,
              "effects_per_product_phase": effects, "jobs_per_baseline_phase": baseline_jobs,
              "cpus": os.cpu_count(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "phases": []}
    receiver = Receiver().start()
    try:
        with ThrowawayDatabases([database], f"{database}_journal", keep=keep, say=say) as dbs:
            connections["default"] = dbs.wrappers[database]
            default, journal = connections["default"].settings_dict, connections["journal"].settings_dict
            conninfo = _conninfo(default)
            setup = {"settings_module": os.environ.get("DJANGO_SETTINGS_MODULE") or settings.SETTINGS_MODULE,
                     "names": {"default": default["NAME"], "journal": journal["NAME"]},
                     "connector": {"EGRESS_BASE_URL": receiver.url, "EGRESS_TIMEOUT_SECONDS": 5,
                                   "SECRET_BACKEND_DIR": settings.CONNECTOR["SECRET_BACKEND_DIR"]}}
            say(f"building the push world with {accounts} accounts")
            world = _world(accounts)
            report["authoring_seconds"] = round(author_effects(world, effects * rounds, say), 2)
            connections["default"].close()
            peer_schema_apply(conninfo)
            queues = [seed_baseline(conninfo, r, baseline_jobs) for r in range(1, rounds + 1)]
            import psycopg

            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("ANALYZE effects_remoteeffect, effects_outboundcommand")
            for queue in queues:
                report["phases"].append(run_phase(setup, conninfo, kind="product", workers=workers, warm=warm,
                                                  seconds=seconds, say=say))
                report["phases"].append(run_phase(setup, conninfo, kind="baseline", workers=workers, warm=warm,
                                                  seconds=seconds, queue=queue, url=receiver.url, say=say))
            report["receiver"] = _accounting(conninfo, receiver)
    finally:
        receiver.stop()
    report.update(summarize(report))
    return report


def check_report(report: dict, budget: dict) -> list[str]:
    """The issue's goals as floors (bench/budgets.json "outbound"): every broken one, named."""
    failures = []
    ratios, product = report["ratios"], report["receiver"]["product"]
    floor = budget.get("min_effects_over_baseline")
    if floor is not None and (ratios["effects_over_baseline"] or 0) < floor:
        failures.append(f"effects finalized/s over baseline jobs/s {ratios['effects_over_baseline']} < {floor} "
                        "(issue 20 goal 1)")
    ceiling = budget.get("max_cpu_over_baseline")
    if ceiling is not None and (ratios["cpu_over_baseline"] is None or ratios["cpu_over_baseline"] > ceiling):
        failures.append(f"busy CPU per finalized effect over the baseline's per job {ratios['cpu_over_baseline']} "
                        f"> {ceiling} (issue 20 goal 3)")
    least = budget.get("min_phase_seconds")
    if least is not None and report.get("seconds", 0) < least:
        failures.append(f"measured windows of {report.get('seconds')} s < {least} s (--seconds)")
    for phase in report["phases"]:
        if phase.get("window_cut_by_drain"):
            failures.append(f"{phase['kind']}: the backlog drained, the window ended after {phase['seconds']} s "
                            "(author more: --effects, --baseline-jobs)")
    for figure in ("duplicate_keys", "lost"):
        if product[figure]:
            failures.append(f"product: {figure} {product[figure]} at the receiver (must be 0)")
    return failures


def text_lines(report: dict) -> list[str]:
    lines = []
    for p in report["phases"]:
        per = ((p.get("cpu") or {}).get("per_completion_ms") or {})
        lines.append(f"{p['kind']:>8}: {p['count']} in {p['seconds']} s = {p['per_second']}/s; busy CPU "
                     f"{per.get('busy_ms')} ms per completion (workers+receiver {per.get('workers_ms')}, PostgreSQL "
                     f"{per.get('backends_ms')}); load {p['load_average'][0]}")
    lines.append(f"ratios: {json.dumps(report['ratios'])}; rounds: {json.dumps(report['rounds'])}")
    lines.append(f"receiver: product {json.dumps(report['receiver']['product'])}; "
                 f"baseline {json.dumps(report['receiver']['baseline'])}")
    return lines


class Outbound:
    """`bench outbound`: registered in bench/management/commands/bench.py's SUBCOMMANDS."""

    name = "outbound"
    help = ("Effects finalized per second by --workers egress processes against an at-least-once procrastinate "
            "baseline POSTing to the same receiver, side by side, with busy CPU per completion (issue 20).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--workers", type=int, default=8, help="egress processes (1 dispatch loop each); the "
                            "baseline runs as many procrastinate workers")
        parser.add_argument("--seconds", type=float, default=20.0, help="measured window per phase")
        parser.add_argument("--warm", type=float, default=3.0, help="untimed warm-up before each window")
        parser.add_argument("--rounds", type=int, default=2, help="product/baseline pairs, alternated")
        parser.add_argument("--accounts", type=int, default=4)
        parser.add_argument("--effects", type=int, default=6000, help="effects authored per product phase")
        parser.add_argument("--baseline-jobs", type=int, default=12000, help="jobs seeded per baseline phase")
        report_arguments(parser, database=DEFAULT_DATABASE, budget="outbound")
        parser.add_argument("--chart", default="", help="draw the chart of the report to this SVG")

    def handle(self, command, options: dict) -> None:
        from django.core.management.base import CommandError

        if not options["from_json"] and (options["workers"] < 1 or options["rounds"] < 1
                                         or options["seconds"] <= 0):
            raise CommandError("--workers and --rounds must be at least 1, --seconds positive")

        def run() -> dict:
            report = run_outbound(workers=options["workers"], seconds=options["seconds"], warm=options["warm"],
                                  rounds=options["rounds"], accounts=options["accounts"], effects=options["effects"],
                                  baseline_jobs=options["baseline_jobs"], database=options["database_name"],
                                  keep=options["keep"], say=command.progress)
            report["command"] = "manage.py bench outbound " + " ".join(
                f"--{k.replace('_', '-')} {options[k]}" for k in
                ("workers", "seconds", "warm", "rounds", "accounts", "effects", "baseline_jobs"))
            return report

        report = report_of(options, run)
        for line in text_lines(report):
            command.progress(line)
        if options["chart"]:
            from bench import load_budgets
            from bench.outbound_chart import draw

            draw(report, Path(options["chart"]), load_budgets().get("outbound"))
        command.stdout.write(json.dumps(report, indent=2))
        save_and_check(command, options, report, budget="outbound", check=check_report,
                       goal="outbound goals 1 and 3 (0 duplicates, 0 lost)")
