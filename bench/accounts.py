"""`manage.py bench accounts`: account flatness (issue 18, goal 7; CV2-14-011 applied to the size of the service).

One event's latency through the whole inbound chain of one account -- `receipt_admit` of a fresh 1-event body,
`receipt_materialize`, `lane_advance`, `execution_claim`, `execution_run` (Runtime, ApplicationResult, completion)
-- with N accounts in the service, for each N in `--accounts` (default 2,50000). The cost of the hot path must not
grow with the number of accounts: the goal is p50(largest N) / p50(smallest N) <= 1.2.

Model: `bench history`'s interleaved mode. One throwaway database per N (`<name>_<N>`, journal `<name>_journal`)
holds the service that `bench activation` builds (`bench.activation.build_activation_world`: the first two
accounts and the owners through the services, the other N-2 accounts, gates, credentials and configuration in
bulk SQL, an epoch prepared and verified over all N), activated by the product's own
`serving.epoch_activate_first` (every gate `v2_serving`, one epoch whose preimage grows with N). The timed account
is the first service account (the same key in every database). After an untimed warm-up per database, blocks of
`--block` events are timed on each database in turn, the order reversed each round, so a load change on the shared
machine hits every size alike. The databases are dropped afterwards unless `--keep`.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence

from django.db import connections

Progress = Callable[[str], None]
STAGES = ("admission", "materialize", "lane_advance", "claim", "run")
DEFAULT_ACCOUNTS = "2,50000"
DEFAULT_DATABASE = "connector_bench_acct"
GOAL_RATIO = 1.2


def _stats(samples: Sequence[float]) -> dict:
    ordered = sorted(samples)
    if len(ordered) < 2:
        v = ordered[0] if ordered else 0.0
        return {"n": len(ordered), "p50": v, "p95": v, "p99": v, "mean": v}
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"n": len(ordered), "p50": round(cuts[49], 3), "p95": round(cuts[94], 3), "p99": round(cuts[98], 3),
            "mean": round(statistics.fmean(ordered), 3)}


def one_event(account_key: str, account_id: int, tag: str) -> dict[str, float]:
    """Admit, materialize, advance, claim and run one fresh event; milliseconds per stage and in total."""
    from connector.actors import Actor
    from connector.demo import DEMO_CHANNEL, demo_event_body
    from connector.services.admission import receipt_admit
    from connector.services.execution import execution_claim, execution_run, lane_advance
    from connector.services.materialize import receipt_materialize

    body = demo_event_body(tag)
    t0 = time.perf_counter()
    admission = receipt_admit(account_key=account_key, channel=DEMO_CHANNEL, transport_key=f"bench-{tag}",
                              body=body, actor=Actor.system("bench-accounts"))
    t1 = time.perf_counter()
    out = receipt_materialize(receipt_pk=admission.receipt.pk)
    t2 = time.perf_counter()
    (lane_pk,) = out.lanes
    minted = lane_advance(lane_pk=lane_pk)
    t3 = time.perf_counter()
    token = execution_claim(holder="bench-accounts", lease_seconds=60, account_id=account_id)
    t4 = time.perf_counter()
    done = execution_run(token=token)
    t5 = time.perf_counter()
    if admission.outcome != "created" or minted is None or token is None or token.execution_pk != minted.pk:
        raise RuntimeError(f"chain broke: {admission.outcome}, {minted}, {token}")
    if getattr(done, "state", "completed") != "completed":
        raise RuntimeError(f"execution ended {done.state}")
    ms = [(b - a) * 1000 for a, b in ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5))]
    return {**dict(zip(STAGES, ms)), "total": (t5 - t0) * 1000}


def _prepare(size: int, say: Progress) -> tuple[str, int, dict]:
    """On the current `default` database: the N-account service, activated; returns the timed account."""
    from bench.activation_world import ACTOR, build_activation_world
    from connector.actors import Actor
    from connector.models import AccountServingGate, ServingEpoch
    from connector.services import serving

    world = build_activation_world(size, progress=say)
    began = time.monotonic()
    serving.epoch_activate_first(epoch_pk=world.epoch_pk, actor=Actor.system(ACTOR))
    activation_s = time.monotonic() - began
    gate = (AccountServingGate.objects.select_related("account").filter(mode="v2_serving")
            .order_by("account_id").first())
    serving_gates = AccountServingGate.objects.filter(mode="v2_serving").count()
    if serving_gates != size:
        raise RuntimeError(f"{serving_gates} of {size} gates serving after the activation")
    preimage = ServingEpoch.objects.filter(pk=world.epoch_pk).values_list("preimage", flat=True).get()
    facts = {"accounts": size, "serving_gates": serving_gates, "setup_seconds": world.setup_seconds,
             "activation_seconds": round(activation_s, 3), "epoch_preimage_bytes": len(bytes(preimage))}
    return gate.account.account_key, gate.account_id, facts


def measure_accounts(*, databases: dict[int, object], iterations: int, warmup: int, block: int,
                     progress: Progress | None = None) -> dict:
    """`databases` maps N -> DatabaseWrapper of an empty migrated database. Builds and activates each service,
    then times `iterations` events per N in interleaved blocks. Returns the report dict."""
    say = progress or (lambda _msg: None)
    original = connections["default"]
    try:
        prepared = {}
        for size, wrapper in sorted(databases.items()):
            connections["default"] = wrapper
            say(f"{size:,} accounts: building and activating the service")
            prepared[size] = (wrapper, *_prepare(size, say))
        run_tag = f"{int(time.time() * 1000):x}"
        for size, (wrapper, key, account_id, _facts) in prepared.items():
            connections["default"] = wrapper
            for i in range(warmup):
                one_event(key, account_id, f"{run_tag}-{size}-w{i}")
        samples: dict[int, list[dict]] = {size: [] for size in prepared}
        say(f"timing {iterations} events per size, in blocks of {block}, interleaved")
        done, order = 0, sorted(prepared)
        while done < iterations:
            count = min(block, iterations - done)
            for size in order:
                wrapper, key, account_id, _facts = prepared[size]
                connections["default"] = wrapper
                gc.collect()
                samples[size].extend(one_event(key, account_id, f"{run_tag}-{size}-{done + i}")
                                     for i in range(count))
            done += count
            order.reverse()
        report = {"bench": "accounts", "iterations": iterations, "block": block, "cpus": os.cpu_count() or 0,
                  "load_average": [round(v, 2) for v in os.getloadavg()], "goal_ratio": GOAL_RATIO,
                  "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sizes": []}
        for size, (_wrapper, key, _account_id, facts) in sorted(prepared.items()):
            report["sizes"].append({**facts, "account_key": key, **{
                name: _stats([s[name] for s in samples[size]]) for name in (*STAGES, "total")}})
        small, large = report["sizes"][0], report["sizes"][-1]
        report["p50_ratio"] = round(large["total"]["p50"] / small["total"]["p50"], 3) if small["total"]["p50"] else None
        return report
    finally:
        connections["default"] = original


def format_report(report: dict) -> str:
    head = f"{'accounts':>9} {'stage':<12} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'mean ms':>8}"
    lines = [f"bench accounts: one event admitted -> materialized -> claimed -> ApplicationResult, "
             f"{report['iterations']} per size, interleaved blocks of {report['block']}, load {report['load_average']}",
             head, "-" * len(head)]
    for size in report["sizes"]:
        for name in (*STAGES, "total"):
            s = size[name]
            lines.append(f"{size['accounts']:>9,} {name:<12} {s['n']:>5} {s['p50']:>8.2f} {s['p95']:>8.2f} "
                         f"{s['p99']:>8.2f} {s['mean']:>8.2f}")
    for size in report["sizes"]:
        lines.append(f"{size['accounts']:,} accounts: setup {size['setup_seconds'].get('total')} s, activation "
                     f"{size['activation_seconds']} s, epoch preimage {size['epoch_preimage_bytes']:,} bytes")
    lines.append(f"p50 ratio largest/smallest: {report['p50_ratio']} (goal <= {report['goal_ratio']})")
    return "\n".join(lines)


class Accounts:
    """`bench accounts`: registered in bench/management/commands/bench.py's SUBCOMMANDS."""

    name = "accounts"
    help = ("One event's latency (admission -> materialization -> claim -> ApplicationResult) with N accounts in "
            "the service, for each N in --accounts, on throwaway databases (issue 18, goal 7).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--accounts", default=DEFAULT_ACCOUNTS,
                            help=f"service sizes, comma-separated (default {DEFAULT_ACCOUNTS})")
        parser.add_argument("--iterations", type=int, default=200, help="timed events per size (default 200)")
        parser.add_argument("--warmup", type=int, default=20, help="untimed events per size first (default 20)")
        parser.add_argument("--block", type=int, default=10, help="timed events per size before switching")
        parser.add_argument("--database-name", default=DEFAULT_DATABASE,
                            help=f"prefix of the throwaway databases (default {DEFAULT_DATABASE})")
        parser.add_argument("--keep", action="store_true", help="keep the throwaway databases afterwards")
        parser.add_argument("--json", metavar="FILE", help="write the JSON report to FILE")
        parser.add_argument("--check", action="store_true",
                            help="exit non-zero if the p50 ratio largest/smallest is above bench/budgets.json's "
                                 f"accounts.max_p50_ratio (default {GOAL_RATIO})")

    def handle(self, command, options: dict) -> None:
        from django.core.management.base import CommandError

        from bench.databases import NAME_RE, ThrowawayDatabases
        from bench.options import integer_list

        sizes = integer_list(options["accounts"], "--accounts", low=0,
                             needs="--accounts needs at least one non-negative size")
        if len(sizes) < 2 or options["iterations"] < 1 or options["block"] < 1 or options["warmup"] < 0:
            raise CommandError("two sizes at least, --iterations and --block at least 1, --warmup not negative")
        base = options["database_name"]
        for name in (f"{base}_{max(sizes)}", f"{base}_journal"):
            if not NAME_RE.match(name):
                raise CommandError(f"--database-name {base!r} must match {NAME_RE.pattern}")
        say = command.progress
        connector_log = logging.getLogger("connector")
        saved = connector_log.level
        if options["verbosity"] < 2:
            connector_log.setLevel(logging.WARNING)
        try:
            names = [f"{base}_{size}" for size in sizes]
            with ThrowawayDatabases(names, f"{base}_journal", keep=options["keep"], say=say) as databases:
                report = measure_accounts(databases={size: databases.wrappers[f"{base}_{size}"] for size in sizes},
                                          iterations=options["iterations"], warmup=options["warmup"],
                                          block=options["block"], progress=say)
        finally:
            connector_log.setLevel(saved)
        report["command"] = (f"manage.py bench accounts --accounts {options['accounts']} --iterations "
                             f"{options['iterations']} --block {options['block']}")
        if options["json"]:
            with open(options["json"], "w", encoding="utf-8") as fh:
                fh.write(json.dumps(report, indent=2) + "\n")
        command.stdout.write(format_report(report))
        if options["check"]:
            from bench import accounts_ratio_limit  # bench/budgets.json "accounts" (D-253), else the goal

            limit = accounts_ratio_limit(default=GOAL_RATIO)
            if report["p50_ratio"] is None or report["p50_ratio"] > limit:
                raise CommandError(f"account flatness: p50 ratio {report['p50_ratio']} > {limit}")
