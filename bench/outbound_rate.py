"""`manage.py bench outbound-rate`: per-destination rate and concurrency limits across egress processes (issue 20,
goal 4, D-222..D-224), on a throwaway database, against the loopback test receiver.

The demo push world's callout declares `rate_limit: {requests_per_second: R, max_in_flight: K}` for destination A
(the first account); destination B (the second account) is authored as a callout without a limit (its commands
freeze no rate, so it has no limiter). Effects for both are authored through the set-based author, then ANALYZE;
then `--processes` spawned egress processes, each running `--workers` threads of the egress task's batched step
(`worker.effect_dispatch_batch`), drain them against the receiver answering after `--answer-ms` (0: at once, as
the issue says):

  rate      `--seconds` (default 30): A's observed rate at the receiver between 1 s after the start and the end of
            the phase, the most requests of each destination the receiver ever had in flight, B's rate (not slowed).
  throttle  the receiver answers A's next request `429` with `Retry-After: --retry-after` (default 2): the A requests
            that START at the receiver within --retry-after seconds after the 429 answer was written (goal: none),
            the permits granted to A while it was deferred (PostgreSQL), B's requests inside the deferral.

Then exactly-once at the receiver: no logical effect applied twice, every applied effect `remote_confirmed` or
`finalized`, none `uncertain`. `--check` fails unless each figure meets the issue's goal (bench/budgets.json
"outbound_rate"). See docs/benchmarks.md "Issue 20".
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

DEFAULT_DATABASE = "connector_bench_rate"
# B (no limit) gets this many times A's effects: it is not held to R, so it must not run dry first.
UNLIMITED_FACTOR = 3


def _egress_main(index: int, setup: dict, workers: int, seconds: float, go, outbox) -> None:
    """One egress process: `workers` threads running the egress task's batched step until `seconds` after `go`."""
    try:
        from bench.hot_client import _bootstrap

        _bootstrap(setup)
        from django.db import connections

        from effects.services import worker

        counts = {"dispatched": 0, "idle": 0}
        lock = threading.Lock()
        warmed = threading.Barrier(workers + 1)

        def loop(t: int) -> None:
            from django.db import connection

            from effects.models import OutboundCommand
            from effects.services.outbound import frozen_path_template

            name = f"bench-rate-{index}-{t}-{os.getpid()}"
            try:
                # Untimed warm-up: this thread's connection and the process's frozen-fact caches.
                connection.ensure_connection()
                for command in OutboundCommand.objects.order_by("account_id", "pk").distinct("account_id"):
                    frozen_path_template(command)
                warmed.wait(300)
                go.wait(300)
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    step = len(worker.effect_dispatch_batch(holder_name=name))
                    with lock:
                        counts["dispatched"] += step
                        counts["idle"] += 0 if step else 1
                    if not step:
                        time.sleep(0.002)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=loop, args=(t,), daemon=True) for t in range(workers)]
        for thread in threads:
            thread.start()
        warmed.wait(300)
        outbox.put(("ready", index, None))
        for thread in threads:
            thread.join(seconds + 120)
        outbox.put(("result", index, counts))
    except BaseException:  # noqa: BLE001 - reported to the parent
        import traceback

        outbox.put(("failed", index, traceback.format_exc()))


def _phase(setup: dict, processes: int, workers: int, seconds: float, during=None) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    outbox, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_egress_main, args=(i, setup, workers, seconds, go, outbox), daemon=True)
             for i in range(processes)]
    for p in procs:
        p.start()
    results, ready = [], 0
    while ready < processes:
        kind, index, payload = outbox.get(timeout=180)
        if kind == "failed":
            raise RuntimeError(f"egress process {index} failed:\n{payload}")
        ready += 1
    t0 = time.monotonic()
    go.set()
    if during is not None:
        during(t0)
    while len(results) < processes:
        kind, index, payload = outbox.get(timeout=seconds + 120)
        if kind == "failed":
            raise RuntimeError(f"egress process {index} failed:\n{payload}")
        results.append(payload)
    for p in procs:
        p.join(10)
    return results, t0


