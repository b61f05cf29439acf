"""`manage.py bench claims`: claim -> Runtime -> ApplicationResult throughput against procrastinate, and claim
fairness with a hot account (issue 18, goals 3 and 8; decisions D-204..D-206).

On a throwaway database with the demo world (push off: Runtime applies the CRM change and records the
ApplicationResult, nothing is authored outbound) and `--accounts` accounts:

* throughput: a backlog of ready Executions spread over the accounts is built through the services (admission,
  materialization, lane advance; untimed). `--workers` spawned processes then run the worker step for
  `--warm + --seconds`; the parent counts completed Executions at the end of the warm-up and at the end of the
  window (throughput = completions in the window / its length, so start-up does not count). Modes: `single`
  (`execution_claim_and_run`, one claim per transaction) and `batch` (`execution_claim_batch_and_run`, n per
  claim) when the code has it. The backlog must outlast the window; a drained backlog is reported.
* peer: procrastinate (its own schema and worker, concurrency 1 per process, same worker count, same database):
  `--peer-jobs` trivial jobs are inserted up front (untimed), the workers run for the same warm-up and window, and
  the parent counts succeeded jobs the same way.
* busy CPU (goal 4, D-271; `bench/claims_cpu.py`): per measured window, the workers' and their PostgreSQL backends'
  CPU from /proc divided by the window's completions, and each mode's ratio to procrastinate's (`--check`: <= 2).
* fairness (run first, on an empty queue): every account but one gets `--fair-backlog` ready Executions; the claim delay of an Execution is
  its first Attempt's `claimed_at` minus the moment the workers start. Measured once without and once with a hot
  account holding 10x that backlog, seeded first (the oldest work: the worst case for a FIFO claim). Goal 8: the
  other accounts' p99 delay with the hot account / without it <= 2.

The module also runs from `manage.py shell` (`bench.claims.run_claims`) on code that predates the subcommand,
which is how the baseline of docs/benchmarks.md ("Issue 18: batched fair claims") was measured.
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import queue as queue_module
import statistics
import time
import traceback

from bench.claims_cpu import CPU_GOAL, CpuOfWindow, cpu_check, cpu_lines, cpu_ratios

PEER_TASK = "bench_claims_noop"
EVENTS_PER_RECEIPT = 50
TAIL = 0.5  # seconds the workers run past the measured window (its CPU is sampled while they live)


def _percentile(values, q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[int(q) - 1]


# -- worker processes -----------------------------------------------------------------------------------------

def _bootstrap(setup: dict) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = setup["settings_module"]
    import logging

    import django

    django.setup()
    from django.conf import settings
    from django.db import connections

    settings.DEBUG = False
    for alias, name in setup["names"].items():
        connections[alias].settings_dict["NAME"] = name
    settings.CONNECTOR = {**settings.CONNECTOR, **setup["connector"]}
    for name in ("connector", "effects", "cutover", "procrastinate", "django.db.backends"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _worker_main(index: int, setup: dict, command: dict, inbox, out) -> None:
    """Bootstrap, report ready, wait for the common start time from the parent, run, report the result."""
    try:
        _bootstrap(setup)
        if command["kind"] != "peer":
            from connector.models import Execution

            Execution.objects.filter(pk=0).exists()  # the connection is open before the start
        out.put(("ready", index, None))
        timing = inbox.get()
        command = {**command, "start_at": timing["start_at"], "stop_at": timing["start_at"] + command["run"]}
        if command["kind"] == "seed":
            result = [pk for key, count, tag in command["jobs"] for pk in _seed(key, count, tag)]
        else:
            result = (_peer_worker if command["kind"] == "peer" else _product_worker)(index, command)
        out.put(("ok", index, result))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put(("failed", index, traceback.format_exc()))


def _product_worker(index: int, command: dict) -> dict:
    """The worker step in a loop until the stop time, or until 1 s without claimable work."""
    from connector.services import execution as ex

    holder, mode, n = f"bench-{index}", command["mode"], command["batch"]
    delay = command["start_at"] - time.time()
    if delay > 0:
        time.sleep(delay)
    done = idle_since = 0
    while time.time() < command["stop_at"]:
        if mode == "batch":
            ran = len(ex.execution_claim_batch_and_run(holder=holder, n=n, lease_seconds=600))
        else:
            ran = 0 if ex.execution_claim_and_run(holder=holder, lease_seconds=600) is None else 1
        done += ran
        if ran:
            idle_since = 0
            continue
        idle_since = idle_since or time.time()
        if time.time() - idle_since > 1.0:
            break
        time.sleep(0.01)
    return {"ran": done}


def _peer_worker(index: int, command: dict) -> dict:
    """procrastinate's worker (concurrency 1) until the queue is empty or the stop time."""
    from procrastinate import App, PsycopgConnector

    async def run() -> None:
        app = App(connector=PsycopgConnector(conninfo=command["conninfo"], min_size=1, max_size=2))

        @app.task(name=PEER_TASK, queue=command["queue"])
        def noop(i: int) -> None:
            return None

        await peer_window(app, command, name=f"bench-claims-{index}")

    asyncio.run(run())
    return {}


