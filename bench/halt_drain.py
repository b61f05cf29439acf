"""`manage.py bench halt-drain`: how long after the last open permit of a halting gate settles does
`confirm_halted` commit (issue 20, goal 5: <= 200 ms p99 at 8 clients; D-380..D-387).

On a throwaway database with the demo push world and ONE account, `--effects` effects are authored up front
(`bench.outbound.author_effects`, untimed). `--clients` spawned egress processes then run the real batched
dispatch step (`effects.services.worker.effect_dispatch_batch`) against a loopback receiver answering at once
(or after `--service-ms`), and keep stepping through the halts (a refused claim writes nothing; the process
pauses `--refusal-pause-ms` and steps again). One more spawned process, the control, runs `--drills` drills, one
per `--period` seconds: at 60 % of its period it commits `halt_v2`, then waits until `confirm_halted` commits
(`wait_halted`, or, where the code has none, main's loop: `confirm_halted` retried every `--poll-ms`), then
`resume_predecessor`. Every confirm attempt is timed in the control (start, end, outcome).

The figure, from PostgreSQL's stored timestamps after the run (both are `timezone.now()` taken inside their
transaction, just before its COMMIT; PostgreSQL's commit timestamps are not tracked on this server):
  reference = max(the halt's audit row `at`, the largest `closed_at` of the gate's permits not after the
              confirm's audit row `at`): the moment the last open permit settled, or the halt if none was open;
  settle -> halted = the `gate_confirm_halted` audit row's `at` - reference.
The control's own clock gives an upper bound beside it (the confirm call returned, after its COMMIT).
`--check` compares p99 with bench/budgets.json "halt_drain" (the goal as a ceiling).
"""
from __future__ import annotations

import json
import os
import statistics
import time
import traceback

from bench.options import report_arguments, report_of, save_and_check

DEFAULT_DATABASE = "connector_bench_halt_drain"


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))], 1)


def _worker_main(index: int, setup: dict, command: dict, inbox, out) -> None:
    try:
        from bench.claims import _bootstrap

        _bootstrap(setup)
        import logging

        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
        from django.db import connection

        connection.ensure_connection()
        if command["kind"] == "control":
            with connection.cursor() as cursor:  # named, so --sample can find its backend
                cursor.execute("SET application_name = 'bench-halt-control'")
        out.put(("ready", index, None))
        timing = inbox.get()
        command = {**command, "start_at": timing["start_at"]}
        result = (_control if command["kind"] == "control" else _egress)(index, command)
        out.put(("ok", index, result))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put(("failed", index, traceback.format_exc()))


def _sleep_until(at: float) -> None:
    delay = at - time.time()
    if delay > 0:
        time.sleep(delay)


def _egress(index: int, command: dict) -> dict:
    """The real batched dispatch step until the stop time; through the halts too."""
    from django.db import connections

    from effects.services import worker

    name, size = f"bench-halt-{index}-{os.getpid()}", worker.egress_batch_size()
    pause = command["refusal_pause_ms"] / 1000
    done = empty = 0
    _sleep_until(command["start_at"])
    try:
        while time.time() < command["stop_at"]:
            step = len(worker.effect_dispatch_batch(n=size, holder_name=name))
            if step:
                done += step
                continue
            empty += 1
            time.sleep(pause)
    finally:
        connections.close_all()
    return {"dispatched": done, "empty_steps": empty}


def _confirm_waiter():
    """The product's settlement-driven confirm where the code has one, else None (main: the poll below)."""
    try:
        from connector.services.halt_wait import wait_halted
    except ImportError:  # main before D-380
        return None
    return wait_halted


