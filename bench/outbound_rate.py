"""`manage.py bench outbound-rate`: per-destination rate and concurrency limits across egress processes (issue 20,
D-222..D-224), on a throwaway database, against the loopback test receiver.

The demo push world's callout declares `rate_limit: {requests_per_second: R, max_in_flight: K}`; its two accounts
are two destinations (A and B) of that callout, each with its own limiter. Effects for both are authored through
the services, then `--processes` spawned egress processes, each running `--workers` threads of
`worker.effect_dispatch_once`, drain them:

  rate      `--seconds` (default 30): the receiver's observed rate per destination (requests in the steady window
            after the first second) and the most requests of one destination it ever had in flight.
  throttle  the receiver answers A's next request `429` with `Retry-After: --retry-after` (default 2): the gap
            before A's next request, and B's requests inside that gap (B is not slowed).

Then exactly-once at the receiver: no logical effect applied twice, every applied effect `remote_confirmed` or
`finalized`, none `uncertain`. `--check` fails unless each figure meets the issue's goal (rate within 5% of R,
never more than K in flight, the deferral honoured, 0 duplicates). See docs/benchmarks.md "Issue 20".
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


def _egress_main(index: int, setup: dict, workers: int, seconds: float, go, outbox) -> None:
    """One egress process: `workers` threads dispatching until `seconds` after `go` is set."""
    try:
        from bench.hot_account import _bootstrap

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
                    effect = worker.effect_dispatch_once(holder_name=name)
                    with lock:
                        counts["dispatched" if effect is not None else "idle"] += 1
                    if effect is None:
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
    return results


def _author(accounts, per_destination: int, say) -> None:
    from django.db import transaction

    from connector.demo import PUSH
    from connector.services.guard import lock_serving
    from effects.services.outbound import outbound_command_author

    push = PUSH["push"]
    for label, account in zip("ab", accounts):
        started = time.monotonic()
        for i in range(per_destination):
            with transaction.atomic():
                ctx = lock_serving(account_id=account.pk)
                outbound_command_author(
                    ctx=ctx, account_key=account.account_key, application_scope="bench.rate",
                    effect_root_id=f"rate-{label}-{i}", effect_slot_id="push", effect_generation_id="g1",
                    push_contract=push["contract"], callout=push["callout"],
                    path_params={"record_key": f"{label}-{i}", "record_id": f"{label}-{i}"},
                    body={"record_key": f"{label}-{i}", "name": "Ann"}, suppress_external_effects=False)
        say(f"authored {per_destination} effects for destination {label} in {time.monotonic() - started:.1f} s")


def _throttle_figures(later: list[dict], throttled: list[dict], retry_after: int) -> dict:
    """After A's 429: permits granted to A while it was deferred (must be 0; from PostgreSQL), requests to A
    inside the deferral (only permits granted before the 429 was recorded, at most K-1), the gap to the first A
    request of a permit granted after it, and B's requests inside the deferral (B is not slowed)."""
    from effects.models import DestinationLimiter, DispatchPermit

    figures = {"throttled_requests": len(throttled)}
    if not throttled:
        return figures
    t429 = throttled[0]["at"]
    limiter = DestinationLimiter.objects.filter(deferrals_total__gt=0).order_by("pk").first()
    if limiter is None or limiter.deferred_until is None:
        return figures
    until = limiter.deferred_until
    start = until - timedelta(seconds=retry_after)
    a_permits = DispatchPermit.objects.filter(limiter=limiter)
    granted_inside = a_permits.filter(granted_at__gt=start, granted_at__lt=until).count()
    first_after = a_permits.filter(granted_at__gte=until).order_by("granted_at").values_list("granted_at", flat=True)
    a_inside = [r for r in later if r["group"] == "a" and t429 < r["at"] < t429 + retry_after]
    figures.update({
        "permits_granted_to_a_while_deferred": granted_inside,
        "requests_to_a_inside_the_deferral_granted_before_it": len(a_inside),
        "first_grant_to_a_after_the_429_s": (round((first_after[0] - start).total_seconds(), 3)
                                             if first_after else None),
        "requests_to_b_inside_the_deferral": sum(1 for r in later if r["group"] == "b"
                                                 and t429 < r["at"] < t429 + retry_after)})
    return figures


def _steady_rate(times: list[float], t0: float, t1: float) -> float:
    inside = [t for t in times if t0 <= t < t1]
    return len(inside) / (t1 - t0) if t1 > t0 else 0.0


