"""`manage.py bench hot-account`: capacity of the complete transaction mix against ONE account (CV2-14-001..004,
CV2-14-008), on PostgreSQL, with a raw psycopg baseline and a procrastinate peer baseline.

For each client count N the run spawns N client processes (multiprocessing, 'spawn' context, each with its own
database connection). Each loops over the complete mix for one account of the demo world (push=True) for a fixed
duration:

  transport_admission     receipt_admit of a fresh key (1-event webhook body)
  materialization         receipt_materialize of that Receipt
  lane_advance            lane_advance of the new lane (mints the Execution)
  execution_claim         execution_claim for the account (FOR UPDATE SKIP LOCKED)
  runtime_completion      execution_run: Runtime applies the record and authors the outbound command, then the
                          result is recorded (lane high-water advances)
  outbound_authoring      the authoring call inside Runtime's transaction (timed inside runtime_completion)
  effect_claim            effect_claim for the account
  permit_acquire          DispatchPermit acquisition (guard + credential dispatch gate FOR SHARE)
  egress_send             the sole egress adapter: granted -> sending, HTTP to the loopback receiver, settlement
  permit_settlement       permit_settle (timed inside egress_send)
  effect_finalize         remote_confirmed -> finalized with the RemoteLink
  replay_admission        every 2nd round (about every 20th operation): replay_request_admit of an already-
                          completed event
  replay_materialization  its receipt_materialize
  permit_abandon          only when egress refused a granted permit (revocation fenced it out)

One control process meanwhile revokes and re-enables the outbound credential generation (credential_revoke,
credential_reenable) and runs a halt cycle (halt_v2, confirm_halted retried until the open-permit set is empty,
resume_predecessor). Operations refused because of those (GateNotServing, PermitRefused, EgressRefused, and
claims that found nothing while the gate was not serving) are availability rejections, counted per class; work a
client could not finish is retried after the gate serves again.

Gate-lock wait is measured in the processes by wrapping connector.locks.serving_for_share (the guard's one
round trip) / epoch_for_share / gate_for_update (and, separately, the credential dispatch gate's share/update locks) with timers: the time of
those locking statements, summed per operation (nested operations count it in both). The product is unchanged.

After the mix, the same N processes run a product admission-only phase, then the raw baseline (the serving
guard's lock-insert-update shape in psycopg 3 without Django, on `raw_` tables) and then the peer baseline
(procrastinate deferring and working as many trivial jobs as the product completed executions).
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from bench import BUDGETS_PATH, load_budgets
from bench.cpu import busy_percent, cpu_sample
from bench.hot_client import BATCH_EVENTS, BATCH_GOAL_EVENTS_PER_S, process_setup
from bench.hot_pool import Pool, _conninfo
from bench.hot_raw import PEER_QUEUE_PREFIX, analyze, peer_schema_apply, raw_schema_create, raw_schema_drop
from bench.hot_recorder import REPLAY_EVERY, Progress, _r, percentiles, summarize_classes, unaccounted_rejections
from bench.hot_report import (_state_check, _stats_ms, _world_facts, budgets_from_reports, check_report, format_report,
                               machine_facts, write_budget_section)
from bench.options import integer_list


DEFAULT_DATABASE = "connector_bench_hot"


def run_hot_account(*, account_key: str, clients: Sequence[int], seconds: float, raw_seconds: float,
                    peer: bool = True, shared_counter: bool = False, progress: Progress | None = None,
                    warm_rounds: int = 2, drop_raw: bool = False, replay_every: int = REPLAY_EVERY,
                    batch_events: int = BATCH_EVENTS, batch_seconds: float | None = None, drills: int = 1,
                    product: dict | None = None, classic: bool = True, profile_dir: str | None = None,
                    analyze_first: bool = True) -> dict:
    """Run the bench on the current `default` database (which must hold the push demo world with `account_key`
    v2_serving). Returns the report dict. The loopback receiver runs in this process."""
    from django.conf import settings
    from django.db import connections

    from tests.effects.receiver import Receiver

    say = progress or (lambda _msg: None)
    clients = sorted({int(c) for c in clients})
    if (not clients and not batch_events) or (clients and clients[0] < 1):
        raise ValueError("clients must be positive")
    facts = _world_facts(account_key)
    if facts["gate_mode"] != "v2_serving":
        raise ValueError(f"account {account_key} gate is {facts['gate_mode']}, not v2_serving")
    default, journal = connections["default"].settings_dict, connections["journal"].settings_dict
    conninfo = _conninfo(default)
    receiver = Receiver().start()
    saved_connector = settings.CONNECTOR
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": receiver.url}
    setup = process_setup(receiver.url)
    report = {"bench": "hot-account", "account_key": account_key, "database": default["NAME"],
              "clients": clients, "seconds": seconds, "raw_seconds": raw_seconds, "machine": machine_facts(),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": []}
    peer_reason = ""
    if peer:
        logging.getLogger("procrastinate").setLevel(logging.WARNING)
        try:
            peer_schema_apply(conninfo)
        except Exception as exc:  # noqa: BLE001 - reported, never invented
            peer_reason = f"procrastinate schema could not be applied: {type(exc).__name__}: {exc}"[:300]
    else:
        peer_reason = "not requested (--no-peer)"
    raw_schema_create(conninfo, max(clients, default=1))
    control = max(clients, default=0)
    plan = {}
    if product:  # the product mode's worker processes follow the control process (bench/mix_product.py)
        from bench.mix_product_run import worker_plan

        slots = max(1, min(int(settings.CONNECTOR.get("MATERIALIZE_SLOTS", 2)), product["workers"]["materialize"]))
        plan = worker_plan(product["workers"], control + 1, slots)
    pool = Pool(control + 1 + len(plan), setup, say, shared=slots if product else 0)
    run_tag = f"{int(time.time() * 1000):x}"
    try:
        base = {"account_id": facts["account_id"], "account_key": account_key, "replay_every": replay_every}
        if clients:
            say(f"warming up: {warm_rounds} untimed rounds per client process")
            pool.run({i: {**base, "kind": "warm", "rounds": warm_rounds, "tag": f"{run_tag}-w",
                      "role": "control" if i == control else "client"} for i in range(control + 1)},
                     timeout=120 + 10 * warm_rounds, what="warm-up")
        if product:
            from bench.mix_product_run import run_product_phase

            product_args = {"control": control, "plan": plan, "base": base, "facts": facts, "conninfo": conninfo,
                            "databases": [default["NAME"], journal["NAME"]], "receiver": receiver,
                            "shared": pool.shared, "say": say}
            per_client = int(product.get("inflight_per_client", 8))
            say("warming up the product mode: 3 untimed seconds")
            run_product_phase(pool, n=max(clients), seconds=3.0, tag=f"{run_tag}-pw", drills=0, profile_dir=None,
                              inflight=per_client * max(clients), **product_args)
        if analyze_first:
            analyze(conninfo, say)
        report["analyzed_after_warm_up"] = analyze_first
        for n in clients:
            # The product mode first: the classic mix's admission-only phase leaves its receipts due, and the
            # product's materializers would take them (the settle step drains what a previous client count left).
            measured = None
            if product:
                measured = run_product_phase(pool, n=n, seconds=seconds, tag=f"{run_tag}-p{n}", drills=drills,
                                             profile_dir=profile_dir, inflight=per_client * n, **product_args)
                measured["state_problems"] = _state_check(account_key)
            if classic:
                run = _run_clients(pool, n, control, base, facts, seconds, raw_seconds, conninfo, f"{run_tag}-n{n}",
                                   peer and not peer_reason, peer_reason, shared_counter, say, drills=drills,
                                   profile_dir=profile_dir, databases=[default["NAME"], journal["NAME"]])
                run["state_problems"] = _state_check(account_key)
            else:
                run = {"clients": n, "seconds": seconds, "classic": False}
            if measured is not None:
                run["product"] = measured
            report["runs"].append(run)
        if batch_events:
            report["batch_receipt"] = _run_batch(pool, base, batch_events, batch_seconds or raw_seconds,
                                                 f"{run_tag}-batch", say)
            report["batch_receipt"]["state_problems"] = _state_check(account_key)
    finally:
        pool.close()
        receiver.stop()
        settings.CONNECTOR = saved_connector
        if drop_raw:
            raw_schema_drop(conninfo)
    report["receiver"] = {"requests": len(receiver.requests), "logical_effects_applied": receiver.applied_total()}
    report["load_average"] = [round(v, 2) for v in os.getloadavg()]
    return report


def _run_clients(pool: Pool, n: int, control: int, base: dict, facts: dict, seconds: float, raw_seconds: float,
                 conninfo: str, tag: str, peer: bool, peer_reason: str, shared_counter: bool, say: Progress,
                 drills: int = 1, profile_dir: str | None = None, databases: Sequence[str] = ()) -> dict:
    lead = 0.3  # seconds for the commands to reach the processes before the common start time
    start = time.time() + lead
    deadline = start + seconds
    hold = max(0.2, 0.05 * seconds) if drills == 1 else max(0.05, min(0.05 * seconds, 0.1 * seconds / drills))
    say(f"{n} client(s): complete mix for {seconds:g} s (control: revocation at 25%, halt at 55%"
        + (f" of each of {drills} periods" if drills > 1 else "") + f", hold {hold:g} s)")
    commands = {i: {**base, "kind": "mix", "tag": tag, "start_at": start, "deadline": deadline} for i in range(n)}
    commands[control] = {**base, "kind": "control", "start_at": start, "deadline": deadline, "seconds": seconds,
                         "hold": hold, "credential_generation": facts["credential_generation"], "drills": drills}
    if profile_dir:
        commands[0]["profile"] = str(Path(profile_dir) / "classic-client0.prof")
    from bench.mix_product import measure_cpu

    pids = {pool.processes[i].pid: "client" for i in range(n)}
    pids.update({pool.processes[control].pid: "control", os.getpid(): "bench+receiver"})
    roles_cpu = measure_cpu(conninfo, list(databases), pids, start, deadline) if databases else None
    cpu_before = cpu_sample()
    results = pool.run(commands, timeout=seconds + lead + 120, what=f"mix with {n} clients")
    cpu_after = cpu_sample()  # includes the clients' untimed drain (a few ms to a few s)
    if roles_cpu:
        roles_cpu["thread"].join(timeout=30)
    ctrl = results.pop(control)
    records = [r for res in results.values() for r in res["records"]] + ctrl["records"]
    classes = summarize_classes(records, seconds)
    unaccounted = unaccounted_rejections(records, ctrl["windows"])
    lock_p99 = max((c["lock_wait_p99_ms"] for c in classes.values()), default=0.0)
    starving = max(classes.items(), key=lambda kv: kv[1]["max_ms"])
    run = {
        "clients": n, "seconds": seconds, "rounds": sum(res["rounds"] for res in results.values()),
        "left_pending": sum(res["left_pending"] for res in results.values()),
        "load_average": round(os.getloadavg()[0], 2), "classes": classes,
        "machine_cpu_busy_pct": busy_percent(cpu_before, cpu_after),
        "client_cpu_seconds": _r(sum(res["cpu_seconds"] for res in results.values()), 3),
        "statements_client0": results[0].get("statements") or {},
        "control": {"windows": [[w[0], _r(w[1] - start, 3), _r(w[2] - start, 3)] for w in ctrl["windows"]],
                    "confirm_halted_attempts": ctrl["confirm_attempts"],
                    "halt_drain_ms": _r(ctrl["drain_ms"]) if ctrl["drain_ms"] is not None else None,
                    "problems": ctrl["problems"], "hold_seconds": hold, "drills": drills},
        "totals": {
            "deadlocks": sum(c["deadlocks"] for c in classes.values()),
            "retries": sum(c["retries"] for c in classes.values()),
            "errors": sum(c["errors"] for c in classes.values()),
            "rejections": sum(c["rejections_total"] for c in classes.values()),
            "unaccounted_rejections": len(unaccounted), "unaccounted_samples": unaccounted[:5],
            "lock_wait_p99_ms": lock_p99,
            "starvation_ms": starving[1]["max_ms"], "starvation_class": starving[0],
        },
    }
    if roles_cpu:
        from bench.mix_product import per_completion

        run["cpu"] = roles_cpu.get("result")
        run["cpu_per_completion_ms"] = per_completion(run["cpu"], classes["effect_finalize"]["count"])
    # product admission alone, then the raw baseline, over the same N processes
    start = time.time() + lead
    say(f"{n} client(s): product admission only for {raw_seconds:g} s")
    adm = pool.run({i: {**base, "kind": "admission", "tag": tag, "start_at": start, "deadline": start + raw_seconds}
                    for i in range(n)}, timeout=raw_seconds + lead + 60, what="admission-only")
    run["admission_only"] = _stats_ms([x for res in adm.values() for x in res["latencies"]], raw_seconds)
    run["admission_only"]["failures"] = sum(res["failures"] for res in adm.values())
    start = time.time() + lead
    say(f"{n} client(s): raw psycopg baseline for {raw_seconds:g} s")
    raw = pool.run({i: {"kind": "raw", "tag": tag, "conninfo": conninfo, "start_at": start,
                        "deadline": start + raw_seconds, "shared_counter": shared_counter} for i in range(n)},
                   timeout=raw_seconds + lead + 60, what="raw baseline")
    run["raw"] = _stats_ms([x for res in raw.values() for x in res["latencies"]], raw_seconds)
    run["raw"].update({k: sum(res[k] for res in raw.values()) for k in ("deadlocks", "races", "failures")})
    run["raw"]["counter"] = "one shared row" if shared_counter else "one row per client"
    completions = classes["runtime_completion"]["count"]
    run["peer"] = _run_peer(pool, n, conninfo, completions, tag, say) if peer else {
        "available": False, "reason": peer_reason}
    mix_adm = classes["transport_admission"]["throughput"]
    raw_tp = run["raw"]["throughput"]
    run["ratios"] = {
        "admission_mix_over_raw": _r(mix_adm / raw_tp, 4) if raw_tp else None,
        "admission_only_over_raw": _r(run["admission_only"]["throughput"] / raw_tp, 4) if raw_tp else None,
        "claim_to_completion_over_peer": (_r(classes["runtime_completion"]["throughput"]
                                             / run["peer"]["throughput"], 4)
                                          if run["peer"].get("available") and run["peer"]["throughput"] else None),
    }
    busy = sum(classes[c]["mean_ms"] for c in ("lane_advance", "execution_claim", "runtime_completion"))
    run["ratios"]["product_execution_busy_ms"] = _r(busy)
    if run["peer"].get("available"):
        run["ratios"]["peer_job_busy_ms"] = _r(n * run["peer"]["seconds"] * 1000 / max(1, run["peer"]["jobs"]))
    return run


def _run_batch(pool: Pool, base: dict, events: int, seconds: float, tag: str, say: Progress) -> dict:
    """The "batch receipt" phase (issue 18, goal 2): one client admits and materializes `events`-event receipts
    for `seconds`; events/s over the phase, and each receipt's admission + materialization latency."""
    say(f"1 client: batch receipts of {events} events (admitted and materialized) for {seconds:g} s")
    res = pool.run({0: {**base, "kind": "batch", "tag": tag, "events": events, "seconds": seconds}},
                   timeout=seconds + 180, what="batch receipts")[0]
    elapsed = res["ended"] - res["began"]  # the last receipt may finish after the deadline
    out = {"clients": 1, "events_per_receipt": events, "seconds": _r(elapsed, 3), "receipts": len(res["latencies"]),
           "events": res["events"], "failures": res["failures"],
           "events_per_s": _r(res["events"] / elapsed if elapsed else 0.0, 1),
           "goal_events_per_s": BATCH_GOAL_EVENTS_PER_S}
    out["receipt_ms"] = percentiles(res["latencies"]) if res["latencies"] else {}
    return out