def _control(index: int, command: dict) -> dict:
    from connector.actors import Actor
    from connector.errors import TransitionRefused
    from connector.services.gates import gate_transition

    actor, account_id = Actor.system("bench-halt-drain"), command["account_id"]
    waiter = None if command["method"] == "poll" else _confirm_waiter()
    period, drills, attempts, problems = command["period"], [], [], []
    for k in range(command["drills"]):
        _sleep_until(command["start_at"] + k * period + 0.6 * period)
        began = time.time()
        gate_transition(account_id=account_id, action="halt_v2", expected_fence=None, actor=actor,
                        reason="bench halt-drain")
        halted, tries = time.time(), 0
        if waiter is not None:
            info = waiter(account_id=account_id, actor=actor, reason="bench halt-drain: open-permit set empty",
                          timeout=30.0)
            tries = info.get("attempts", 1)
            attempts.append([k, info.get("woken_at") or halted, time.time(), "ok", tries])
        else:
            while True:
                tries += 1
                t0 = time.time()
                try:
                    gate_transition(account_id=account_id, action="confirm_halted", expected_fence=None,
                                    actor=actor, reason="bench halt-drain: open-permit set empty")
                    attempts.append([k, t0, time.time(), "ok", tries])
                    break
                except TransitionRefused:
                    attempts.append([k, t0, time.time(), "refused", tries])
                if time.time() - halted > 30:
                    problems.append(f"drill {k}: confirm_halted refused for 30 s")
                    break
                time.sleep(command["poll_ms"] / 1000)
        confirmed = time.time()
        gate_transition(account_id=account_id, action="resume_predecessor", expected_fence=None, actor=actor,
                        reason="bench halt-drain: resume")
        drills.append({"k": k, "halt_called": began, "halt_returned": halted, "confirm_returned": confirmed,
                       "tries": tries, "woken_at": info.get("woken_at") if waiter is not None else None,
                       "last_attempt_started": attempts[-1][1] if attempts else None})
    return {"drills": drills, "attempts": attempts, "problems": problems,
            "method": "poll" if waiter is None else waiter.__module__ + "." + waiter.__name__}