def _author(account, label: str, first: int, count: int, limited: bool, say) -> None:
    """`count` effects of one destination through the set-based author (transactions of 100). `limited` False:
    authored as a callout without a limit authors them (no rate frozen, no limiter), so B is a destination that
    declares none."""
    from django.db import transaction

    from connector.demo import PUSH
    from connector.services.guard import lock_serving
    from effects.services import outbound
    from effects.services.outbound import outbound_commands_author

    push, started, declared = PUSH["push"], time.monotonic(), outbound.declared_rate_limit
    if not limited:
        outbound.declared_rate_limit = lambda _callout_def: None
    try:
        for start in range(first, first + count, 100):
            with transaction.atomic():
                ctx = lock_serving(account_id=account.pk)
                outbound_commands_author(calls=[{
                    "ctx": ctx, "account_key": account.account_key, "application_scope": "bench.rate",
                    "effect_root_id": f"rate-{label}-{i}", "effect_slot_id": "push", "effect_generation_id": "g1",
                    "push_contract": push["contract"], "callout": push["callout"],
                    "path_params": {"record_key": f"{label}-{i}", "record_id": f"{label}-{i}"},
                    "body": {"record_key": f"{label}-{i}", "name": "Ann"}, "suppress_external_effects": False}
                    for i in range(start, min(first + count, start + 100))])
    finally:
        outbound.declared_rate_limit = declared
    say(f"authored {count} effects for destination {label} ({'limited' if limited else 'no limit'}) "
        f"in {time.monotonic() - started:.1f} s")


def _analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _throttle_figures(later: list[dict], retry_after: int) -> dict:
    """After A's 429: the A requests that started at the receiver within `retry_after` s after the 429 answer was
    written (goal: 0), each classified by when its permit was marked `sending` against when the deferral was
    committed; the permits granted to A while it was deferred (PostgreSQL `granted_at`, must be 0); the gap to A's
    next request; B's requests inside the deferral (B is not slowed)."""
    from effects.models import DestinationLimiter, DispatchPermit, RemoteEffect

    throttled = [r for r in later if r["mode"] == "throttle"]
    figures = {"throttled_requests": len(throttled)}
    if not throttled:
        return figures
    answered, answered_wall = throttled[0]["answered_at"], throttled[0]["answered_wall"]
    limiter = DestinationLimiter.objects.filter(deferrals_total__gt=0).order_by("pk").first()
    if limiter is None or limiter.deferred_until is None:
        return figures
    until = limiter.deferred_until
    recorded = until - timedelta(seconds=retry_after)  # the settlement's `now` that recorded the deferral
    a_permits = DispatchPermit.objects.filter(limiter=limiter)
    a_after = [r for r in later if r["group"] == "a" and r["at"] > answered]
    a_inside = [r for r in a_after if r["at"] < answered + retry_after]
    effects = dict(RemoteEffect.objects.filter(command__provider_idempotency_key__in=[r["key"] for r in a_inside])
                   .values_list("command__provider_idempotency_key", "pk"))
    marked_after = a_permits.filter(effect_id__in=effects.values(), sending_at__gte=recorded).count()
    figures.update({
        "deferral_recorded_after_the_429_answer_ms": round((recorded.timestamp() - answered_wall) * 1000, 1),
        "permits_granted_to_a_while_deferred": a_permits.filter(granted_at__gte=recorded, granted_at__lt=until).count(),
        "requests_to_a_started_within_retry_after": len(a_inside),
        "of_them_marked_sending_after_the_deferral": marked_after,
        "first_request_to_a_after_the_429_s": round(a_after[0]["at"] - answered, 3) if a_after else None,
        "requests_to_b_inside_the_deferral": sum(1 for r in later if r["group"] == "b"
                                                 and answered < r["at"] < answered + retry_after)})
    return figures


def _rate(times: list[float], t0: float, t1: float) -> float:
    inside = [t for t in times if t0 <= t < t1]
    return len(inside) / (t1 - t0) if t1 > t0 else 0.0


