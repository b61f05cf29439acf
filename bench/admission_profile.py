"""`manage.py bench admission-profile`: the web process's own cost of one signed one-event delivery, in-process.

On a throwaway database (`--database-name`, default `connector_bench_admission` and `<name>_journal`) with the push
demo world, this calls the web server's WSGI application (`config.wsgi.application`, the callable gunicorn
serves) `--requests` times with a signed one-event POST to the admission endpoint, each its own key and record,
exactly as bench burst's clients send them, and reports per request:

- the CPU seconds of this process (`time.process_time`: the web worker's Python, not PostgreSQL's backend);
- the round trips of the process: statements psycopg sends (the connection health check's `SELECT 1` included),
  COMMITs/ROLLBACKs, Redis commands (the materialization wake);
- with `--stack both` (the default), the same through Django's whole handler as well (every middleware, DRF's
  ReceiptAdmitApi), the path every request took before the admission dispatch (D-540), side by side in one run.

Counts are load-insensitive; CPU seconds move a little with the machine's load (caches, frequency) and the
report carries the load average beside them. `--profile FILE` writes a cProfile of the measured requests
(`python -m pstats FILE`), `--top N` prints its N most expensive functions by cumulative time.
"""
from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import tempfile
import time
from pathlib import Path

DEFAULT_DATABASE = "connector_bench_admission"


class _Counter:
    """Round trips of this process, counted where they leave it: every statement psycopg sends (Django's cursors,
    the health check's `SELECT 1`, the connection's own `execute`), every COMMIT/ROLLBACK it sends, every Redis
    command."""

    def __init__(self) -> None:
        self.statements = self.commits = self.redis = 0
        self.saved: list[tuple[type, str, object]] = []

    def _wrap(self, cls: type, name: str, field: str) -> None:
        original = getattr(cls, name)
        counter = self

        def counted(*args, **kwargs):
            setattr(counter, field, getattr(counter, field) + 1)
            return original(*args, **kwargs)

        self.saved.append((cls, name, original))
        setattr(cls, name, counted)

    def __enter__(self) -> _Counter:
        import psycopg
        import redis

        self._wrap(psycopg.Cursor, "execute", "statements")
        self._wrap(psycopg.Connection, "commit", "commits")
        self._wrap(psycopg.Connection, "rollback", "commits")
        self._wrap(redis.Redis, "execute_command", "redis")
        return self

    def __exit__(self, *exc) -> None:
        for cls, name, original in reversed(self.saved):
            setattr(cls, name, original)


def _environ(path: str, body: bytes, headers: dict[str, str]) -> dict:
    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1", "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body), "wsgi.errors": io.StringIO(),
        "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False, "HTTP_HOST": "127.0.0.1:8000",
    }
    for name, value in headers.items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ


def measure(*, requests: int, stacks: list[str], warmup: int, profile_prefix: str | None, block: int = 25) -> dict:
    """Post `warmup` then `requests` signed one-event deliveries through each stack's WSGI callable, in alternating
    blocks of `block` requests, so a change of the machine's load reaches every stack alike."""
    from django.core.handlers.wsgi import WSGIHandler

    from config.wsgi import application
    from connector.demo import DEMO_CHANNEL, demo_event_body
    from connector.models import ConnectorAccount, CredentialGeneration
    from connector.secrets import secret_backend
    from connector.services.signatures import sign

    account = ConnectorAccount.objects.order_by("pk").first().account_key
    generation = CredentialGeneration.objects.get(generation_id=f"{account}.webhook-signing.g1")
    secret = secret_backend().read(generation.secret_version_ref)
    path = f"/api/v2/accounts/{account}/channels/{DEMO_CHANNEL}/receipts"
    began_tag = f"{int(time.time() * 1000):x}"
    state = {stack: {"app": WSGIHandler() if stack == "full" else application, "statuses": {}, "cpu": 0.0,
                     "wall": 0.0, "n": 0, "statements": 0, "commits": 0, "redis": 0,
                     # CPU attribution (process_time), not wall time: on a loaded machine wall time is mostly
                     # waiting for a core.
                     "profiler": cProfile.Profile(time.process_time) if profile_prefix else None}
             for stack in stacks}

    def post(stack: str, n: int) -> None:
        tag = f"{stack}-{began_tag}-{n}"
        body = demo_event_body(tag)
        headers = {"Idempotency-Key": f"prof-{tag}", "Connector-Signature": sign(secret, int(time.time()), body)}
        seen = {}

        def start_response(status, response_headers, exc_info=None):
            seen["status"] = status.split()[0]

        result = state[stack]["app"](_environ(path, body, headers), start_response)
        b"".join(result)
        if hasattr(result, "close"):
            result.close()
        statuses = state[stack]["statuses"]
        statuses[seen["status"]] = statuses.get(seen["status"], 0) + 1

    for stack in stacks:
        for n in range(warmup):
            post(stack, -1 - n)
        state[stack]["statuses"].clear()
    done = 0
    while done < requests:
        size = min(block, requests - done)
        for stack in stacks:
            entry = state[stack]
            with _Counter() as counter:
                began_cpu, began = time.process_time(), time.perf_counter()
                if entry["profiler"]:
                    entry["profiler"].enable()
                for n in range(done, done + size):
                    post(stack, n)
                if entry["profiler"]:
                    entry["profiler"].disable()
                entry["cpu"] += time.process_time() - began_cpu
                entry["wall"] += time.perf_counter() - began
            entry["n"] += size
            for field in ("statements", "commits", "redis"):
                entry[field] += getattr(counter, field)
        done += size
    out = {}
    for stack, entry in state.items():
        if entry["profiler"]:
            entry["profiler"].dump_stats(f"{profile_prefix}.{stack}")
        n = entry["n"]
        out[stack] = {"requests": n, "statuses": entry["statuses"], "cpu_ms_per_request": 1000 * entry["cpu"] / n,
                      "wall_ms_per_request": 1000 * entry["wall"] / n,
                      "statements_per_request": entry["statements"] / n,
                      "commits_per_request": entry["commits"] / n,
                      "postgres_round_trips_per_request": (entry["statements"] + entry["commits"]) / n,
                      "redis_commands_per_request": entry["redis"] / n}
    return out