def drill_figures(conninfo: str, gate_pk: int, drills: list[dict]) -> list[dict]:
    """Per drill, from the stored timestamps (see the module docstring)."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        audit = conn.execute(
            "SELECT action, extract(epoch FROM at)::float8 FROM connector_auditrecord "
            "WHERE entity_type = 'connector.AccountServingGate' AND entity_id = %s "
            "AND action IN ('gate_halt_v2', 'gate_confirm_halted') ORDER BY at, id", [str(gate_pk)]).fetchall()
        halts = [at for action, at in audit if action == "gate_halt_v2"]
        confirms = [at for action, at in audit if action == "gate_confirm_halted"]
        out = []
        for k, (halt_at, confirm_at) in enumerate(zip(halts, confirms)):
            last, open_at_halt, after = conn.execute(
                "SELECT extract(epoch FROM max(closed_at) FILTER (WHERE closed_at <= to_timestamp(%(c)s)))::float8,"
                " count(*) FILTER (WHERE granted_at <= to_timestamp(%(h)s) AND (closed_at IS NULL"
                "  OR closed_at > to_timestamp(%(h)s))),"
                " count(*) FILTER (WHERE granted_at < to_timestamp(%(c)s) AND closed_at > to_timestamp(%(c)s))"
                " FROM effects_dispatchpermit WHERE gate_id = %(g)s",
                {"c": confirm_at, "h": halt_at, "g": gate_pk}).fetchone()
            reference = max(halt_at, last or halt_at)
            row = {"k": k, "open_at_halt": open_at_halt, "closed_after_confirm": after,
                   "halt_to_last_settled_ms": round((reference - halt_at) * 1000, 1),
                   "settle_to_halted_ms": round((confirm_at - reference) * 1000, 1)}
            if k < len(drills):
                d = drills[k]
                row["settle_to_returned_ms"] = round((d["confirm_returned"] - reference) * 1000, 1)
                row["tries"] = d["tries"]
                # Where the time goes: the settlement's own commit and the wake-up (woken by its notification,
                # or the poll's last attempt starting), then the confirm transaction up to its audit row.
                started = d.get("woken_at") or d.get("last_attempt_started")
                if started:
                    row["settle_to_confirm_start_ms"] = round((started - reference) * 1000, 1)
                    row["confirm_start_to_halted_ms"] = round((confirm_at - started) * 1000, 1)
            out.append(row)
    return out


def summarize(figures: list[dict], attempts: list[list]) -> dict:
    drained = [f for f in figures if f["open_at_halt"]]

    def stats(rows, key):
        values = [r[key] for r in rows if r.get(key) is not None]
        return {"n": len(values), "p50": _pct(values, 0.5), "p90": _pct(values, 0.9), "p99": _pct(values, 0.99),
                "max": round(max(values), 1) if values else None,
                "mean": round(statistics.fmean(values), 1) if values else None}

    per_attempt = {}
    for outcome in ("ok", "refused"):
        ms = [(a[2] - a[1]) * 1000 for a in attempts if a[3] == outcome]
        per_attempt[outcome] = {"n": len(ms), "p50": _pct(ms, 0.5), "p99": _pct(ms, 0.99)}
    return {"settle_to_halted_ms": stats(figures, "settle_to_halted_ms"),
            "settle_to_halted_ms_drills_with_open_permits": stats(drained, "settle_to_halted_ms"),
            "settle_to_returned_ms": stats(figures, "settle_to_returned_ms"),
            "halt_to_last_settled_ms": stats(figures, "halt_to_last_settled_ms"),
            "settle_to_confirm_start_ms": stats(figures, "settle_to_confirm_start_ms"),
            "confirm_start_to_halted_ms": stats(figures, "confirm_start_to_halted_ms"),
            "tries": stats(figures, "tries"), "confirm_attempt_ms": per_attempt,
            "closed_after_confirm": sum(f["closed_after_confirm"] for f in figures)}


def run_halt_drain(*, clients: int, drills: int, period: float, effects: int, poll_ms: float,
                   refusal_pause_ms: float, service_ms: float, method: str, database: str, keep: bool,
                   sample: bool = False, say=print) -> dict:
    from django.conf import settings
    from django.db import connections

    from bench.claims import _run_workers
    from bench.hot_pool import _conninfo
    from bench.databases import ThrowawayDatabases
    from bench.outbound import _world, author_effects
    from tests.effects.receiver import Receiver

    report = {"bench": "halt-drain", "clients": clients, "drills": drills, "period": period, "poll_ms": poll_ms,
              "refusal_pause_ms": refusal_pause_ms, "service_ms": service_ms, "cpus": os.cpu_count(),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "load_average_start": [round(v, 2) for v in os.getloadavg()]}
    receiver = Receiver()
    receiver.service_seconds = service_ms / 1000
    receiver.start()
    try:
        with ThrowawayDatabases([database], f"{database}_journal", keep=keep, say=say) as dbs:
            connections["default"] = dbs.wrappers[database]
            default, journal = connections["default"].settings_dict, connections["journal"].settings_dict
            conninfo = _conninfo(default)
            setup = {"settings_module": os.environ.get("DJANGO_SETTINGS_MODULE") or settings.SETTINGS_MODULE,
                     "names": {"default": default["NAME"], "journal": journal["NAME"]},
                     "connector": {"EGRESS_BASE_URL": receiver.url, "EGRESS_TIMEOUT_SECONDS": 5,
                                   "SECRET_BACKEND_DIR": settings.CONNECTOR["SECRET_BACKEND_DIR"]}}
            world = _world(1)
            author_effects(world, effects, say)
            from connector.models import AccountServingGate

            account_id = world.accounts[0].pk
            gate_pk = AccountServingGate.objects.get(account_id=account_id).pk
            connections["default"].close()
            import psycopg

            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("ANALYZE effects_remoteeffect, effects_outboundcommand")
                # A lock wait longer than deadlock_timeout (1 s) is written to the server's log, with the
                # statement and who holds the lock (this throwaway database only; new sessions read it).
                conn.execute(f"ALTER DATABASE {default['NAME']} SET log_lock_waits = on")
            run = drills * period
            say(f"{clients} egress processes + 1 control, {drills} drills x {period:g} s")
            commands = [{"kind": "egress", "stop_at": 0, "refusal_pause_ms": refusal_pause_ms}
                        for _ in range(clients)]
            commands.append({"kind": "control", "account_id": account_id, "drills": drills, "period": period,
                             "poll_ms": poll_ms, "method": method})
            for c in commands[:-1]:
                c["run"] = run
            sampler = _Sampler(conninfo) if sample else None
            _, results = _run_workers(setup, commands, timeout=run + 120, target=_start_with_stop,
                                      on_start=sampler)
            if sampler is not None:
                report["control_backend_samples"] = sampler.stop()
            control = results[-1]
            report["method"] = control["method"]
            report["problems"] = control["problems"]
            report["dispatched"] = sum(r["dispatched"] for r in results[:-1])
            report["empty_steps"] = sum(r["empty_steps"] for r in results[:-1])
            report["figures"] = drill_figures(conninfo, gate_pk, control["drills"])
            report["attempts"] = control["attempts"]
    finally:
        receiver.stop()
    report["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    report["summary"] = summarize(report["figures"], report["attempts"])
    return report


class _Sampler:
    """--sample: the control's backend in pg_stat_activity every ~1 ms (a profile of where a confirm waits)."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo, self.counts, self.running = conninfo, {}, True
        self.thread = None

    def __call__(self, start_at: float, pids: list[int]) -> None:
        import threading

        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            while self.running:
                row = conn.execute(
                    "SELECT a.state, coalesce(a.wait_event_type, '-'), coalesce(a.wait_event, '-'), "
                    "left(a.query, 60), (SELECT string_agg(b.state || ': ' || left(b.query, 70), ' + ' "
                    "ORDER BY b.query) FROM pg_stat_activity b WHERE b.pid = ANY(pg_blocking_pids(a.pid))) "
                    "FROM pg_stat_activity a WHERE a.application_name = 'bench-halt-control'").fetchone()
                if row is not None:
                    key = " | ".join(row[:4]) + (f" <- blocked by {row[4]}" if row[4] else "")
                    self.counts[key] = self.counts.get(key, 0) + 1
                time.sleep(0.001)

    def stop(self) -> dict:
        self.running = False
        if self.thread is not None:
            self.thread.join(timeout=5)
        return dict(sorted(self.counts.items(), key=lambda kv: -kv[1])[:40])


