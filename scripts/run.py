#!/usr/bin/env python3
"""Run the web server, the Celery workers (one per stage), Celery beat and the demo remote receiver together, in
the foreground.

    python scripts/run.py            # PORT=8000 by default; the web server is gunicorn (config/gunicorn.py)
    python scripts/run.py --dev      # or RUN_DEV_SERVER=1: Django's runserver instead, for development only

Each child runs in its own process group with this process's environment; its output is prefixed with
its name. Every child shares one PROMETHEUS_MULTIPROC_DIR (default .data/prometheus-multiproc, emptied at start),
so the web's /metrics sums the metrics every process counts (docs/operations.md). Ctrl-C (SIGINT), SIGTERM or
SIGHUP stops every child (SIGTERM to its process group, SIGKILL after 10 s) and exits 0. A child that exits on its
own is restarted alone, the others keep running (issue 37 item 5, D-411): after 1 s, doubling with each exit that
follows within RESTART_STABLE_SECONDS of its start, up to RESTART_MAX_DELAY; every exit and restart is printed with
its count. Standard library only.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRACE_SECONDS = 10.0
# Restarts (D-411): a child that ran at least this long before exiting is restarted after RESTART_FIRST_DELAY; each
# exit sooner than that after its (re)start doubles the delay, up to RESTART_MAX_DELAY. Never given up on: the
# others keep serving, and the log says what keeps failing.
RESTART_FIRST_DELAY = 1.0
# What is left of an exited child's process group (a Celery pool, gunicorn workers) has no leader to shut it down
# warmly: SIGTERM, then SIGKILL after this long, before the child is started again.
ORPHAN_GRACE_SECONDS = 3.0
RESTART_MAX_DELAY = 30.0
RESTART_STABLE_SECONDS = 30.0


def restart_delay(fast_exits: int) -> float:
    """Seconds before restarting a child after its `fast_exits`-th exit in a row (each within
    RESTART_STABLE_SECONDS of its start; 1 for an exit after a stable run)."""
    return min(RESTART_MAX_DELAY, RESTART_FIRST_DELAY * 2 ** max(0, fast_exits - 1))


def worker_pools(cpus: int | None = None) -> list[tuple[str, str, int]]:
    """(child name, queues, concurrency) of the Celery worker children: one worker process group per stage, so a
    backlog of one stage never waits in front of another's work (D-173). Sized to the machine: materialization,
    the execution stage (lane advance, claim, Runtime) and egress (mostly waiting on the provider) each get one
    process per core, at least 2; the sweepers and REST bulk delivery share one."""
    cpus = cpus or os.cpu_count() or 1
    return [
        ("worker-materialize", "materialize", max(2, cpus)),
        ("worker-claims", "claims,lanes", max(2, cpus)),
        ("worker-egress", "egress", max(2, cpus)),
        ("worker-sweeper", "sweeper,delivery", 1),
    ]


QUEUES = ",".join(queues for _, queues, _ in worker_pools())  # every queue some worker child consumes


def worker_children(cpus: int | None = None) -> list[tuple[str, list[str]]]:
    """The Celery worker children (name, argv). A single-process pool runs `--pool solo` (no forked child)."""
    py = sys.executable
    out = []
    for name, queues, concurrency in worker_pools(cpus):
        pool = ["--pool", "solo"] if concurrency == 1 else ["--pool", "prefork", "--concurrency", str(concurrency)]
        out.append((name, [py, "-m", "celery", "-A", "config", "worker", "-Q", queues, "-l", "INFO", *pool,
                           "-n", f"{name}@%h", "--without-gossip", "--without-mingle"]))
    return out


def describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def web_command(port: int, dev: bool = False) -> list[str]:
    """The web child: gunicorn with config/gunicorn.py (the production server, decision D-162); Django's
    runserver only when asked for explicitly (`--dev` or RUN_DEV_SERVER=1): it has a listen backlog of 10 and
    drains an oversized body instead of refusing it."""
    if dev:
        return [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
    return [sys.executable, "-m", "gunicorn", "-c", "python:config.gunicorn", "--bind", f"127.0.0.1:{port}"]


def dev_server_requested(argv: list[str], environ: dict[str, str]) -> bool:
    return "--dev" in argv or environ.get("RUN_DEV_SERVER", "").strip().lower() in {"1", "true", "yes", "on"}


def children(port: int, dev: bool = False) -> list[tuple[str, list[str]]]:
    py = sys.executable
    return [
        ("web", web_command(port, dev)),
        *worker_children(),
        ("beat", [py, "-m", "celery", "-A", "config", "beat", "-l", "INFO",
                  "--schedule", os.environ.get("RUN_BEAT_SCHEDULE", ".data/celerybeat-schedule")]),
        ("receiver", [py, "-m", "demo.receiver", "--port", os.environ.get("DEMO_RECEIVER_PORT", "8900")]),
    ]


def metrics_dir(environ: dict[str, str]) -> Path:
    """PROMETHEUS_MULTIPROC_DIR of every child (issue 21, D-231): one directory for the host, shared by the web
    workers and every worker group, so the web's /metrics (and any worker's own metrics port) sums every process.
    The environment's value if set, else .data/prometheus-multiproc."""
    return Path(environ.get("PROMETHEUS_MULTIPROC_DIR") or ROOT / ".data" / "prometheus-multiproc")