def _run_peer(pool: Pool, n: int, conninfo: str, jobs: int, tag: str, say: Progress) -> dict:
    import psycopg

    if jobs < 1:
        return {"available": False, "reason": "the product completed no execution to match"}
    shares = [jobs // n + (1 if i < jobs % n else 0) for i in range(n)]
    queue_name = f"{PEER_QUEUE_PREFIX}{tag.replace('-', '_')}"[:60]
    say(f"{n} client(s): procrastinate peer baseline, {jobs} jobs")
    start = time.time() + 1.0
    try:
        results = pool.run({i: {"kind": "peer", "conninfo": conninfo, "queue": queue_name, "jobs": shares[i],
                                "start_at": start} for i in range(n)}, timeout=300, what="peer baseline")
    except RuntimeError as exc:
        return {"available": False, "reason": f"procrastinate failed: {str(exc).strip().splitlines()[-1][:300]}"}
    ended = max(res["ended"] for res in results.values())
    with psycopg.connect(conninfo) as conn:
        done = conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s AND status = 'succeeded'",
                            [queue_name]).fetchone()[0]
    seconds = ended - start
    defer_s = max(res["deferred"] for res in results.values()) - start
    out = {"available": True, "jobs": jobs, "succeeded": done, "workers": n, "seconds": _r(seconds, 3),
           "throughput": _r(done / seconds if seconds else 0.0), "defer_seconds": _r(defer_s, 3)}
    if done != jobs:
        out.update(available=False, reason=f"procrastinate worked {done} of {jobs} jobs")
    return out


