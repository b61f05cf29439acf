"""`manage.py bench overhead`: what metrics and tracing cost the hot-account mix (issue 21: "overhead <= 5% of
throughput, reported").

The hot-account clients (bench/hot_account.py: admission, materialization, lane advance, claim, Runtime, effect
claim, permit, egress to the loopback receiver, finalization, replay every 20th round; no control process, so no
revocation or halt disturbs the comparison) run in runs of `--seconds`, alternating between

  off  tracing off (no span, no trace row, no header) and no scrape;
  on   tracing on as production turns it on (observability.tracing.configure with OTEL_TRACES_EXPORTER=otlp: the
       SDK's BatchSpanProcessor and the OTLP/HTTP exporter, sending to a sink in this process that decodes and
       counts every span), the admission and materialize stages opening their spans as the view and the task do,
       every stage writing and reading its trace rows; and a scraper process reading the full `/metrics` registry
       (the PostgreSQL readings of every stage, gates, epochs, quarantines, reason deadlines, and the multiprocess
       histograms) every `--scrape-interval` seconds.

The counters and histograms the product observes in process memory are on in both arms (they are not switched
by configuration); their cost per observation is measured separately and reported (`histogram_observe_us`).

Runs go in pairs whose order alternates (off,on), (on,off), ... so a drift of the machine's load hits both arms
alike; the figure is the median over pairs of on/off completions per second, and the overhead is 1 minus it.
Everything happens on a throwaway database, as `bench hot-account` does."""
from __future__ import annotations

import gzip
import http.server
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

Progress = Callable[[str], None]
DEFAULT_DATABASE = "connector_bench_overhead"


# -- in the bench processes -----------------------------------------------------------------------------------------

class DropExporter(SpanExporter):
    """A span exporter that drops every batch: the SDK's and the trace rows' cost without serialization."""

    def export(self, spans):
        return SpanExportResult.SUCCESS


_DROP_PROVIDER = None