def prepare_metrics_dir(path: Path) -> Path:
    """Create the directory and remove the metric files of an earlier run (prometheus-client's multiprocess mode
    requires an empty directory at start: a dead process's files are summed in for ever). Only its `*.db` files
    are removed, so a directory named by mistake loses nothing else."""
    path.mkdir(parents=True, exist_ok=True)
    for entry in path.glob("*.db"):
        entry.unlink()
    return path


class Supervisor:
    def __init__(self, port: int, dev: bool = False) -> None:
        self.port = port
        self.dev = dev
        self.commands = dict(children(port, dev))
        self.procs: dict[str, subprocess.Popen] = {}
        self.started_at: dict[str, float] = {}
        self.fast_exits: dict[str, int] = {name: 0 for name in self.commands}
        self.restart_at: dict[str, float] = {}  # name -> monotonic time of its pending restart
        self.restarts: dict[str, int] = {name: 0 for name in self.commands}
        self.pumps: list[threading.Thread] = []
        self.width = max(len(name) for name, _ in children(port))
        self.out_lock = threading.Lock()
        self.signalled: int | None = None
        self.hurry = False
        self.env: dict[str, str] = {}

    # ------------------------------------------------------------------ output
    def emit(self, name: str, text: str) -> None:
        with self.out_lock:
            sys.stdout.write(f"{name:<{self.width}} | {text}\n")
            sys.stdout.flush()

    def note(self, text: str) -> None:
        self.emit("run", text)

    def _pump(self, name: str, stream) -> None:
        for raw in iter(stream.readline, b""):
            self.emit(name, raw.decode(errors="replace").rstrip("\r\n"))
        stream.close()

    # ----------------------------------------------------------------- signals
    def _on_signal(self, signum, _frame) -> None:
        if self.signalled is not None:
            self.hurry = True  # a second Ctrl-C: don't wait for the grace period
        self.signalled = signum

    # ------------------------------------------------------------------- start
    def start(self) -> None:
        (ROOT / ".data").mkdir(exist_ok=True)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.env["PROMETHEUS_MULTIPROC_DIR"] = str(prepare_metrics_dir(metrics_dir(os.environ)))
        for name in self.commands:
            self.spawn(name)

    def spawn(self, name: str) -> None:
        cmd = self.commands[name]
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, process_group=0,
        )
        self.procs[name] = proc
        self.started_at[name] = time.monotonic()
        again = f" (restart {self.restarts[name]})" if self.restarts[name] else ""
        self.note(f"started {name}{again} (pid {proc.pid}): {' '.join(cmd[1:])}")
        pump = threading.Thread(target=self._pump, args=(name, proc.stdout), daemon=True)
        pump.start()
        self.pumps = [p for p in self.pumps if p.is_alive()] + [pump]

    def web_ready(self) -> bool:
        """`/readyz` answers 200: a web worker has loaded the app and reached the databases (gunicorn listens
        before its workers are ready, so an open port is not enough)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as answer:
                return answer.status == 200
        except (OSError, ValueError):
            return False

    # ----------------------------------------------------------------- restart
    def exited(self, name: str, code: int, now: float) -> None:
        """A child exited on its own: stop what is left of its process group (a Celery pool, gunicorn's workers),
        then schedule its restart after the backoff (D-411). The others keep running."""
        ran = now - self.started_at[name]
        self.fast_exits[name] = self.fast_exits[name] + 1 if ran < RESTART_STABLE_SECONDS else 1
        delay = restart_delay(self.fast_exits[name])
        self._stop_groups({name: self.procs[name].pid}, grace=ORPHAN_GRACE_SECONDS)
        row = (f", {self.fast_exits[name]} times in a row within {RESTART_STABLE_SECONDS:.0f} s of its start"
               if self.fast_exits[name] > 1 else "")
        self.note(f"{name} {describe(code)} on its own after {ran:.1f} s{row}; restarting it in {delay:.0f} s "
                  f"(the others keep running)")
        self.restart_at[name] = time.monotonic() + delay

    def restart_due(self, now: float) -> None:
        for name, due in list(self.restart_at.items()):
            if now >= due:
                del self.restart_at[name]
                self.restarts[name] += 1
                self.spawn(name)

    # -------------------------------------------------------------------- stop
    @staticmethod
    def _group_alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _stop_groups(self, groups: dict[str, int], grace: float) -> None:
        """SIGTERM to each process group (process_group=0: pgid == the child's pid), SIGKILL to what is left after
        `grace` seconds."""
        for pgid in groups.values():
            if self._group_alive(pgid):
                try:
                    os.killpg(pgid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not self.hurry:
            for name in groups:
                self.procs[name].poll()  # reap leaders so their groups can disappear
            if not any(self._group_alive(pgid) for pgid in groups.values()):
                break
            time.sleep(0.1)
        for name, pgid in groups.items():
            if self._group_alive(pgid):
                self.note(f"{name} did not stop within {grace:.0f}s: SIGKILL")
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stop_all(self) -> None:
        self._stop_groups({name: proc.pid for name, proc in self.procs.items()}, grace=GRACE_SECONDS)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for pump in self.pumps:
            pump.join(timeout=1)

    # --------------------------------------------------------------------- run
    def run(self) -> int:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        self.start()
        announced = False
        while self.signalled is None:
            now = time.monotonic()
            for name, proc in self.procs.items():
                if name not in self.restart_at and proc.poll() is not None:
                    self.exited(name, proc.returncode, now)
            self.restart_due(time.monotonic())
            if not announced and self.web_ready():
                announced = True
                self.note(f"Admin: http://127.0.0.1:{self.port}/admin/   Governance: http://127.0.0.1:{self.port}/")
            time.sleep(0.2)
        self.note(f"received {signal.Signals(self.signalled).name}; stopping web, workers, beat and the demo receiver")
        self.stop_all()
        self.note("all stopped")
        return 0


# The ports `make run` listens on, each with the variable that moves it.
PORTS = (("PORT", "8000", "the web server"), ("DEMO_RECEIVER_PORT", "8900", "the demo CRM receiver"))


def taken_ports(environ: dict[str, str]) -> list[str]:
    """One line per port of PORTS that is not a number or where something already listens, naming its variable."""
    problems = []
    for variable, default, what in PORTS:
        raw = environ.get(variable, default)
        try:
            port = int(raw)
        except ValueError:
            problems.append(f"{variable}={raw!r} ({what}) is not a number")
            continue
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                problems.append(f"something already listens on 127.0.0.1:{port} ({what}): stop it, or move it with "
                                f"{variable}=<free port> (e.g. make run {variable}={port + 1})")
        except OSError:
            pass
    return problems


def main(argv: list[str] | None = None) -> int:
    """`run.py [--dev]` runs everything; `run.py --check-ports` only checks the ports (make run's first step, before
    minutes of setup)."""
    argv = sys.argv[1:] if argv is None else argv
    unknown = [arg for arg in argv if arg not in ("--dev", "--check-ports")]
    if unknown:
        print(f"run.py: unknown argument(s) {' '.join(unknown)}; the options are --dev and --check-ports",
              file=sys.stderr)
        return 2
    problems = taken_ports(dict(os.environ))
    for problem in problems:
        print(f"run.py: {problem}", file=sys.stderr)
    if problems or "--check-ports" in argv:
        return 2 if problems else 0
    port = int(os.environ.get("PORT", "8000"))
    return Supervisor(port, dev_server_requested(argv, dict(os.environ))).run()


if __name__ == "__main__":
    sys.exit(main())