async def peer_window(app, command: dict, *, name: str) -> None:
    """Work `command["queue"]` with one procrastinate worker (concurrency 1, polling 50 ms, jobs kept) from
    `command["start_at"]` until `command["stop_at"]` (epoch seconds): one phase window of a baseline process."""
    async with app.open_async():
        delay = command["start_at"] - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            await asyncio.wait_for(app.run_worker_async(
                queues=[command["queue"]], wait=False, concurrency=1, listen_notify=False,
                install_signal_handlers=False, delete_jobs="never", fetch_job_polling_interval=0.05,
                name=name), timeout=max(0.1, command["stop_at"] - time.time()))
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass


def _run_workers(setup: dict, commands: list[dict], *, timeout: float,
                 on_start=None, target=None) -> tuple[float, list[dict]]:
    """Spawn one process per command; once every one is bootstrapped, start them all 0.5 s later (and call
    `on_start(start_at, pids)`). Returns the common start time and the results. `target` (default
    `_worker_main`, same signature) is the processes' entry point (`bench outbound` passes its own)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    inboxes = [ctx.Queue() for _ in commands]
    procs = [ctx.Process(target=target or _worker_main, args=(i, setup, c, inboxes[i], out), daemon=True)
             for i, c in enumerate(commands)]
    for p in procs:
        p.start()
    results, failures, ready = {}, [], 0
    start_at = 0.0
    until = time.time() + 300
    try:
        while len(results) + len(failures) < len(procs):
            try:
                kind, index, payload = out.get(timeout=max(0.1, until - time.time()))
            except queue_module.Empty:
                raise RuntimeError("bench workers gave no answer in time") from None
            if kind == "ready":
                ready += 1
                if ready == len(procs):
                    start_at = time.time() + 0.5
                    for inbox in inboxes:
                        inbox.put({"start_at": start_at})
                    if on_start is not None:
                        on_start(start_at, [p.pid for p in procs])
                    until = start_at + timeout
            elif kind == "ok":
                results[index] = payload
            else:
                failures.append(payload)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    if failures:
        raise RuntimeError("\n".join(failures))
    return start_at, [results[i] for i in range(len(procs))]


# -- the parent: world, backlogs, phases ------------------------------------------------------------------------

def _seed(account_key: str, count: int, tag: str) -> list[int]:
    """`count` ready Executions of one account through the services: receipts of 50 one-record events each,
    materialized, then one lane advance per lane (each record is its own lane)."""
    from connector.actors import Actor
    from connector.demo import DEMO_CHANNEL
    from connector.services.admission import receipt_admit
    from connector.services.execution import lane_advance
    from connector.services.materialize import receipt_materialize

    actor = Actor.system("bench")
    lanes: list[int] = []
    for start in range(0, count, EVENTS_PER_RECEIPT):
        events = [{"id": f"bc-{tag}-{i}", "type": "record.updated", "record_id": f"bc-{tag}-{i}", "sequence": 1,
                   "occurred_at": "2025-01-01T00:00:00Z",
                   "data": {"name": f"Bench {tag} {i}", "email": f"bc{i}@example.com"}}
                  for i in range(start, min(count, start + EVENTS_PER_RECEIPT))]
        admitted = receipt_admit(account_key=account_key, channel=DEMO_CHANNEL, transport_key=f"bc-{tag}-{start}",
                                 body=json.dumps({"events": events}, sort_keys=True).encode(), actor=actor)
        lanes += receipt_materialize(receipt_pk=admitted.receipt.pk).lanes
    minted = []
    for lane_pk in lanes:
        execution = lane_advance(lane_pk=lane_pk)
        if execution is not None:
            minted.append(execution.pk)
    return minted


def _seed_parallel(setup: dict, jobs: list[tuple[str, int, str]], workers: int) -> list[int]:
    """`_seed` jobs (account key, count, tag) split over `workers` processes; each job is cut into parts of 100
    so the processes share the work evenly."""
    parts = [(key, min(100, count - i), f"{tag}-{i}") for key, count, tag in jobs for i in range(0, count, 100)]
    commands = [{"kind": "seed", "run": 0, "jobs": parts[w::workers]} for w in range(workers)]
    _, results = _run_workers(setup, commands, timeout=3600)
    return [pk for r in results for pk in r]


def _world(accounts: int):
    """The demo world (push off) with `accounts` accounts, built through the services like connector.demo."""
    from connector.actors import Actor
    from connector.demo import build_owners, walk_gates_to_validating
    from connector.services import serving

    actor = Actor.system("bench")
    world = build_owners("", account_keys=tuple(f"acct-{i:02d}" for i in range(accounts)), actor=actor)
    epoch = serving.epoch_prepare_from_owners(epoch_id="bench-epoch-1",
                                              configuration_generation_id=world.configuration.generation_id,
                                              actor=actor)
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=actor)
    walk_gates_to_validating(world, actor)
    serving.epoch_activate_first(epoch_pk=epoch.pk, actor=actor)
    return world


def _scalar(conninfo: str, sql: str, params=()) -> int:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute(sql, params).fetchone()[0]


def _analyze(conninfo: str) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("ANALYZE connector_execution, connector_executionattempt, connector_orderinglane, "
                     "connector_projection, connector_crmrecord, connector_applicationresult")


def _rate(conninfo: str, sql: str, params: list, t0: float, t1: float) -> dict:
    """Completions timestamped inside [t0, t1] (the measured window after the warm-up); if the backlog drained
    earlier the window ends at the last completion, and its real length is reported."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        count, last = conn.execute(sql, [*params, t0, t1]).fetchone()
    end = min(t1, float(last)) if last is not None else t1
    length = max(0.001, end - t0)
    return {"seconds": round(length, 2), "count": count, "per_second": round(count / length, 1),
            "window_cut_by_drain": end < t1 - 0.5}