def run_outbound_rate(*, rps: int, in_flight: int, processes: int, workers: int, seconds: float,
                      retry_after: int, answer_ms: float, top_up, say) -> dict:
    from django.conf import settings
    from django.db import connections

    from effects.models import DestinationLimiter, RemoteEffect
    from tests.effects.receiver import Receiver

    receiver = Receiver()
    receiver.group_of = lambda path: path.rsplit("/", 1)[-1].split("-", 1)[0]
    receiver.service_seconds = answer_ms / 1000.0
    receiver.retry_after = str(retry_after)
    receiver.start()
    default, journal = connections["default"].settings_dict, connections["journal"].settings_dict
    setup = {"settings_module": os.environ.get("DJANGO_SETTINGS_MODULE") or settings.SETTINGS_MODULE,
             "names": {"default": default["NAME"], "journal": journal["NAME"]},
             "connector": {"EGRESS_BASE_URL": receiver.url,
                           "SECRET_BACKEND_DIR": settings.CONNECTOR["SECRET_BACKEND_DIR"],
                           "EGRESS_TIMEOUT_SECONDS": 5}}
    connections.close_all()
    report = {"bench": "outbound-rate", "requests_per_second": rps, "max_in_flight": in_flight,
              "processes": processes, "workers_per_process": workers, "seconds": seconds,
              "receiver_answer_ms": answer_ms, "retry_after": retry_after, "cpus": os.cpu_count(),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "load_average_before": [round(v, 2) for v in os.getloadavg()]}
    try:
        say(f"rate phase: {processes} egress processes x {workers} workers for {seconds:g} s")
        results, t0 = _phase(setup, processes, workers, seconds)
        by_group = {g: sorted(r["at"] for r in receiver.requests if r["group"] == g) for g in "ab"}
        rate = {}
        for g, times in by_group.items():
            last = min(t0 + seconds, times[-1]) if times else t0 + seconds  # B may drain before the end
            rate[g] = {"requests": len(times), "window_s": round(last - t0 - 1.0, 2),
                       "observed_rate_per_s": round(_rate(times, t0 + 1.0, last), 2),
                       "max_in_flight_at_receiver": receiver.group_max_in_flight.get(g, 0)}
        report["rate"] = {"destinations": rate, "processes": results,
                          "load_average": [round(v, 2) for v in os.getloadavg()]}
        say(f"rate phase: {json.dumps(rate)}")
        connections.close_all()
        top_up(retry_after + 4.0)
        connections.close_all()
        mark = len(receiver.requests)
        throttle_seconds = retry_after + 4.0

        def throttle(_t0: float) -> None:
            time.sleep(1.0)
            receiver.throttle_groups.add("a")

        say(f"throttle phase: A's next request answered 429 Retry-After {retry_after}, {throttle_seconds:g} s")
        _phase(setup, processes, workers, throttle_seconds, during=throttle)
        report["throttle"] = _throttle_figures(receiver.requests[mark:], retry_after)
        report["throttle"]["load_average"] = [round(v, 2) for v in os.getloadavg()]
        say(f"throttle phase: {json.dumps(report['throttle'])}")
    finally:
        receiver.stop()
    sent_ok: dict[str, int] = {}
    for r in receiver.requests:
        if r["mode"] == "ok":
            sent_ok[r["key"]] = sent_ok.get(r["key"], 0) + 1
    states = {}
    for state in RemoteEffect.objects.values_list("state", flat=True):
        states[state] = states.get(state, 0) + 1
    applied_keys = set(receiver.applied)
    unconfirmed = (RemoteEffect.objects.filter(command__provider_idempotency_key__in=applied_keys)
                   .exclude(state__in=("remote_confirmed", "finalized")).count())
    report["exactly_once"] = {"requests": len(receiver.requests), "logical_effects_applied": len(applied_keys),
                              "applied_twice": sum(1 for n in sent_ok.values() if n > 1),
                              "applied_but_not_confirmed": unconfirmed, "effect_states": states}
    report["limiters"] = list(DestinationLimiter.objects.values("callout", "account_id", "granted_total",
                                                                "refused_total", "deferrals_total"))
    return report


def check(report: dict, budget: dict) -> list[str]:
    """The issue's goal 4 as floors (bench/budgets.json "outbound_rate"): every broken one, named."""
    failures = []
    rps, k = report["requests_per_second"], report["max_in_flight"]
    a, b = report["rate"]["destinations"]["a"], report["rate"]["destinations"]["b"]
    tolerance = budget.get("rate_tolerance", 0.05)
    if abs(a["observed_rate_per_s"] - rps) > tolerance * rps:
        failures.append(f"destination A: observed {a['observed_rate_per_s']}/s, goal {rps}/s +-{tolerance:.0%}")
    if a["max_in_flight_at_receiver"] > k:
        failures.append(f"destination A: {a['max_in_flight_at_receiver']} in flight at the receiver, limit {k}")
    floor = budget.get("min_unlimited_rate_over_declared", 1.0)
    if b["observed_rate_per_s"] < floor * rps:
        failures.append(f"destination B (no limit): {b['observed_rate_per_s']}/s, slowed below {floor} x {rps}/s")
    throttle = report["throttle"]
    for key, most in (("permits_granted_to_a_while_deferred", 0),
                      ("requests_to_a_started_within_retry_after", budget.get("max_requests_inside_retry_after", 0))):
        if throttle.get(key, most + 1) > most:
            failures.append(f"429 Retry-After {report['retry_after']}: {key} = {throttle.get(key)} (at most {most})")
    if throttle.get("requests_to_b_inside_the_deferral", 0) < budget.get("min_b_requests_inside_deferral", 1):
        failures.append(f"destination B slowed by A's deferral: {throttle}")
    once = report["exactly_once"]
    if once["applied_twice"] or once["applied_but_not_confirmed"] or once["effect_states"].get("uncertain"):
        failures.append(f"exactly-once broken: {once}")
    return failures


