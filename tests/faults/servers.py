"""Private servers and real child processes for the fault tests and the process harness.

PostgreSQL and Redis are started through scripts/services.py's own classes (PrivatePostgres, PrivateRedis) on a
spare loopback port under .data/, so the machine's shared servers are never stopped or restarted; every server
and process started here is stopped (and its directory removed) by its owner fixture."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest

from scripts import services as svc
from tests import dbroles
from tests.support import deadline, scaled, wait_for, whole_seconds

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    return svc.free_loopback_port()


def wait_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:`port` (or `proc` died); `timeout` is scaled by
    the suite's time factor (tests/support.py)."""

    def listening() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    wait_for(listening, timeout, f"something listening on 127.0.0.1:{port}", proc=proc)


def _remove_home(home: Path) -> None:
    """Remove a private server's directory (it may be a symlink to a /tmp directory, see scripts/services.py)."""
    if home.is_symlink():
        target = home.resolve()
        home.unlink()
        shutil.rmtree(target, ignore_errors=True)
    else:
        shutil.rmtree(home, ignore_errors=True)


class RedisServer:
    """A private Redis on a spare loopback port (scripts/services.py PrivateRedis)."""

    def __init__(self) -> None:
        self.binary = svc.find_redis_server()
        if self.binary is None:
            pytest.skip("no redis-server binary on this machine")
        self.port = free_port()
        self.server = svc.PrivateRedis(self.port)
        self.started = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        """Start it (again, on the same port, after `stop`). A first start whose port another run took between
        `free_port` and the bind (two suites side by side) moves to a fresh port."""
        for _ in range(3):
            self.server.start(self.binary, "127.0.0.1")
            wait_port(self.port, 10)
            if self._ours():
                self.started = True
                return self
            if self.started:
                break
            _remove_home(self.server.home)
            self.port = free_port()
            self.server = svc.PrivateRedis(self.port)
        raise AssertionError(f"another server answers on 127.0.0.1:{self.port}, not the one started in "
                             f"{self.server.home}")

    def _ours(self) -> bool:
        """The Redis answering on the port works in this server's directory (not another run's server)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=scaled(2)) as sock:
                sock.sendall(svc._resp("CONFIG", "GET", "dir"))
                reply = b""
                while str(self.server.home.resolve()).encode() not in reply:
                    chunk = sock.recv(4096)
                    if not chunk:
                        return False
                    reply += chunk
                return True
        except OSError:
            return False

    def stop(self) -> None:
        self.server.stop()

    def cleanup(self) -> None:
        self.server.stop()
        _remove_home(self.server.home)


class PostgresServer:
    """A private PostgreSQL on a spare loopback port (scripts/services.py PrivatePostgres): initdb, start, fast
    restart with pg_ctl as the postgres user (as scripts/services.py runs it), stop, remove."""

    def __init__(self) -> None:
        self.bindir = svc.find_pg_bindir()
        if self.bindir is None:
            pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl, postgres) on this machine")
        try:
            self.runas = svc.RunAs.for_postgres()
        except svc.Fatal as exc:
            pytest.skip(str(exc))
        self.port = free_port()
        self.server = svc.PrivatePostgres(self.port)

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/connector"

    @property
    def journal_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/connector_journal"

    def start(self, *, durable: bool = True) -> "PostgresServer":
        """initdb (durable as scripts/services.py configures it, or with fsync, full_page_writes and
        synchronous_commit off for `durable=False`) and start; when another run took the port between `free_port`
        and the bind (pg_ctl fails), again on a fresh port."""
        for attempt in range(3):
            self.server.initdb(self.bindir, self.runas, "postgres", durable=durable)
            try:
                self.server.start(self.bindir, self.runas)
                break
            except svc.Fatal:
                if attempt == 2:
                    raise
                _remove_home(self.server.home)
                self.port = free_port()
                self.server = svc.PrivatePostgres(self.port)
        svc.ensure_databases(self.url, self.journal_url)
        return self

    def restart(self) -> float:
        """`pg_ctl restart -m fast`: terminates every session, then starts again; returns the seconds taken."""
        began = time.monotonic()
        home = self.server.home.resolve()
        result = self.runas.run([str(self.bindir / "pg_ctl"), "-D", str(home / "data"), "-l",
                                 str(home / "postgres.log"), "-m", "fast", "-w", "-t", "30", "restart"], cwd=home)
        assert result.returncode == 0, result.stdout + result.stderr
        return time.monotonic() - began

    def pg_ctl(self, *args: str) -> None:
        """`pg_ctl <args>` on this server's data directory, as the postgres user."""
        home = self.server.home.resolve()
        result = self.runas.run([str(self.bindir / "pg_ctl"), "-D", str(home / "data"), "-l",
                                 str(home / "postgres.log"), "-w", "-t", "30", *args], cwd=home)
        assert result.returncode == 0, result.stdout + result.stderr

    def crash_stop(self) -> None:
        """`pg_ctl stop -m immediate`: every session is cut at once, no shutdown checkpoint (a crash)."""
        self.pg_ctl("-m", "immediate", "stop")

    def start_again(self) -> None:
        """`pg_ctl start` after `crash_stop`: crash recovery, then the server accepts connections again."""
        self.pg_ctl("start")

    def crash_and_restart(self) -> None:
        """`pg_ctl stop -m immediate` (every server process quits at once, no checkpoint: the next start recovers
        from the WAL, as after a crash), then start again."""
        self.crash_stop()
        self.server.start(self.bindir, self.runas)

    def cleanup(self) -> None:
        self.server.stop()
        _remove_home(self.server.home)