def _throughput_phase(setup, conninfo, *, mode: str, workers: int, batch: int, warm: float, seconds: float,
                      say) -> dict:
    say(f"throughput {mode}: {workers} workers, {warm:g} s warm-up + {seconds:g} s window")
    # The workers run TAIL s past the window, so they (and their backends) are alive when its CPU is sampled.
    commands = [{"kind": "product", "mode": mode, "batch": batch, "run": warm + seconds + TAIL}
                for _ in range(workers)]
    cpu = CpuOfWindow(setup, conninfo, warm, seconds)
    start_at, _ = _run_workers(setup, commands, timeout=warm + seconds + 300, on_start=cpu)
    out = _rate(conninfo, "SELECT count(*), extract(epoch FROM max(changed_at)) FROM connector_execution "
                "WHERE state = 'completed' AND changed_at >= to_timestamp(%s) AND changed_at <= to_timestamp(%s)",
                [], start_at + warm, start_at + warm + seconds)
    left = _scalar(conninfo, "SELECT count(*) FROM connector_execution WHERE state = 'ready'")
    results = _scalar(conninfo, "SELECT count(*) FROM connector_applicationresult")
    completed = _scalar(conninfo, "SELECT count(*) FROM connector_execution WHERE state = 'completed'")
    return {**out, "mode": mode, "workers": workers, "batch": batch if mode == "batch" else 1,
            "ready_left": left, "application_results": results, "completed_total": completed,
            "cpu": cpu.result(out["count"])}


def _peer_phase(setup, conninfo, *, workers: int, jobs: int, warm: float, seconds: float, say) -> dict:
    import psycopg

    from bench.hot_raw import peer_schema_apply

    peer_schema_apply(conninfo)
    queue_name = f"bench_claims_{int(time.time())}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
                     "SELECT %s, %s, json_build_object('i', g)::jsonb FROM generate_series(1, %s) g",
                     [queue_name, PEER_TASK, jobs])
        conn.execute("ANALYZE procrastinate_jobs")  # as after the product's seed (D-257): both sides planned alike
    say(f"peer procrastinate: {workers} workers, {jobs} jobs, {warm:g} s warm-up + {seconds:g} s window")
    commands = [{"kind": "peer", "conninfo": conninfo, "queue": queue_name, "run": warm + seconds + TAIL}
                for _ in range(workers)]
    cpu = CpuOfWindow(setup, conninfo, warm, seconds)
    start_at, _ = _run_workers(setup, commands, timeout=warm + seconds + 300, on_start=cpu)
    out = _rate(conninfo, "SELECT count(*), extract(epoch FROM max(ev.at)) FROM procrastinate_events ev "
                "JOIN procrastinate_jobs j ON j.id = ev.job_id WHERE j.queue_name = %s AND ev.type = 'succeeded' "
                "AND ev.at >= to_timestamp(%s) AND ev.at <= to_timestamp(%s)",
                [queue_name], start_at + warm, start_at + warm + seconds)
    left = _scalar(conninfo, "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s AND status = 'todo'",
                   (queue_name,))
    return {**out, "workers": workers, "jobs": jobs, "todo_left": left, "cpu": cpu.result(out["count"])}