class OutboundRate:
    """`bench outbound-rate`: registered in bench/management/commands/bench.py's SUBCOMMANDS."""

    name = "outbound-rate"
    help = ("Per-destination rate and concurrency limits across egress processes: the receiver's observed rate and "
            "in-flight maximum per destination, a 429 Retry-After deferral, exactly-once at the receiver.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--rps", type=int, default=50)
        parser.add_argument("--in-flight", type=int, default=4)
        parser.add_argument("--processes", type=int, default=2)
        parser.add_argument("--workers", type=int, default=2,
                            help="dispatch threads per egress process (2: one per vCPU of the 2-vCPU bench machine; "
                                 "more threads of one process wait on its interpreter lock)")
        parser.add_argument("--seconds", type=float, default=30.0)
        parser.add_argument("--retry-after", type=int, default=2)
        parser.add_argument("--answer-ms", type=float, default=0.0,
                            help="the receiver's time per answer (0: at once, as the issue says)")
        parser.add_argument("--effects", type=int, default=None,
                            help="effects authored per destination (default: enough for --rps over both phases)")
        parser.add_argument("--json", metavar="FILE")
        parser.add_argument("--check", action="store_true")
        parser.add_argument("--database-name", default=DEFAULT_DATABASE)
        parser.add_argument("--keep", action="store_true")

    def handle(self, command, options: dict) -> None:
        from django.core.management.base import CommandError
        from django.db import connections

        from bench.databases import ThrowawayDatabases
        from connector import demo

        say = command.progress
        name = options["database_name"]
        rps, k = options["rps"], options["in_flight"]
        for logger in ("connector", "effects", "httpx"):
            logging.getLogger(logger).setLevel(logging.WARNING)
        saved = demo.CALLOUT_DEFINITION
        demo.CALLOUT_DEFINITION = {**saved, "rate_limit": {"requests_per_second": rps, "max_in_flight": k}}
        try:
            with ThrowawayDatabases([name], f"{name}_journal", keep=options["keep"], say=say) as databases:
                connections["default"] = databases.wrappers[name]
                world = demo.build_world("", push=True)
                a, b = world.accounts
                per = options["effects"] or int(rps * (options["seconds"] + options["retry_after"] + 6) * 1.2)
                _author(a, "a", 0, per, True, say)
                _author(b, "b", 0, int(per * UNLIMITED_FACTOR), False, say)
                _analyze()
                authored = {"b": int(per * UNLIMITED_FACTOR)}

                def top_up(seconds: float) -> None:  # B must not run dry before the throttle phase
                    from effects.models import RemoteEffect

                    want = int(rps * UNLIMITED_FACTOR * seconds)
                    have = RemoteEffect.objects.filter(account_id=b.pk, state="prepared").count()
                    if have < want:
                        _author(b, "b", authored["b"], want - have, False, say)
                        authored["b"] += want - have
                        _analyze()

                report = run_outbound_rate(rps=rps, in_flight=k, processes=options["processes"],
                                           workers=options["workers"], seconds=options["seconds"],
                                           retry_after=options["retry_after"], answer_ms=options["answer_ms"],
                                           top_up=top_up, say=say)
        finally:
            demo.CALLOUT_DEFINITION = saved
        report["command"] = ("manage.py bench outbound-rate " + " ".join(
            f"--{k.replace('_', '-')} {options[k]}" for k in
            ("rps", "in_flight", "processes", "workers", "seconds", "retry_after", "answer_ms")))
        text = json.dumps(report, indent=2)
        if options["json"]:
            Path(options["json"]).write_text(text + "\n", encoding="utf-8")
        command.stdout.write(text)
        if options["check"]:
            from bench import load_budgets

            failures = check(report, load_budgets().get("outbound_rate") or {})
            if failures:
                raise CommandError("outbound-rate goals broken:\n  " + "\n  ".join(failures))
            command.stdout.write(command.style.SUCCESS("check passed: rate, in-flight, deferral and exactly-once"))