class AdmissionProfile:
    """`bench admission-profile`: registered in bench/management/commands/bench.py's SUBCOMMANDS."""

    name = "admission-profile"
    help = ("The web process's CPU, statements and round trips per signed one-event delivery, through the WSGI "
            "application in-process and through Django's whole handler, side by side, on a throwaway database.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--requests", type=int, default=500, help="measured requests per stack (default 500)")
        parser.add_argument("--warmup", type=int, default=50, help="unmeasured requests first (default 50)")
        parser.add_argument("--stack", choices=["dispatch", "full", "both"], default="both",
                            help="dispatch: config.wsgi.application; full: Django's whole handler (default both)")
        parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the measured requests "
                                                              "(<FILE>.<stack>)")
        parser.add_argument("--top", type=int, default=0, help="print the N most expensive functions")
        parser.add_argument("--json", metavar="FILE", help="write the JSON report to FILE")
        parser.add_argument("--database-name", default=DEFAULT_DATABASE)
        parser.add_argument("--keep", action="store_true")

    def handle(self, command, options: dict) -> None:
        import logging

        from django.db import connections

        from bench.databases import ThrowawayDatabases
        from connector.demo import build_world

        say = command.progress
        logging.getLogger("connector").setLevel(logging.WARNING)
        logging.getLogger("django.request").setLevel(logging.ERROR)
        name = options["database_name"]
        stacks = ["full", "dispatch"] if options["stack"] == "both" else [options["stack"]]
        report = {"bench": "admission-profile", "load_average_before": list(os.getloadavg()), "stacks": {}}
        with ThrowawayDatabases([name], f"{name}_journal", keep=options["keep"], say=say) as databases:
            connections["default"] = databases.wrappers[name]
            say(f"database {name}: building the demo world (push=True)")
            build_world("", push=True)
            with connections["default"].cursor() as cursor:
                cursor.execute("ANALYZE")
            prefix = options["profile"] or (os.path.join(tempfile.gettempdir(), "admission") if options["top"]
                                            else None)
            report["stacks"] = measure(requests=options["requests"], stacks=stacks, warmup=options["warmup"],
                                       profile_prefix=prefix)
            if options["top"]:
                for stack in stacks:
                    out = io.StringIO()
                    pstats.Stats(f"{prefix}.{stack}", stream=out).sort_stats("cumulative").print_stats(options["top"])
                    command.stdout.write(out.getvalue())
            connections["default"].close()
        report["load_average_after"] = list(os.getloadavg())
        report["command"] = (f"manage.py bench admission-profile --requests {options['requests']} "
                             f"--stack {options['stack']}")
        for stack, figures in report["stacks"].items():
            command.stdout.write(
                f"{stack:>8}: {figures['cpu_ms_per_request']:.2f} ms CPU/request (web process), "
                f"{figures['statements_per_request']:.2f} statements + {figures['commits_per_request']:.2f} "
                f"commits to PostgreSQL, {figures['redis_commands_per_request']:.2f} Redis commands, wall "
                f"{figures['wall_ms_per_request']:.2f} ms; statuses {figures['statuses']}")
        command.stdout.write(f"load average before {report['load_average_before']} after "
                             f"{report['load_average_after']}")
        if options["json"]:
            Path(options["json"]).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