def _fairness_phase(setup, conninfo, world, *, hot: bool, mode: str, workers: int, batch: int, backlog: int,
                    tag: str, say) -> dict:
    """Claim delays of the quiet accounts' Executions, with or without a hot account holding 10x the backlog."""
    keys = [a.account_key for a in world.accounts]
    hot_key, quiet = keys[0], keys[1:]
    if hot:
        _seed_parallel(setup, [(hot_key, 10 * backlog, f"{tag}-hot")], workers)  # seeded first: the oldest work
    quiet_pks = _seed_parallel(setup, [(key, backlog, f"{tag}-q{i}") for i, key in enumerate(quiet)], workers)
    commands = [{"kind": "product", "mode": mode, "batch": batch, "run": 600} for _ in range(workers)]
    say(f"fairness {'with' if hot else 'without'} the hot account: {len(quiet)} x {backlog} quiet"
        + (f" + {10 * backlog} hot" if hot else "") + f", {mode}")
    start_at, _ = _run_workers(setup, commands, timeout=720)
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM a.claimed_at) FROM connector_executionattempt a "
            "WHERE a.ordinal = 1 AND a.execution_id = ANY(%s)", [quiet_pks]).fetchall()
        hot_rows = conn.execute(
            "SELECT count(*) FROM connector_execution e JOIN connector_connectoraccount c ON c.id = e.account_id "
            "WHERE c.account_key = %s AND e.state = 'completed'", [hot_key]).fetchone()[0]
    delays = [(float(r[0]) - start_at) * 1000 for r in rows]
    return {"hot": hot, "mode": mode, "quiet_accounts": len(quiet), "quiet_backlog": backlog,
            "hot_backlog": 10 * backlog if hot else 0, "quiet_claimed": len(delays), "quiet_seeded": len(quiet_pks),
            "hot_completed": hot_rows,
            "quiet_delay_ms": {"p50": round(_percentile(delays, 50), 1), "p99": round(_percentile(delays, 99), 1),
                               "max": round(max(delays), 1) if delays else None}}