# -- child processes ----------------------------------------------------------------------------------------------

def database_url(settings_dict: dict, name: str) -> str:
    user = quote(settings_dict.get("USER") or "postgres", safe="")
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{quote(password, safe='')}" if password else user
    return f"postgres://{auth}@{settings_dict.get('HOST') or '127.0.0.1'}:{settings_dict.get('PORT') or 5432}/{name}"


def run_database_env() -> dict[str, str]:
    """DATABASE_URL and JOURNAL_DATABASE_URL naming this test run's databases (built from django.db.connections)."""
    from django.db import connections

    default = connections["default"].settings_dict
    journal = connections["journal"].settings_dict
    assert default["NAME"] == default["TEST"]["NAME"], "the test database is not set up"
    return {"DATABASE_URL": database_url(default, default["NAME"]),
            "JOURNAL_DATABASE_URL": database_url(journal, journal["TEST"]["NAME"]), **dbroles.child_env()}



def child_environment(*, secret_dir: str, **extra: str) -> dict[str, str]:
    """The environment of a child Django process: test settings, the project on PYTHONPATH, the secret backend
    directory, no inherited fault point or database URLs, plus `extra`."""
    drop = ("CONNECTOR_FAULT_POINT", "DATABASE_URL", "JOURNAL_DATABASE_URL", "REDIS_URL", "TEST_DB_SUFFIX",
            "DJANGO_SETTINGS_MODULE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({"DJANGO_SETTINGS_MODULE": "config.django.test", "CONNECTOR_SECRET_DIR": secret_dir,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
                "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


@dataclass
class Child:
    """One long-running child process (web server, Celery worker, load loop) with its output in a file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_dir: Path
    proc: subprocess.Popen | None = None
    generation: int = 0
    logs: list[Path] = field(default_factory=list)

    def start(self) -> "Child":
        self.generation += 1
        log = self.log_dir / f"{self.name}.{self.generation}.log"
        self.logs.append(log)
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait(self, timeout: float) -> int:
        """Its exit code, once it exits within `timeout` seconds (scaled: tests/support.py)."""
        limit = deadline(timeout)
        try:
            return self.proc.wait(timeout=limit.seconds)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {limit.describe()}:\n{self.output()}") from None

    def output(self) -> str:
        return self.logs[-1].read_text(errors="replace")[-6000:] if self.logs else ""

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM to its process group, SIGKILL after `grace` seconds; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            return self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(timeout=scaled(5))


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python manage.py <args>` in a child process (`timeout` scaled: tests/support.py)."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=scaled(timeout), check=False)


def check_invariants(env: dict[str, str]) -> dict:
    """Run `manage.py check_invariants --json` as an operator would; returns the report (asserts it parsed)."""
    run = manage(env, "check_invariants", "--json")
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"check_invariants printed no JSON (exit {run.returncode}):\n{run.stdout}\n"
                             f"{run.stderr}") from None
    assert (run.returncode == 0) == report["ok"], (run.returncode, report)
    return report


# -- the web process ------------------------------------------------------------------------------------------------

def web_child(env: dict[str, str], port: int, log_dir: Path, *, dev: bool = False) -> Child:
    """The web process exactly as `make run` starts it (scripts/run.py `web_command`): gunicorn with
    config/gunicorn.py, or Django's runserver with `dev=True`."""
    from scripts.run import web_command

    return Child("web", web_command(port, dev), env, log_dir)


def wait_web_workers(web: Child, timeout: float = 90.0) -> int:
    """Wait until every gunicorn worker the web process forked has loaded the app (config/gunicorn.py logs
    "Worker ready" from post_worker_init); returns how many there are (`timeout` scaled: tests/support.py)."""
    limit = deadline(timeout)
    while True:
        if web.proc.poll() is not None:
            raise AssertionError(f"web process exited with {web.proc.returncode}:\n{web.output()}")
        log = web.logs[-1].read_text(errors="replace")
        booted, ready = log.count("Booting worker with pid"), log.count("Worker ready (pid")
        if booted and ready >= booted:
            return ready
        if limit.passed():
            raise AssertionError(f"gunicorn workers not ready after {limit.describe()}:\n{web.output()}")
        time.sleep(0.2)


def wait_http(port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until the server on 127.0.0.1:`port` answers an HTTP request (gunicorn listens before its workers have
    loaded the app; a request sent then waits in the backlog). `timeout` is scaled (tests/support.py)."""
    limit = deadline(timeout)

    def answers() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.settimeout(max(0.5, limit.remaining()))
                sock.sendall(b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                return sock.recv(12).startswith(b"HTTP/1.")
        except OSError:
            return False

    while not answers():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"web process exited with {proc.returncode} before answering on {port}")
        limit.check(f"an HTTP answer on 127.0.0.1:{port}")
        time.sleep(0.1)


# -- the processes of `make run` ----------------------------------------------------------------------------------

def make_run_commands(port: int, *, receiver_port: int, beat_schedule: Path) -> dict[str, list[str]]:
    """The argv of each process `make run` starts (scripts/run.py `children`: web, worker, beat, receiver), for
    tests that drive the product over HTTP against the real server. The one place a test takes its server command
    from, so a change of web server in scripts/run.py (runserver -> gunicorn) reaches these tests too. Beat keeps
    its schedule file in `beat_schedule` instead of the checkout's .data/."""
    from scripts import run

    saved = os.environ.get("DEMO_RECEIVER_PORT")
    os.environ["DEMO_RECEIVER_PORT"] = str(receiver_port)
    try:
        commands = {name: list(argv) for name, argv in run.children(port)}
    finally:
        if saved is None:
            os.environ.pop("DEMO_RECEIVER_PORT", None)
        else:
            os.environ["DEMO_RECEIVER_PORT"] = saved
    beat = commands.get("beat", [])
    if "--schedule" in beat:
        beat[beat.index("--schedule") + 1] = str(beat_schedule)
    return commands


def web_server_command(port: int) -> list[str]:
    """The web server command of `make run` on `port` (see make_run_commands)."""
    return make_run_commands(port, receiver_port=0, beat_schedule=Path(os.devnull))["web"]


@contextlib.contextmanager
def product_processes(*, secret_dir: str, redis_url: str, log_dir: Path, **extra_env: str):
    """Every process `make run` starts (scripts/run.py `children`: the demo CRM receiver, web, one Celery worker
    group per stage, beat) against this run's test databases; the CRM keeps its journal in `log_dir`. Yields {"url",
    "crm", "children"}; stops them all."""
    port, receiver_port = free_port(), free_port()
    commands = make_run_commands(port, receiver_port=receiver_port, beat_schedule=log_dir / "beat-schedule")
    env = child_environment(secret_dir=secret_dir, REDIS_URL=redis_url,
                            CONNECTOR_EGRESS_BASE_URL=f"http://127.0.0.1:{receiver_port}",
                            CONNECTOR_EGRESS_TIMEOUT_SECONDS=str(whole_seconds(5)),
                            DEMO_RECEIVER_JOURNAL=str(log_dir / "demo-crm.jsonl"),  # this test's CRM (D-440)
                            **run_database_env(), **extra_env)
    started = []
    try:
        # receiver and web first (waited on below), then each stage's worker group and beat
        names = ["receiver", "web"] + [name for name in commands if name not in ("receiver", "web")]
        for name in names:
            started.append(Child(name, commands[name], env, log_dir).start())
        wait_port(receiver_port, 30, started[0].proc)
        wait_port(port, 60, started[1].proc)
        yield {"url": f"http://127.0.0.1:{port}", "port": port, "crm": f"http://127.0.0.1:{receiver_port}",
               "children": started}
    finally:
        for child in started:
            child.stop()


def point_celery_at(app, url: str) -> None:
    """Point the Celery app's publishing at another broker URL. Celery's connection pool is kombu's process-wide
    pool for that URL: force-closing it leaves a closed pool registered, which a later publish to the same URL
    would acquire from ("Acquire on closed pool"). `kombu.pools.reset()` closes and forgets every pool, so the next
    publish, whatever its URL, builds a fresh one."""
    from kombu import pools

    app.conf.broker_url = url
    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