# =================================================================================================================
# the subcommand
# =================================================================================================================


class HotAccount:
    """`bench hot-account`: registered in bench/management/commands/bench.py's SUBCOMMANDS."""

    name = "hot-account"
    help = ("Throughput, latency, gate-lock wait, deadlocks, retries, availability rejections and starvation of the "
            "complete transaction mix against one account, for each client count, with a raw psycopg baseline and "
            "a procrastinate peer baseline, on a throwaway database.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--clients", default="1,2,4,8", help="client process counts (default 1,2,4,8)")
        parser.add_argument("--seconds", type=float, default=20.0, help="duration of each mix run (default 20)")
        parser.add_argument("--raw-seconds", type=float, default=None,
                            help="duration of the admission-only and raw baseline phases (default: half of "
                                 "--seconds, at least 2, at most 10)")
        parser.add_argument("--quick", action="store_true",
                            help="1 and 2 clients, 5 s each, 3 s baselines (for `make bench`)")
        parser.add_argument("--no-peer", action="store_true", help="skip the procrastinate peer baseline")
        parser.add_argument("--no-analyze", action="store_true",
                            help="do not ANALYZE after the warm-up: measure the planner of a freshly built database "
                                 "that autovacuum has not analyzed yet (what every run measured before D-403)")
        parser.add_argument("--batch-events", type=int, default=BATCH_EVENTS,
                            help=f"events per receipt of the batch receipt phase (default {BATCH_EVENTS}; 0 skips it)")
        parser.add_argument("--batch-only", action="store_true",
                            help="run only the batch receipt phase (no mix, baselines or peer)")
        parser.add_argument("--batch-seconds", type=float, default=None,
                            help="duration of the batch receipt phase (default: that of the admission-only phase)")
        parser.add_argument("--shared-counter", action="store_true",
                            help="raw baseline: all clients update one counter row (default: one row per client)")
        parser.add_argument("--json", metavar="FILE", help="write the JSON report to FILE")
        parser.add_argument("--check", action="store_true",
                            help="exit non-zero naming every figure that breaks the hot_account budget")
        parser.add_argument("--budgets", metavar="PATH", default=str(BUDGETS_PATH),
                            help="budget file (default bench/budgets.json)")
        parser.add_argument("--from-json", metavar="FILE", action="append", default=[],
                            help="do not run: print (and --check) a saved report; repeatable with --write-budgets")
        parser.add_argument("--write-budgets", action="store_true",
                            help="derive the hot_account budget section from this run (or the --from-json "
                                 "reports) and write it to --budgets, keeping the other sections")
        parser.add_argument("--database-name", default=DEFAULT_DATABASE,
                            help=f"throwaway database (default {DEFAULT_DATABASE}; <name>_journal too)")
        parser.add_argument("--keep", action="store_true", help="keep the throwaway databases afterwards")
        parser.add_argument("--drills", type=int, default=1,
                            help="control drills per mix run: the run is cut into this many periods, each with a "
                                 "credential revocation and a halt cycle, so the control transitions' p99 rests on "
                                 "as many samples (default 1)")
        parser.add_argument("--product", action="store_true",
                            help="after the classic mix of each client count, the product mode: the clients only "
                                 "admit, worker processes run the product's batched worker steps until each "
                                 "event's effect is finalized (bench/mix_product.py; issue 20, goal 2)")
        parser.add_argument("--product-only", action="store_true",
                            help="the product mode alone (no classic mix, no baselines)")
        parser.add_argument("--product-workers", default="materialize=2,claims=2,egress=2",
                            help="worker processes per role of the product mode (default as make run on 2 cores)")
        parser.add_argument("--inflight", type=int, default=8,
                            help="product mode: events each client may have admitted and not yet finalized "
                                 "(default 8; the window is clients x this)")
        parser.add_argument("--profile", metavar="DIR",
                            help="cProfile client 0 of the classic mix (and count its statements by class) and the "
                                 "first process of each product-mode role; .prof files written to DIR")
        parser.add_argument("--chart", metavar="FILE",
                            help="draw the report's chart (throughput, ratios and control p99 by client count) to "
                                 "FILE (.svg or .png), from the report's JSON alone (bench/chart.py)")
        parser.add_argument("--table", action="store_true",
                            help="print the scaling table (Markdown, one row per client count) after the report")

    def handle(self, command, options: dict) -> None:
        from django.core.management.base import CommandError

        say = command.progress
        if options["from_json"]:
            reports = [json.loads(Path(p).read_text(encoding="utf-8")) for p in options["from_json"]]
        else:
            reports = [self._run(options, say)]
        report = reports[-1]
        if options["json"] and not options["from_json"]:
            Path(options["json"]).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            say(f"report written to {options['json']}")
        command.stdout.write(format_report(report))
        if options["table"]:
            from bench.chart import scaling_table

            command.stdout.write(scaling_table(report))
        if options["chart"]:
            from bench.chart import draw

            try:
                say(f"chart written to {draw(report, Path(options['chart']))}")
            except ValueError as exc:
                raise CommandError(f"--chart: {exc}") from exc
        if options["write_budgets"]:
            write_budget_section(Path(options["budgets"]), budgets_from_reports(reports))
            say(f"hot_account budgets written to {options['budgets']}")
        if options["check"]:
            try:
                budgets = load_budgets(options["budgets"])
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot read the budget file {options['budgets']}: {exc}") from exc
            failures = check_report(report, budgets)
            if failures:
                raise CommandError("hot-account budget broken:\n  " + "\n  ".join(failures))
            command.stdout.write(command.style.SUCCESS(
                f"check passed: every budgeted figure within {options['budgets']}"))

    def _run(self, options: dict, say: Progress) -> dict:
        from django.core.management.base import CommandError
        from django.db import connections

        from connector.demo import build_world
        from bench.databases import NAME_RE, ThrowawayDatabases

        clients = [1, 2] if options["quick"] else integer_list(options["clients"], "--clients", low=1, high=32,
                                                               needs="--clients needs client counts between 1 and 32")
        if options["batch_only"]:
            if not options["batch_events"]:
                raise CommandError("--batch-only needs --batch-events above 0")
            clients = []
        seconds = 5.0 if options["quick"] else options["seconds"]
        raw_seconds = options["raw_seconds"] or (3.0 if options["quick"] else min(10.0, max(2.0, seconds / 2)))
        if seconds < 1 or raw_seconds < 0.5:
            raise CommandError("--seconds must be at least 1 and --raw-seconds at least 0.5")
        if options["drills"] < 1 or seconds / options["drills"] < 1:
            raise CommandError("--drills must be at least 1 and leave each drill period at least 1 s of --seconds")
        product = None
        if options["product"] or options["product_only"]:
            from bench.mix_product_run import parse_workers

            try:
                workers = parse_workers(options["product_workers"])
            except ValueError as exc:
                raise CommandError(str(exc)) from exc
            if not 1 <= options["inflight"] <= 1000:
                raise CommandError("--inflight must be between 1 and 1000")
            product = {"workers": workers, "inflight_per_client": options["inflight"]}
        if options["profile"]:
            Path(options["profile"]).mkdir(parents=True, exist_ok=True)
        name = options["database_name"]
        if not NAME_RE.match(name) or not NAME_RE.match(f"{name}_journal"):
            raise CommandError(f"--database-name {name!r} must match {NAME_RE.pattern}")
        quiet = options["verbosity"] < 2
        connector_log = logging.getLogger("connector")
        saved_level = connector_log.level
        if quiet:
            connector_log.setLevel(logging.WARNING)
        try:
            with ThrowawayDatabases([name], f"{name}_journal", keep=options["keep"], say=say) as databases:
                connections["default"] = databases.wrappers[name]
                say(f"database {name}: building the demo world (push=True) through the services")
                account_key = build_world("", push=True).accounts[0].account_key
                connections["default"].close()
                report = run_hot_account(account_key=account_key, clients=clients, seconds=seconds,
                                         raw_seconds=raw_seconds, peer=not (options["no_peer"] or options["batch_only"]),
                                         shared_counter=options["shared_counter"], progress=say,
                                         batch_events=options["batch_events"],
                                         batch_seconds=options["batch_seconds"], drills=options["drills"],
                                         product=product, classic=not options["product_only"],
                                         profile_dir=options["profile"],
                                         analyze_first=not options["no_analyze"])
        finally:
            connector_log.setLevel(saved_level)
        flags = ["--quick"] if options["quick"] else [
            f"--clients {','.join(map(str, clients))}", f"--seconds {seconds:g}", f"--raw-seconds {raw_seconds:g}"]
        flags += [f"--{k.replace('_', '-')}" for k in ("no_peer", "shared_counter", "batch_only", "product",
                                                       "product_only", "no_analyze") if options[k]]
        if product:
            flags += [f"--product-workers {options['product_workers']}", f"--inflight {options['inflight']}"]
        if options["batch_events"] != BATCH_EVENTS:
            flags.append(f"--batch-events {options['batch_events']}")
        if options["batch_seconds"]:
            flags.append(f"--batch-seconds {options['batch_seconds']:g}")
        if options["drills"] != 1:
            flags.append(f"--drills {options['drills']}")
        report["command"] = "manage.py bench hot-account " + " ".join(flags)
        return report