def run_claims(*, workers: int = 2, seconds: float = 20.0, warm: float = 3.0, accounts: int = 5,
               backlog: int = 4000, batch: int = 10, peer_jobs: int = 40000, fair_backlog: int = 60,
               modes: tuple[str, ...] | None = None, database: str = "connector_bench_claims",
               keep: bool = False, say=print) -> dict:
    """Run every phase on a throwaway database; returns the report."""
    from django.conf import settings
    from django.db import connections

    from bench.hot_pool import _conninfo
    from bench.databases import ThrowawayDatabases
    from connector.services import execution as ex

    has_batch = hasattr(ex, "execution_claim_batch_and_run")
    modes = modes or (("single", "batch") if has_batch else ("single",))
    fair_mode = "batch" if has_batch else "single"
    report = {"bench": "claims", "workers": workers, "seconds": seconds, "warm": warm, "accounts": accounts,
              "batch": batch, "code_has_batch": has_batch, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "throughput": [], "fairness": []}
    with ThrowawayDatabases([database], f"{database}_journal", keep=keep, say=say) as dbs:
        connections["default"] = dbs.wrappers[database]
        default, journal = connections["default"].settings_dict, connections["journal"].settings_dict
        conninfo = _conninfo(default)
        setup = {"settings_module": os.environ.get("DJANGO_SETTINGS_MODULE") or settings.SETTINGS_MODULE,
                 "names": {"default": default["NAME"], "journal": journal["NAME"]},
                 "connector": {"SECRET_BACKEND_DIR": settings.CONNECTOR["SECRET_BACKEND_DIR"]}}
        say(f"building the world with {accounts} accounts")
        world = _world(accounts)
        connections["default"].close()
        # Fairness first, on an empty queue; each fairness run works until nothing is claimable.
        for hot in (False, True):
            report["fairness"].append(_fairness_phase(setup, conninfo, world, hot=hot, mode=fair_mode,
                                                      workers=workers, batch=batch, backlog=fair_backlog,
                                                      tag=f"f{int(hot)}", say=say))
            say(json.dumps(report["fairness"][-1]))
        for mode in modes:
            began = time.time()
            per = backlog // len(world.accounts)
            _seed_parallel(setup, [(a.account_key, per, f"t{mode}{i}") for i, a in enumerate(world.accounts)],
                           workers)
            say(f"seeded {per * len(world.accounts)} ready executions in {time.time() - began:.0f} s")
            # A running service's autovacuum analyzes a table after such a burst; a bench that measures right after
            # its bulk seed must too, else the planner, still believing the ready set tiny, bitmap-scans every
            # ready Execution for each claim (23 ms per claim at a 41,450 backlog, against 0.2 ms analyzed).
            _analyze(conninfo)
            report["throughput"].append(_throughput_phase(setup, conninfo, mode=mode, workers=workers, batch=batch,
                                                          warm=warm, seconds=seconds, say=say))
            say(json.dumps(report["throughput"][-1]))  # a later mode counts its own window: leftovers only add
        report["peer"] = _peer_phase(setup, conninfo, workers=workers, jobs=peer_jobs, warm=warm, seconds=seconds,
                                     say=say)
        say(json.dumps(report["peer"]))
    peer = report["peer"]["per_second"]
    report["ratios"] = {f"{t['mode']}_over_peer": round(t["per_second"] / peer, 3) if peer else None
                        for t in report["throughput"]}
    report["ratios"].update(cpu_ratios(report["throughput"], report["peer"]))
    without, with_hot = (f["quiet_delay_ms"]["p99"] for f in report["fairness"])
    report["ratios"]["fairness_p99_with_hot_over_without"] = round(with_hot / without, 2) if without else None
    return report


class Claims:
    """The `claims` subcommand of `manage.py bench` (registered in bench/management/commands/bench.py)."""

    name = "claims"
    help = ("Claim -> Runtime -> ApplicationResult throughput (single and batched claims) against procrastinate, "
            "and claim fairness with a 10x hot account, on a throwaway database (issue 18, goals 3 and 8).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--seconds", type=float, default=20.0, help="measured window per phase")
        parser.add_argument("--warm", type=float, default=3.0, help="untimed warm-up before each window")
        parser.add_argument("--accounts", type=int, default=5)
        parser.add_argument("--backlog", type=int, default=4000, help="ready Executions seeded per throughput mode")
        parser.add_argument("--batch", type=int, default=10)
        parser.add_argument("--peer-jobs", type=int, default=40000)
        parser.add_argument("--fair-backlog", type=int, default=60, help="per quiet account; the hot one gets 10x")
        parser.add_argument("--modes", default="",
                            help="comma-separated: single,batch (default: single,batch)")
        parser.add_argument("--database-name", default="connector_bench_claims")
        parser.add_argument("--keep", action="store_true")
        parser.add_argument("--json", default="", help="write the report to this file")
        parser.add_argument("--check", action="store_true",
                            help=f"fail unless the batched mode's busy CPU per completion is <= {CPU_GOAL:g}x "
                                 "procrastinate's per job (issue 18 goal 4)")

    def handle(self, command, options: dict) -> None:
        report = run_claims(workers=options["workers"], seconds=options["seconds"], warm=options["warm"],
                            accounts=options["accounts"], backlog=options["backlog"], batch=options["batch"],
                            peer_jobs=options["peer_jobs"], fair_backlog=options["fair_backlog"],
                            modes=tuple(m for m in options["modes"].split(",") if m) or None,
                            database=options["database_name"], keep=options["keep"], say=command.progress)
        for line in cpu_lines(report):
            command.progress(line)
        text = json.dumps(report, indent=2)
        if options["json"]:
            with open(options["json"], "w", encoding="utf-8") as fh:
                fh.write(text)
        command.stdout.write(text)
        if options["check"]:
            problem = cpu_check(report)
            if problem:
                from django.core.management.base import CommandError

                raise CommandError(problem)
            command.stdout.write(command.style.SUCCESS(
                f"\ncheck passed: batch busy CPU per completion / procrastinate "
                f"{report['ratios']['batch_cpu_over_peer']} <= {CPU_GOAL:g}"))