def _switch(on: bool, endpoint: str, exporter: str = "otlp") -> None:
    """Tracing on (the production configuration, exporting to `endpoint`; or the SDK with a dropping exporter) or
    off in this process; `exporter` "none" keeps tracing off in the on arm (scrapes only)."""
    global _DROP_PROVIDER
    from connector import tracing
    from observability import tracing as sdk

    if not on or exporter == "none":
        tracing.disable()
        return
    if exporter == "drop":
        if _DROP_PROVIDER is None:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            _DROP_PROVIDER = TracerProvider()
            _DROP_PROVIDER.add_span_processor(BatchSpanProcessor(DropExporter()))
        tracing.enable(_DROP_PROVIDER)
        return
    if sdk._PROVIDER is None or sdk._CONFIGURED_PID != os.getpid():
        sdk.configure({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SERVICE_NAME": "bench-overhead"})
    else:
        tracing.enable(sdk._PROVIDER)


def cmd_mix(index: int, command: dict) -> dict:
    """One client's run of the mix with observability `command["observe"]` on or off."""
    from bench.hot_client import _cmd_mix
    from observability import tracing as sdk

    _switch(command["observe"], command["endpoint"], command.get("exporter", "otlp"))
    try:
        return _cmd_mix(index, command)
    finally:
        if command["observe"] and sdk._PROVIDER is not None:
            sdk._PROVIDER.force_flush()  # this run's spans reach the sink before the run is counted


def cmd_scrape(index: int, command: dict) -> dict:
    """Scrape the whole `/metrics` registry every `interval` seconds until the deadline (the "on" arm)."""
    from prometheus_client import generate_latest

    from bench.hot_recorder import _sleep_until
    from observability.metrics import _registry

    _sleep_until(command["start_at"])
    took, size = [], 0
    while time.time() < command["deadline"]:
        began = time.perf_counter()
        size = len(generate_latest(_registry()))
        took.append(time.perf_counter() - began)
        _sleep_until(min(command["deadline"], time.time() + command["interval"]))
    return {"scrapes": len(took), "scrape_ms_median": round(1000 * statistics.median(took), 2) if took else None,
            "bytes": size}


# -- the OTLP sink --------------------------------------------------------------------------------------------------

class Sink:
    """An OTLP/HTTP trace receiver on loopback that decodes every export and counts its spans."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        sink = self
        self.spans = 0
        self.exports = 0
        self._lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                n = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
                with sink._lock:
                    sink.spans += n
                    sink.exports += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-sink", daemon=True)

    def start(self) -> Sink:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def count(self) -> int:
        with self._lock:
            return self.spans


# -- the parent -----------------------------------------------------------------------------------------------------

def histogram_observe_us(samples: int = 200_000) -> float:
    """Microseconds per observation of a labelled histogram in multiprocess mode (the product's in-memory figures)."""
    from prometheus_client import CollectorRegistry, Histogram

    histogram = Histogram("bench_overhead_probe_seconds", "probe", ["outcome"], registry=CollectorRegistry())
    child = histogram.labels(outcome="created")
    began = time.perf_counter()
    for _ in range(samples):
        child.observe(0.01)
    return round(1e6 * (time.perf_counter() - began) / samples, 3)


def run_overhead(*, account_key: str, clients: int, seconds: float, pairs: int, interval: float,
                 say: Progress, exporter: str = "otlp", sample_ratio: float = 1.0) -> dict:
    from django.conf import settings

    from bench.hot_pool import Pool
    from bench.hot_client import process_setup
    from bench.hot_recorder import summarize_classes
    from bench.hot_report import _state_check, _world_facts, machine_facts
    from tests.effects.receiver import Receiver

    facts = _world_facts(account_key)
    receiver, sink = Receiver().start(), Sink().start()
    saved = settings.CONNECTOR
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": receiver.url}
    # inherited by the spawned bench processes; this process's own values come back afterwards
    saved_env = {k: os.environ.get(k) for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_BSP_SCHEDULE_DELAY",
                                                 "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG")}
    os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_BSP_SCHEDULE_DELAY": "1000",
                       # the SDK's standard sampler variables, as a deployment sets them (D-236)
                       "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                       "OTEL_TRACES_SAMPLER_ARG": repr(float(sample_ratio))})
    setup = process_setup(receiver.url)
    report = {"bench": "overhead", "account_key": account_key, "clients": clients, "seconds": seconds,
              "pairs": pairs, "scrape_interval": interval, "exporter": exporter,
              "sample_ratio": sample_ratio, "machine": machine_facts(),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": []}
    pool = Pool(clients + 1, setup, say)
    scraper = clients
    base = {"account_id": facts["account_id"], "account_key": account_key, "endpoint": sink.url,
            "exporter": exporter}
    run_tag = f"{int(time.time() * 1000):x}"
    try:
        say("warming up: 2 s of untimed rounds per client, tracing on then off")
        for observe in (True, False):
            pool.run({i: {**base, "kind": "call", "target": "bench.overhead:cmd_mix", "observe": observe,
                          "tag": f"{run_tag}-w{int(observe)}", "start_at": time.time(), "deadline": time.time() + 2}
                      for i in range(clients)}, timeout=120, what="warm-up")
        for k in range(pairs):
            for observe in ((False, True) if k % 2 == 0 else (True, False)):
                arm = "on" if observe else "off"
                start = time.time() + 0.3
                deadline = start + seconds
                commands = {i: {**base, "kind": "call", "target": "bench.overhead:cmd_mix", "observe": observe,
                                "tag": f"{run_tag}-p{k}{arm}", "start_at": start, "deadline": deadline}
                            for i in range(clients)}
                if observe and interval > 0:
                    commands[scraper] = {"kind": "call", "target": "bench.overhead:cmd_scrape", "start_at": start,
                                         "deadline": deadline, "interval": interval}
                spans_before = sink.count()
                say(f"pair {k + 1}/{pairs}: {arm}, {clients} client(s), {seconds:g} s")
                results = pool.run(commands, timeout=seconds + 120, what=f"overhead {arm}")
                scrape = results.pop(scraper, None)
                records = [r for res in results.values() for r in res["records"]]
                classes = summarize_classes(records, seconds)
                time.sleep(1.5 if observe else 0)  # the batch processor's last export reaches the sink
                run = {"pair": k, "arm": arm, "completions_per_s": classes["runtime_completion"]["throughput"],
                       "admissions_per_s": classes["transport_admission"]["throughput"],
                       "finalized_per_s": classes["effect_finalize"]["throughput"],
                       "completion_p50_ms": classes["runtime_completion"]["p50_ms"],
                       "admission_p50_ms": classes["transport_admission"]["p50_ms"],
                       "errors": sum(c["errors"] for c in classes.values()),
                       "spans_exported": sink.count() - spans_before, "scrape": scrape,
                       "load_average": round(os.getloadavg()[0], 2)}
                report["runs"].append(run)
                say(f"  {arm}: {run['completions_per_s']} completions/s, {run['spans_exported']} spans"
                    + (f", {scrape['scrapes']} scrapes of {scrape['scrape_ms_median']} ms" if scrape else ""))
    finally:
        pool.close()
        receiver.stop()
        sink.stop()
        settings.CONNECTOR = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    ratios = []
    for k in range(pairs):
        by_arm = {r["arm"]: r for r in report["runs"] if r["pair"] == k}
        if by_arm["off"]["completions_per_s"]:
            ratios.append(by_arm["on"]["completions_per_s"] / by_arm["off"]["completions_per_s"])
    report["on_over_off_by_pair"] = [round(r, 4) for r in ratios]
    report["on_over_off_median"] = round(statistics.median(ratios), 4) if ratios else None
    report["overhead_pct"] = round(100 * (1 - report["on_over_off_median"]), 2) if ratios else None
    report["histogram_observe_us"] = histogram_observe_us()
    report["receiver"] = {"requests": len(receiver.requests), "logical_effects_applied": receiver.applied_total()}
    report["state_problems"] = _state_check(account_key)
    report["load_average"] = [round(v, 2) for v in os.getloadavg()]
    return report


def format_report(report: dict) -> str:
    lines = [f"bench overhead: {report['clients']} client(s), {report['pairs']} pairs of {report['seconds']:g} s, "
             f"exporter {report['exporter']}, sampled {report['sample_ratio']:g}, scrape every "
             f"{report['scrape_interval']:g} s (0: none) "
             f"(started {report['started_at']})",
             "pair  arm  completions/s  admissions/s  finalized/s  completion p50 ms  spans  scrapes  load"]
    for r in report["runs"]:
        scrapes = f"{r['scrape']['scrapes']} x {r['scrape']['scrape_ms_median']} ms" if r["scrape"] else "-"
        lines.append(f"{r['pair']:>4}  {r['arm']:<3}  {r['completions_per_s']:>13}  {r['admissions_per_s']:>12}  "
                     f"{r['finalized_per_s']:>11}  {r['completion_p50_ms']:>17}  {r['spans_exported']:>5}  "
                     f"{scrapes:>7}  {r['load_average']}")
    lines.append(f"on/off completions per pair: {report['on_over_off_by_pair']}; median {report['on_over_off_median']}"
                 f" -> overhead {report['overhead_pct']}% of throughput")
    lines.append(f"histogram observation (in both arms): {report['histogram_observe_us']} us each")
    lines.append(f"receiver: {report['receiver']}; state problems: {report['state_problems'] or 'none'}")
    return "\n".join(lines) + "\n"


class Overhead:
    """`bench overhead`: registered in bench/management/commands/bench.py's SUBCOMMANDS."""

    name = "overhead"
    help = ("Throughput of the hot-account mix with metrics and tracing on against off, in alternating pairs of "
            "runs on a throwaway database (issue 21: overhead <= 5%%).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--clients", type=int, default=2, help="client processes (default 2)")
        parser.add_argument("--seconds", type=float, default=10.0, help="duration of each run (default 10)")
        parser.add_argument("--pairs", type=int, default=4, help="pairs of off/on runs (default 4)")
        parser.add_argument("--scrape-interval", type=float, default=5.0,
                            help="seconds between scrapes in the on arm (default 5; Prometheus' default is 15)")
        parser.add_argument("--exporter", choices=("otlp", "drop", "none"), default="otlp",
                            help="on arm's tracing: OTLP/HTTP to the counting sink (default, as production), the SDK "
                                 "with a dropping exporter, or none (scrapes only); --scrape-interval 0: no scrapes")
        parser.add_argument("--sample-ratio", type=float, default=1.0,
                            help="on arm: the share of traces sampled (OTEL_TRACES_SAMPLER=parentbased_traceidratio; "
                                 "default 1.0: every delivery traced)")
        parser.add_argument("--json", metavar="FILE", help="write the JSON report to FILE")
        parser.add_argument("--check", action="store_true", help="exit non-zero if the overhead is above 5%%")
        parser.add_argument("--database-name", default=DEFAULT_DATABASE,
                            help=f"throwaway database (default {DEFAULT_DATABASE}; <name>_journal too)")
        parser.add_argument("--keep", action="store_true", help="keep the throwaway databases afterwards")

    def handle(self, command, options: dict) -> None:
        from django.core.management.base import CommandError
        from django.db import connections

        from bench.databases import NAME_RE, ThrowawayDatabases
        from connector.demo import build_world

        if options["clients"] < 1 or options["seconds"] < 1 or options["pairs"] < 1:
            raise CommandError("--clients, --seconds and --pairs must be at least 1")
        name = options["database_name"]
        if not NAME_RE.match(name) or not NAME_RE.match(f"{name}_journal"):
            raise CommandError(f"--database-name {name!r} must match {NAME_RE.pattern}")
        say = command.progress
        multiproc = tempfile.mkdtemp(prefix="bench-overhead-prom-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiproc  # the bench processes count as the web and workers do
        with ThrowawayDatabases([name], f"{name}_journal", keep=options["keep"], say=say) as databases:
            connections["default"] = databases.wrappers[name]
            say(f"database {name}: building the demo world (push=True) through the services")
            account_key = build_world("", push=True).accounts[0].account_key
            connections["default"].close()
            try:
                report = run_overhead(account_key=account_key, clients=options["clients"],
                                      seconds=options["seconds"], pairs=options["pairs"],
                                      interval=options["scrape_interval"], say=say,
                                      exporter=options["exporter"], sample_ratio=options["sample_ratio"])
            finally:
                shutil.rmtree(multiproc, ignore_errors=True)
        report["command"] = (f"manage.py bench overhead --clients {options['clients']} --seconds "
                             f"{options['seconds']:g} --pairs {options['pairs']} --scrape-interval "
                             f"{options['scrape_interval']:g} --exporter {options['exporter']} --sample-ratio "
                             f"{options['sample_ratio']:g}")
        if options["json"]:
            Path(options["json"]).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        command.stdout.write(format_report(report))
        if options["check"] and (report["overhead_pct"] is None or report["overhead_pct"] > 5.0
                                 or report["state_problems"]):
            raise CommandError(f"overhead {report['overhead_pct']}% (budget 5%); state: {report['state_problems']}")