def run_outbound_rate(*, rps: int, in_flight: int, processes: int, workers: int, seconds: float,
                      retry_after: int, service_ms: float, say) -> dict:
    from django.conf import settings
    from django.db import connections

    from effects.models import DestinationLimiter, RemoteEffect
    from tests.effects.receiver import Receiver

    receiver = Receiver()
    receiver.group_of = lambda path: path.rsplit("/", 1)[-1].split("-", 1)[0]
    receiver.service_seconds = service_ms / 1000.0
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
              "receiver_service_ms": service_ms, "retry_after": retry_after, "cpus": os.cpu_count(),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        say(f"rate phase: {processes} egress processes x {workers} workers for {seconds:g} s")
        results = _phase(setup, processes, workers, seconds)
        by_group = {g: sorted(r["at"] for r in receiver.requests if r["group"] == g) for g in "ab"}
        start = min(t[0] for t in by_group.values() if t)
        end = max(t[-1] for t in by_group.values() if t)
        rate = {}
        for g, times in by_group.items():
            rate[g] = {"requests": len(times), "steady_window_s": round(end - start - 1.0, 2),
                       "observed_rate_per_s": round(_steady_rate(times, start + 1.0, end), 2),
                       "max_in_flight_at_receiver": receiver.group_max_in_flight.get(g, 0)}
        report["rate"] = {"destinations": rate, "processes": results,
                          "load_average": [round(v, 2) for v in os.getloadavg()]}
        say(f"rate phase: {json.dumps(rate)}")
        mark = len(receiver.requests)
        throttle_seconds = retry_after + 4.0

        def throttle(t0: float) -> None:
            time.sleep(1.0)
            receiver.throttle_groups.add("a")

        say(f"throttle phase: A's next request answered 429 Retry-After {retry_after}, {throttle_seconds:g} s")
        _phase(setup, processes, workers, throttle_seconds, during=throttle)
        later = receiver.requests[mark:]
        throttled = [r for r in later if r["mode"] == "throttle"]
        report["throttle"] = _throttle_figures(later, throttled, retry_after)
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


def check(report: dict) -> list[str]:
    failures = []
    rps, k = report["requests_per_second"], report["max_in_flight"]
    for g, d in report["rate"]["destinations"].items():
        if abs(d["observed_rate_per_s"] - rps) > 0.05 * rps:
            failures.append(f"destination {g}: observed {d['observed_rate_per_s']}/s, goal {rps}/s +-5%")
        if d["max_in_flight_at_receiver"] > k:
            failures.append(f"destination {g}: {d['max_in_flight_at_receiver']} in flight, limit {k}")
    throttle = report["throttle"]
    if throttle.get("permits_granted_to_a_while_deferred", 1) != 0:
        failures.append(f"429 Retry-After {report['retry_after']}: permits granted to A while deferred: {throttle}")
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
        parser.add_argument("--workers", type=int, default=4, help="dispatch threads per egress process")
        parser.add_argument("--seconds", type=float, default=30.0)
        parser.add_argument("--retry-after", type=int, default=2)
        parser.add_argument("--service-ms", type=float, default=40.0, help="the receiver's time per answer")
        parser.add_argument("--effects", type=int, default=None,
                            help="effects authored per destination (default: enough for --rps over both phases)")
        parser.add_argument("--json", metavar="FILE")
        parser.add_argument("--check", action="store_true")
        parser.add_argument("--database-name", default=DEFAULT_DATABASE)
        parser.add_argument("--keep", action="store_true")

    def handle(self, command, options: dict) -> None:
        from django.core.management.base import CommandError
        from django.db import connections

        from bench.management.commands.bench import ThrowawayDatabases
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
                per = options["effects"] or int(rps * (options["seconds"] + options["retry_after"] + 6) * 1.2)
                _author(world.accounts, per, say)
                report = run_outbound_rate(rps=rps, in_flight=k, processes=options["processes"],
                                           workers=options["workers"], seconds=options["seconds"],
                                           retry_after=options["retry_after"], service_ms=options["service_ms"],
                                           say=say)
        finally:
            demo.CALLOUT_DEFINITION = saved
        report["command"] = ("manage.py bench outbound-rate " + " ".join(
            f"--{k.replace('_', '-')} {options[k]}" for k in
            ("rps", "in_flight", "processes", "workers", "seconds", "retry_after", "service_ms")))
        text = json.dumps(report, indent=2)
        if options["json"]:
            Path(options["json"]).write_text(text + "\n", encoding="utf-8")
        command.stdout.write(text)
        if options["check"]:
            failures = check(report)
            if failures:
                raise CommandError("outbound-rate goals broken:\n  " + "\n  ".join(failures))
            command.stdout.write(command.style.SUCCESS("check passed: rate, in-flight, deferral and exactly-once"))