def _start_with_stop(index: int, setup: dict, command: dict, inbox, out) -> None:
    """`_worker_main` with each egress process's stop time derived from the common start."""

    class _Inbox:
        def get(self_inner):
            timing = inbox.get()
            command["stop_at"] = timing["start_at"] + command.get("run", 0)
            return timing

    _worker_main(index, setup, command, _Inbox(), out)


def check_report(report: dict, budget: dict) -> list[str]:
    failures = []
    p99 = report["summary"]["settle_to_halted_ms"]["p99"]
    ceiling = budget.get("settle_to_halted_p99_ceiling_ms")
    if ceiling is not None and (p99 is None or p99 > ceiling):
        failures.append(f"settle -> halted p99 {p99} ms > {ceiling} ms (issue 20 goal 5)")
    least = budget.get("min_drills")
    if least is not None and report["summary"]["settle_to_halted_ms"]["n"] < least:
        failures.append(f"{report['summary']['settle_to_halted_ms']['n']} drills measured < {least} (--drills)")
    if report["summary"]["closed_after_confirm"]:
        failures.append(f"{report['summary']['closed_after_confirm']} permit(s) closed after the confirm")
    failures += report.get("problems", [])
    return failures


class HaltDrain:
    """`bench halt-drain`: registered in bench/management/commands/bench.py's SUBCOMMANDS."""

    name = "halt-drain"
    help = ("Last open permit settled -> confirm_halted committed, per halt drill, with --clients egress processes "
            "dispatching on the halted account (issue 20, goal 5).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--clients", type=int, default=8, help="egress processes on the one account")
        parser.add_argument("--drills", type=int, default=40)
        parser.add_argument("--period", type=float, default=1.0, help="seconds per drill (halt at 60 %%)")
        parser.add_argument("--effects", type=int, default=12000, help="effects authored up front")
        parser.add_argument("--poll-ms", type=float, default=10.0, help="the poll's pause between confirm attempts")
        parser.add_argument("--refusal-pause-ms", type=float, default=5.0,
                            help="an egress process's pause after a step that found nothing (or was refused)")
        parser.add_argument("--service-ms", type=float, default=0.0, help="the receiver's answer delay")
        parser.add_argument("--method", choices=("auto", "poll"), default="auto",
                            help="auto: the product's wait_halted where the code has it; poll: main's loop")
        parser.add_argument("--sample", action="store_true",
                            help="profile: sample the control's backend in pg_stat_activity every ~1 ms")
        report_arguments(parser, database=DEFAULT_DATABASE, budget="halt_drain")

    def handle(self, command, options: dict) -> None:
        report = report_of(options, lambda: run_halt_drain(
            clients=options["clients"], drills=options["drills"], period=options["period"],
            effects=options["effects"], poll_ms=options["poll_ms"],
            refusal_pause_ms=options["refusal_pause_ms"], service_ms=options["service_ms"],
            method=options["method"], database=options["database_name"], keep=options["keep"],
            sample=options["sample"], say=command.progress))
        s = report["summary"]
        command.progress(f"method {report['method']}; load {report['load_average_start']} -> "
                         f"{report['load_average_end']}; dispatched {report['dispatched']}")
        for key in ("settle_to_halted_ms", "settle_to_halted_ms_drills_with_open_permits", "settle_to_returned_ms",
                    "halt_to_last_settled_ms", "settle_to_confirm_start_ms", "confirm_start_to_halted_ms", "tries"):
            command.progress(f"{key}: {json.dumps(s[key])}")
        command.progress(f"confirm attempts: {json.dumps(s['confirm_attempt_ms'])}; "
                         f"closed after confirm: {s['closed_after_confirm']}")
        for key, n in (report.get("control_backend_samples") or {}).items():
            command.progress(f"  sample {n:6d}  {key}")
        save_and_check(command, options, report, budget="halt_drain", check=check_report,
                       goal="halt-drain: issue 20 goal 5")
