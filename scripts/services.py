#!/usr/bin/env python3
"""Make PostgreSQL and Redis reachable for this project, or stop the private ones it started.

    python scripts/services.py ensure   # find or start servers, write .data/services.env
    python scripts/services.py ensure --test   # the same for the test suite: our private PostgreSQL non-durable
    python scripts/services.py stop     # stop the private servers under .data/ (nothing else)
    python scripts/services.py env      # print .data/services.env

Resolution order, for each service:
  (a) DATABASE_URL / REDIS_URL from the environment, if set and a server answers there;
  (b) if set, nothing listens, and the host is loopback: a private server on exactly that host:port;
  (c) if unset: the local server on the standard port (postgres@127.0.0.1:5432/connector, 127.0.0.1:6379/0);
  (d) otherwise a private server on a free loopback port.

Private servers live under .data/pg/<port>/ and .data/redis/<port>/ (data, logs, unix sockets, pid files),
listen on loopback only, trust local connections and run detached. A second `ensure` reuses them.

DATABASE_URL (or DATABASE_ADMIN_URL, once .data/services.env is loaded) is the administrator's: with it `ensure`
creates the owner and application roles (connector/dbroles.py), makes the owner own both databases and every
object in them, and writes the three roles' URLs to .data/services.env (docs/security.md "Database roles").

Standard library only, except psycopg (imported lazily, by `ensure` only).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".data"
ENV_FILE = DATA / "services.env"
LOCK_FILE = DATA / ".services.lock"
PG_ROOT = DATA / "pg"
REDIS_ROOT = DATA / "redis"

STANDARD_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/connector"
STANDARD_REDIS_URL = "redis://127.0.0.1:6379/0"
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
PG_SCHEMES = {"postgres", "postgresql", "pgsql", "postgis"}
REDIS_SCHEMES = {"redis", "rediss"}
CONFIG_MARKER = "# --- private development server settings written by scripts/services.py ---"
WAIT_SECONDS = 30.0
# A private server commits durably (issue 37 item 4, D-410): `make run` answers 201s that must survive a crash.
DURABILITY_SETTINGS = ("fsync", "full_page_writes", "synchronous_commit")


def durability_lines(durable: bool) -> list[str]:
    if durable:
        return ["# every commit survives a crash (D-410); the test suite's own sessions may turn "
                "synchronous_commit off", *(f"{name} = on" for name in DURABILITY_SETTINGS)]
    return ["# the test suite's server (`ensure --test`, no other database in use): durability traded for speed",
            *(f"{name} = off" for name in DURABILITY_SETTINGS)]


CONNECT_TIMEOUT = 3
SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
INSTALL_HINT = {"postgres": "postgresql", "redis": "redis-server"}


class Fatal(Exception):
    """Stop with a message and an exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def say(message: str) -> None:
    print(message, flush=True)


def progress(message: str) -> None:
    print(f"services: {message}", file=sys.stderr, flush=True)


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(f"    {line}" for line in text[-lines:]) or "    (log is empty)"


# --------------------------------------------------------------------------------------------- URLs


@dataclass
class Endpoint:
    url: str
    scheme: str
    host: str | None
    port: int
    user: str | None
    password: str | None
    db: str

    @property
    def is_loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS

    @property
    def where(self) -> str:
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def masked(self) -> str:
        if not self.password:
            return self.url
        parts = urlsplit(self.url)
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1) if parts.password else parts.netloc
        return urlunsplit(parts._replace(netloc=netloc))


def parse_url(url: str, kind: str) -> Endpoint:
    parts = urlsplit(url)
    schemes = PG_SCHEMES if kind == "postgres" else REDIS_SCHEMES
    if parts.scheme not in schemes:
        name = "DATABASE_URL" if kind == "postgres" else "REDIS_URL"
        raise Fatal(f"{name}={url!r}: expected a {'/'.join(sorted(schemes))}:// URL", 2)
    default_port = 5432 if kind == "postgres" else 6379
    try:
        port = parts.port or default_port
    except ValueError as exc:
        raise Fatal(f"{url!r}: {exc}", 2) from None
    path = unquote(parts.path.lstrip("/"))
    if kind == "postgres":
        db = path or "connector"
    else:
        db = path or "0"
    return Endpoint(
        url=url,
        scheme=parts.scheme,
        host=parts.hostname or ("127.0.0.1" if kind == "redis" else None),
        port=port,
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        db=db,
    )


def journal_url_for(database_url: str) -> str:
    """Same rule as config.env.journal_url_for: `<name>_journal` on the same server."""
    parts = urlsplit(database_url)
    name = parts.path.lstrip("/") or "connector"
    return urlunsplit(parts._replace(path="/" + name + "_journal"))


def loopback_url(kind: str, port: int, host: str = "127.0.0.1", user: str = "postgres") -> str:
    netloc_host = f"[{host}]" if ":" in host else host
    if kind == "postgres":
        return f"postgres://{user}@{netloc_host}:{port}/connector"
    return f"redis://{netloc_host}:{port}/0"


# ----------------------------------------------------------------------------------------- probing


def tcp_listening(host: str | None, port: int, timeout: float = 1.0) -> bool:
    if not host or host.startswith("/"):
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return not tcp_listening(host, port, timeout=0.5)


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Probe:
    ok: bool
    listening: bool
    error: str = ""


def _psycopg():
    try:
        import psycopg  # noqa: PLC0415 - only `ensure` needs it
    except ImportError:
        raise Fatal(
            "psycopg is not importable by this Python "
            f"({sys.executable}); run it with the project's virtualenv (make venv; .venv/bin/python).",
            2,
        ) from None
    return psycopg


def pg_connect(url: str, dbname: str = "postgres"):
    """Autocommit connection to a maintenance database of the server named by `url`."""
    psycopg = _psycopg()
    scheme, rest = url.split("://", 1)
    conninfo = "postgresql://" + rest
    last: Exception | None = None
    for candidate in (dbname, "template1") if dbname == "postgres" else (dbname,):
        try:
            return psycopg.connect(conninfo, dbname=candidate, connect_timeout=CONNECT_TIMEOUT, autocommit=True)
        except psycopg.OperationalError as exc:
            last = exc
            if "does not exist" not in str(exc):
                break
    assert last is not None
    raise last


def pg_probe(endpoint: Endpoint) -> Probe:
    psycopg = _psycopg()
    try:
        with pg_connect(endpoint.url) as conn:
            conn.execute("SELECT 1")
        return Probe(True, True)
    except psycopg.Error as exc:
        message = " ".join(str(exc).split())
        return Probe(False, tcp_listening(endpoint.host, endpoint.port), message)


def _resp(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _readline(sock: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").strip()


def redis_probe(endpoint: Endpoint, timeout: float = 2.0) -> Probe:
    """Raw-socket PING (AUTH first when the URL carries a password)."""
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except OSError as exc:
        return Probe(False, False, str(exc))
    try:
        sock.settimeout(timeout)
        if endpoint.scheme == "rediss":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=endpoint.host)
        if endpoint.password:
            auth = (endpoint.user, endpoint.password) if endpoint.user else (endpoint.password,)
            sock.sendall(_resp("AUTH", *auth))
            reply = _readline(sock)
            if not reply.startswith("+"):
                return Probe(False, True, f"AUTH answered {reply!r}")
        sock.sendall(_resp("PING"))
        reply = _readline(sock)
        if reply == "+PONG":
            return Probe(True, True)
        return Probe(False, True, f"PING answered {reply!r}")
    except OSError as exc:
        return Probe(False, True, str(exc))
    finally:
        sock.close()


# ------------------------------------------------------------------------------ processes, binaries


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def pid_runs(pid: int, *needles: str) -> bool:
    """The process exists and its command line mentions every needle.

    This guards against recycled pids: a pid file left by a crash must never make us signal an unrelated
    process, such as the machine's own PostgreSQL or Redis.
    """
    if pid <= 0 or not pid_alive(pid) or is_zombie(pid):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    try:
        text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return True  # no /proc: trust the pid
    return all(needle in text for needle in needles)


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", path.parent.name)) or (0,)


def find_pg_bindir(prefer_version: str | None = None) -> Path | None:
    """Directory holding initdb, pg_ctl and postgres: PATH first, then /usr/lib/postgresql/*/bin (highest)."""
    needed = ("initdb", "pg_ctl", "postgres")

    def complete(d: Path) -> bool:
        return all(os.access(d / n, os.X_OK) for n in needed)

    if prefer_version:
        preferred = Path("/usr/lib/postgresql") / prefer_version / "bin"
        if complete(preferred):
            return preferred
    for name in needed:
        found = shutil.which(name)
        if found:
            for d in (Path(found).parent, Path(found).resolve().parent):
                if complete(d):
                    return d
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True):
        if complete(d):
            return d
    return None


def find_redis_server() -> str | None:
    for candidate in (shutil.which("redis-server"), "/usr/sbin/redis-server", "/usr/local/bin/redis-server"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class RunAs:
    """postgres refuses to run as root: as root, run its programs as the `postgres` system user."""

    kwargs: dict = field(default_factory=dict)
    env: dict = field(default_factory=lambda: dict(os.environ))
    uid: int | None = None
    gid: int | None = None

    @classmethod
    def for_postgres(cls) -> "RunAs":
        if not IS_ROOT:
            return cls()
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise Fatal(
                "running as root, and PostgreSQL refuses to run as root, but there is no `postgres` system user "
                "to run a private server as. Create one (useradd --system postgres), run as a normal user, "
                "or set DATABASE_URL to a running server.",
                2,
            ) from None
        env = dict(os.environ, HOME=pw.pw_dir, USER="postgres", LOGNAME="postgres")
        kwargs = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        return cls(kwargs=kwargs, env=env, uid=pw.pw_uid, gid=pw.pw_gid)

    def run(self, cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            cmd, cwd=cwd, env=self.env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            start_new_session=True, **self.kwargs, **kw,
        )

    def chown(self, path: Path) -> None:
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)

    def can_write(self, path: Path) -> bool:
        if self.uid is None:
            return os.access(path, os.W_OK | os.X_OK)
        return self.run(["test", "-w", str(path), "-a", "-x", str(path)], cwd=Path("/")).returncode == 0


def make_traversable(path: Path) -> None:
    """Our own .data folders must be enterable by the postgres user when we are root."""
    if IS_ROOT:
        mode = path.stat().st_mode
        if mode & 0o011 != 0o011:
            path.chmod((mode | 0o011) & 0o7777)


# -------------------------------------------------------------------------------- private postgres


class PrivatePostgres:
    def __init__(self, port: int) -> None:
        self.port = port
        self.home = PG_ROOT / str(port)
        self.data = self.home / "data"
        self.log = self.home / "postgres.log"
        self.pidfile = self.data / "postmaster.pid"

    @classmethod
    def all(cls) -> list["PrivatePostgres"]:
        if not PG_ROOT.is_dir():
            return []
        return [cls(int(p.name)) for p in sorted(PG_ROOT.iterdir()) if p.name.isdigit()]

    @property
    def initialised(self) -> bool:
        conf = self.data / "postgresql.conf"
        try:
            return (self.data / "PG_VERSION").exists() and CONFIG_MARKER in conf.read_text()
        except OSError:
            return False

    @property
    def pid(self) -> int | None:
        pid = read_pid(self.pidfile)
        # the postmaster's command line is `postgres -D <our data dir>`
        return pid if pid and pid_runs(pid, "postgres", str(self.home.resolve() / "data")) else None

    def clear_stale_pidfile(self) -> None:
        """A postmaster that died without cleaning up leaves postmaster.pid and the socket lock file behind."""
        stale = read_pid(self.pidfile)
        if not self.pidfile.exists() or self.pid is not None:
            return
        # (postgres itself would refuse to start while a dead-but-unreaped pid is named in its lock files)
        progress(f"removing stale pid file {rel(self.pidfile)}")
        self.pidfile.unlink(missing_ok=True)
        for lock in self.home.glob(".s.PGSQL.*.lock"):
            if read_pid(lock) == stale:
                lock.unlink(missing_ok=True)

    def _prepare_home(self, runas: RunAs) -> None:
        """Create .data/pg/<port>/ owned by the server's user; as root, fall back to /tmp if it can't reach it."""
        if self.home.is_symlink() and not self.home.exists():
            self.home.unlink()  # its /tmp target was cleaned away
        if self.home.exists():
            return
        for d in (DATA, PG_ROOT):
            d.mkdir(exist_ok=True)
            make_traversable(d)
        self.home.mkdir(mode=0o700)
        runas.chown(self.home)
        if runas.can_write(self.home):
            return
        # As root, the postgres user cannot enter the project (e.g. a clone under /root, mode 0700).
        self.home.rmdir()
        digest = hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]
        outside = Path(tempfile.gettempdir()) / f"connector-pg-{digest}" / str(self.port)
        outside.parent.mkdir(mode=0o755, exist_ok=True)
        outside.parent.chmod(0o755)
        outside.mkdir(mode=0o700, exist_ok=True)
        runas.chown(outside)
        self.home.symlink_to(outside, target_is_directory=True)
        progress(
            f"the postgres user cannot enter {ROOT} (a parent directory is not world-executable); "
            f"{rel(self.home)} is a symlink to {outside}"
        )

    def initdb(self, bindir: Path, runas: RunAs, user: str, durable: bool = True) -> float:
        """initdb, then our settings appended to postgresql.conf: durable unless `durable=False`, which only a test
        harness passes (a server it starts and removes itself, D-410)."""
        self._prepare_home(runas)
        if self.data.exists():
            progress(f"{rel(self.data)} is incomplete (interrupted initdb?); recreating it")
            shutil.rmtree(self.data)
        started = time.monotonic()
        home = self.home.resolve()
        result = runas.run(
            [str(bindir / "initdb"), "-D", str(home / "data"), "-U", user, "-A", "trust",
             "-E", "UTF8", "--locale=C", "--no-sync"],
            cwd=home,
        )
        (home / "initdb.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise Fatal(f"initdb failed for {rel(self.data)} (exit {result.returncode}):\n{tail(home / 'initdb.log')}")
        sock_dir = str(home)
        if len(f"{sock_dir}/.s.PGSQL.{self.port}") > SOCKET_PATH_MAX:
            sock_dir = ""  # path too long for a unix socket: TCP only (never fall back to /var/run)
        settings = "\n".join([
            "",
            CONFIG_MARKER,
            "listen_addresses = '127.0.0.1'",
            f"port = {self.port}",
            f"unix_socket_directories = '{sock_dir}'",
            "logging_collector = off",
            *durability_lines(durable),
            "",
        ])
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(settings)
        return time.monotonic() - started

    @property
    def durable(self) -> bool:
        """Our section of postgresql.conf keeps every commit (no line turns fsync, full_page_writes or
        synchronous_commit off)."""
        ours = (self.data / "postgresql.conf").read_text().partition(CONFIG_MARKER)[2]
        return not re.search(rf"(?m)^({'|'.join(DURABILITY_SETTINGS)}) = off\b", ours)

    def make_durable(self, durable: bool = True) -> bool:
        """Rewrite our section of postgresql.conf durable (or, for `ensure --test` only, not); True when it changed.
        A cluster initialised by an older checkout had fsync, full_page_writes and synchronous_commit off. A
        running server needs a reload (all three are reload-time settings)."""
        if self.durable == durable:
            return False
        conf = self.data / "postgresql.conf"
        head, marker, ours = conf.read_text().partition(CONFIG_MARKER)
        ours = re.sub(rf"(?m)^({'|'.join(DURABILITY_SETTINGS)}) = .*\n", "", ours)
        for comment in ("# disposable development data: trade durability for speed",
                        durability_lines(True)[0], durability_lines(False)[0]):
            ours = ours.replace(comment + "\n", "")
        conf.write_text(head + marker + ours.rstrip("\n") + "\n" + "\n".join(durability_lines(durable)) + "\n")
        return True

    def set_listen_address(self, host: str) -> None:
        listen = "::1" if host == "::1" else "127.0.0.1"
        conf = self.data / "postgresql.conf"
        text = conf.read_text()
        head, marker, ours = text.partition(CONFIG_MARKER)
        ours = re.sub(r"(?m)^listen_addresses = .*$", f"listen_addresses = '{listen}'", ours)
        conf.write_text(head + marker + ours)

    def start(self, bindir: Path, runas: RunAs) -> float:
        self.clear_stale_pidfile()
        started = time.monotonic()
        home = self.home.resolve()
        result = runas.run(
            [str(bindir / "pg_ctl"), "-D", str(home / "data"), "-l", str(home / "postgres.log"),
             "-w", "-t", str(int(WAIT_SECONDS)), "start"],
            cwd=home,
        )
        if result.returncode != 0:
            raise Fatal(
                f"private PostgreSQL in {rel(self.home)} did not start (pg_ctl exit {result.returncode}): "
                f"{(result.stdout + result.stderr).strip()}\n  log tail ({rel(self.log)}):\n{tail(self.log)}"
            )
        return time.monotonic() - started

    def stop(self) -> bool:
        pid = self.pid
        if pid is None:
            self.clear_stale_pidfile()
            return False
        os.kill(pid, signal.SIGINT)  # "fast" shutdown: roll back sessions, checkpoint, exit
        if not wait_gone(pid, WAIT_SECONDS):
            os.kill(pid, signal.SIGQUIT)  # immediate shutdown
            wait_gone(pid, 5)
        return True


def wait_gone(pid: int, seconds: float) -> bool:
    """Wait until `pid` has exited (a zombie counts as exited)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not pid_alive(pid) or is_zombie(pid):
            return True
        try:  # reap it if it happens to be our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    return not pid_alive(pid) or is_zombie(pid)


# ----------------------------------------------------------------------------------- private redis


class PrivateRedis:
    def __init__(self, port: int) -> None:
        self.port = port
        self.home = REDIS_ROOT / str(port)
        self.conf = self.home / "redis.conf"
        self.log = self.home / "redis.log"
        self.pidfile = self.home / "redis.pid"

    @classmethod
    def all(cls) -> list["PrivateRedis"]:
        if not REDIS_ROOT.is_dir():
            return []
        return [cls(int(p.name)) for p in sorted(REDIS_ROOT.iterdir()) if p.name.isdigit()]

    @property
    def pid(self) -> int | None:
        pid = read_pid(self.pidfile)
        # redis sets its process title to `redis-server <bind>:<port>`
        return pid if pid and pid_runs(pid, "redis", f":{self.port}") else None

    def start(self, binary: str, host: str, user: str | None = None, password: str | None = None) -> float:
        started = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        if self.pidfile.exists() and self.pid is None:
            progress(f"removing stale pid file {rel(self.pidfile)}")
            self.pidfile.unlink()
        home = self.home.resolve()
        bind = "::1" if host == "::1" else "127.0.0.1"
        lines = [
            "# private development server written by scripts/services.py",
            f"bind {bind}",
            f"port {self.port}",
            "protected-mode yes",
            "daemonize yes",
            f"pidfile {home / 'redis.pid'}",
            f"logfile {home / 'redis.log'}",
            f"dir {home}",
            'save ""',
            "appendonly no",
        ]
        if password:  # the URL carries credentials: make the private server accept exactly those

            def quoted(value: str) -> str:
                return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

            if user and user != "default":
                lines.append(f"user {quoted(user)} on {quoted('>' + password)} ~* &* +@all")
            else:
                lines.append(f"requirepass {quoted(password)}")
        sock = home / "redis.sock"
        if len(str(sock)) <= SOCKET_PATH_MAX:
            lines += [f"unixsocket {sock}", "unixsocketperm 700"]
        self.conf.write_text("\n".join(lines) + "\n")
        with (home / "redis-start.log").open("w") as out:
            proc = subprocess.run(
                [binary, str(home / "redis.conf")], cwd=home, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, timeout=WAIT_SECONDS,
            )
        if proc.returncode != 0:
            raise Fatal(
                f"private Redis in {rel(self.home)} did not start (exit {proc.returncode}):\n"
                f"{tail(home / 'redis-start.log')}\n{tail(self.log)}"
            )
        return time.monotonic() - started

    def stop(self) -> bool:
        pid = self.pid
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, 10):
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 5)
        self.pidfile.unlink(missing_ok=True)
        return True


# -------------------------------------------------------------------------------------- resolution


@dataclass
class Plan:
    kind: str  # "postgres" | "redis"
    url: str
    how: str  # human description of what is used
    start_port: int | None = None  # start a private server on this port
    host: str = "127.0.0.1"
    user: str = "postgres"
    absent: str = ""  # where nothing answered, for messages


def _waiting(kind: str, endpoint: Endpoint) -> Probe:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        probe = pg_probe(endpoint) if kind == "postgres" else redis_probe(endpoint)
        if probe.ok or time.monotonic() > deadline:
            return probe
        time.sleep(0.2)


def plan_service(kind: str) -> Plan:
    var = "DATABASE_URL" if kind == "postgres" else "REDIS_URL"
    if kind == "postgres" and os.environ.get("DATABASE_ADMIN_URL", "").strip():
        var = "DATABASE_ADMIN_URL"  # a shell that loaded .data/services.env: DATABASE_URL is the app role's
    label = "PostgreSQL" if kind == "postgres" else "Redis"
    standard = STANDARD_DATABASE_URL if kind == "postgres" else STANDARD_REDIS_URL
    probe_fn = pg_probe if kind == "postgres" else redis_probe
    private_cls = PrivatePostgres if kind == "postgres" else PrivateRedis
    configured = os.environ.get(var, "").strip()

    if configured:
        ep = parse_url(configured, kind)
        if kind == "postgres" and not ep.host:
            probe = pg_probe(ep)
            if probe.ok:
                return Plan(kind, configured, f"{var} from the environment ({ep.masked})")
            raise Fatal(f"{var}={ep.masked} (unix socket) does not answer: {probe.error}", 2)
        probe = probe_fn(ep)
        if probe.ok:
            mine = ep.is_loopback and private_cls(ep.port).pid is not None
            how = (f"private {label} server already running on {ep.where} ({rel(private_cls(ep.port).home)})"
                   if mine else f"{var} from the environment ({ep.masked})")
            return Plan(kind, configured, how)
        if ep.is_loopback and private_cls(ep.port).pid is not None:
            # our own server, still starting up (e.g. a concurrent `ensure`)
            probe = _waiting(kind, ep)
            if probe.ok:
                return Plan(kind, configured, f"private {label} server already running on {ep.where}")
        if probe.listening:
            raise Fatal(f"{var}={ep.masked}: something listens on {ep.where} but it does not work as {label}: "
                        f"{probe.error}. Fix {var} or free that port.", 2)
        if not ep.is_loopback:
            raise Fatal(f"{var}={ep.masked}: nothing answers on {ep.where}, and it is not a loopback address, "
                        f"so no private server can stand in for it. Start that server or unset {var}.", 2)
        return Plan(kind, configured, f"{var} from the environment: nothing listened on {ep.where}",
                    start_port=ep.port, host=ep.host, user=ep.user or "postgres",
                    absent=f"nothing answers on {ep.where} ({var})")

    std = parse_url(standard, kind)
    if probe_fn(std).ok:
        return Plan(kind, standard, f"local {label} server on the standard port ({std.masked})")
    # a private server started by an earlier `ensure`, running or restartable on its own port
    privates = private_cls.all()
    for server in privates:
        if server.pid is not None:
            ep = parse_url(loopback_url(kind, server.port), kind)
            if _waiting(kind, ep).ok:
                return Plan(kind, ep.url, f"private {label} server already running on 127.0.0.1:{server.port} "
                                          f"({rel(server.home)})")
    for server in privates:
        reusable = server.initialised if kind == "postgres" else server.conf.exists()
        if reusable and port_is_free(server.port):
            return Plan(kind, loopback_url(kind, server.port), "no server on the standard port",
                        start_port=server.port,
                        absent=f"nothing answers on the standard port {std.where} and {var} is unset")
    port = free_loopback_port()
    return Plan(kind, loopback_url(kind, port), "no server on the standard port", start_port=port,
                absent=f"nothing answers on the standard port {std.where} and {var} is unset")


def execute_postgres(plan: Plan, bindir: Path, durable: bool = True) -> str:
    server = PrivatePostgres(plan.start_port)
    runas = RunAs.for_postgres()
    if server.pid is None:
        server.clear_stale_pidfile()
    timings = []
    if not server.initialised:
        progress(f"initialising a private PostgreSQL cluster in {rel(server.data)} ({bindir})")
        timings.append(f"initdb {server.initdb(bindir, runas, plan.user):.1f}s")
    else:
        version = (server.data / "PG_VERSION").read_text().strip()
        bindir = find_pg_bindir(prefer_version=version) or bindir
    server.set_listen_address(plan.host)
    if server.make_durable(durable):
        state = "on" if durable else "off, for the test suite (ensure --test)"
        progress(f"{rel(server.data)}/postgresql.conf: fsync, full_page_writes and synchronous_commit {state}")
    progress(f"starting the private PostgreSQL server on {plan.host}:{plan.start_port}")
    timings.append(f"start {server.start(bindir, runas):.1f}s")
    ep = parse_url(plan.url, "postgres")
    probe = _waiting("postgres", ep)
    if not probe.ok:
        raise Fatal(f"private PostgreSQL in {rel(server.home)} does not accept connections after "
                    f"{WAIT_SECONDS:.0f}s: {probe.error}\n  log tail ({rel(server.log)}):\n{tail(server.log)}")
    return (f"started private PostgreSQL server on {ep.where} ({rel(server.home)}, {', '.join(timings)}; "
            f"{plan.how})")


def others_connected(url: str) -> int:
    """Client sessions on the server's databases other than the test suite's (test_*) and the maintenance ones:
    e.g. `make run`'s, which must keep a durable server."""
    with pg_connect(url) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            " AND datname IS NOT NULL AND datname NOT LIKE 'test\\_%' AND datname NOT IN ('postgres', 'template1')"
        ).fetchone()[0]


def reload_durable(plan: Plan, durable: bool = True) -> str:
    """Our private server, already running, gets the durable configuration (or, for `ensure --test`, the
    non-durable one) and a reload: fsync, full_page_writes and synchronous_commit change without a restart. A
    configuration written non-durable by an older checkout is made durable here. Servers that are not ours are
    never touched."""
    ep = parse_url(plan.url, "postgres")
    if plan.start_port is not None or not ep.is_loopback:
        return ""
    server = PrivatePostgres(ep.port)
    if server.pid is None or not server.initialised:
        return ""
    if not durable and others_connected(plan.url):
        durable = True  # make run (or anything else) is using it: it stays durable, the suite runs slower
        if server.durable:
            return "; kept durable for the test suite: other databases on it are in use (e.g. make run)"
    if not server.make_durable(durable):
        return ""
    with pg_connect(plan.url) as conn:
        conn.execute("SELECT pg_reload_conf()")
    if durable:
        return "; made durable (fsync, full_page_writes, synchronous_commit on) and reloaded"
    return "; fsync, full_page_writes and synchronous_commit off for the test suite (ensure --test) and reloaded"


def execute_redis(plan: Plan, binary: str) -> str:
    server = PrivateRedis(plan.start_port)
    progress(f"starting a private Redis server on {plan.host}:{plan.start_port}")
    began = time.monotonic()
    ep = parse_url(plan.url, "redis")
    server.start(binary, plan.host, ep.user, ep.password)
    probe = _waiting("redis", ep)
    if not probe.ok:
        raise Fatal(f"private Redis in {rel(server.home)} does not answer PING after {WAIT_SECONDS:.0f}s: "
                    f"{probe.error}\n  log tail ({rel(server.log)}):\n{tail(server.log)}")
    elapsed = time.monotonic() - began
    return f"started private Redis server on {ep.where} ({rel(server.home)}, start {elapsed:.1f}s; {plan.how})"


def ensure_databases(database_url: str, journal_url: str) -> list[str]:
    """CREATE DATABASE for `default` and the journal if missing (tolerating concurrent creators)."""
    psycopg = _psycopg()
    from psycopg import errors, sql  # noqa: PLC0415

    created = []
    wanted: dict[tuple, tuple[str, list[str]]] = {}
    for url in (database_url, journal_url):
        ep = parse_url(url, "postgres")
        key = (ep.host, ep.port, ep.user)
        wanted.setdefault(key, (url, []))[1].append(ep.db)
    for url, names in wanted.values():
        try:
            conn = pg_connect(url)
        except psycopg.Error as exc:
            raise Fatal(f"cannot connect to {parse_url(url, 'postgres').masked}: {exc}", 2) from None
        with conn:
            for name in names:
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                    continue
                try:
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                    created.append(name)
                except (errors.DuplicateDatabase, errors.UniqueViolation):
                    pass  # created concurrently
                except psycopg.Error as exc:
                    raise Fatal(f"database {name!r} is missing and could not be created: {exc}", 2) from None
    return created


def _dbroles():
    """connector/dbroles.py (stdlib only at import): the role names, their attributes and the setup SQL."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from connector import dbroles  # noqa: PLC0415 - local: the checkout root joins sys.path just above

    return dbroles


def role_url(admin_url: str, role: str, password: str | None) -> str:
    """The admin URL with the role's credentials (same server, database and options)."""
    from urllib.parse import quote  # noqa: PLC0415

    parts = urlsplit(admin_url)
    host = parts.netloc.rpartition("@")[2]
    auth = quote(role, safe="") + (":" + quote(password, safe="") if password else "")
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}"))


def ensure_roles(admin_url: str, names: list[str]) -> None:
    """The owner and application roles (docs/security.md), the databases owned by the owner with every existing
    object of their public schema handed to it, and CONNECT for the application role only. Idempotent; needs an
    administrator (superuser, or CREATEROLE and membership of the current owners)."""
    psycopg = _psycopg()
    dbroles = _dbroles()
    try:
        with pg_connect(admin_url) as conn:
            for statement in dbroles.roles_sql(owner_password=os.environ.get("DATABASE_OWNER_PASSWORD") or None,
                                               app_password=os.environ.get("DATABASE_APP_PASSWORD") or None):
                conn.execute(statement)
            for name in names:
                for statement in dbroles.database_sql(name):
                    conn.execute(statement)
        for name in names:
            with pg_connect(admin_url, dbname=name) as conn:
                conn.execute(dbroles.adopt_sql())
    except psycopg.Error as exc:
        raise Fatal(f"cannot set up the database roles {dbroles.OWNER} and {dbroles.APP} as "
                    f"{parse_url(admin_url, 'postgres').masked}: {' '.join(str(exc).split())}", 2) from None


def write_env(database_url: str, journal_url: str, redis_url: str) -> None:
    """`database_url`/`journal_url` are the administrator's; the file names all three roles' URLs: DATABASE_URL and
    JOURNAL_DATABASE_URL are the application role's (what web, worker and beat use)."""
    DATA.mkdir(exist_ok=True)
    dbroles = _dbroles()
    owner_password = os.environ.get("DATABASE_OWNER_PASSWORD") or None
    app_password = os.environ.get("DATABASE_APP_PASSWORD") or None
    body = (
        "# Written by scripts/services.py ensure. Use: set -a; . .data/services.env; set +a\n"
        "# DATABASE_URL is the application role's (web, worker, beat); migrations use DATABASE_OWNER_URL;\n"
        "# DATABASE_ADMIN_URL created the roles and databases (docs/security.md).\n"
        f"export DATABASE_ADMIN_URL={shlex.quote(database_url)}\n"
        f"export DATABASE_OWNER_URL={shlex.quote(role_url(database_url, dbroles.OWNER, owner_password))}\n"
        f"export JOURNAL_DATABASE_OWNER_URL={shlex.quote(role_url(journal_url, dbroles.OWNER, owner_password))}\n"
        f"export DATABASE_URL={shlex.quote(role_url(database_url, dbroles.APP, app_password))}\n"
        f"export JOURNAL_DATABASE_URL={shlex.quote(role_url(journal_url, dbroles.APP, app_password))}\n"
        f"export REDIS_URL={shlex.quote(redis_url)}\n"
    )
    tmp = ENV_FILE.with_suffix(".env.tmp")
    tmp.write_text(body)
    tmp.chmod(0o600)
    tmp.replace(ENV_FILE)


class Locked:
    """Serialise concurrent `ensure`/`stop` runs of this project."""

    def __enter__(self):
        DATA.mkdir(exist_ok=True)
        self.fh = open(LOCK_FILE, "a")
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def cmd_ensure(test: bool = False) -> int:
    """`test`: `ensure --test`, the test suite's explicit trade (D-410): our private PostgreSQL runs with fsync,
    full_page_writes and synchronous_commit off, unless something else (make run) uses its other databases.
    A plain `ensure` (make run, migrate, bench) makes it durable again."""
    with Locked():
        plans = {kind: plan_service(kind) for kind in ("postgres", "redis")}
        missing = []
        pg_bindir = redis_binary = None
        if plans["postgres"].start_port is not None:
            pg_bindir = find_pg_bindir()
            if pg_bindir is None:
                missing.append("postgres")
            else:
                RunAs.for_postgres()  # fail early when root has no postgres user
        if plans["redis"].start_port is not None:
            redis_binary = find_redis_server()
            if redis_binary is None:
                missing.append("redis")
        if missing:
            binaries = {"postgres": "PostgreSQL server binaries (initdb, pg_ctl, postgres) on PATH or in "
                                    "/usr/lib/postgresql/*/bin", "redis": "redis-server binary on PATH"}
            label = {"postgres": "PostgreSQL", "redis": "Redis"}
            reasons = "; ".join(f"{label[m]}: {plans[m].absent}, and found no {binaries[m]} to start a "
                                f"private one" for m in missing)
            pkgs = " ".join(INSTALL_HINT[m] for m in missing)
            variables = " / ".join("DATABASE_URL" if m == "postgres" else "REDIS_URL" for m in missing)
            raise Fatal(f"{reasons}. Install them (Debian/Ubuntu: apt-get install {pkgs}) "
                        f"or set {variables} to a running server.", 2)

        pg = plans["postgres"]
        pg_line = execute_postgres(pg, pg_bindir, not test) if pg.start_port is not None else f"using {pg.how}"
        pg_line += reload_durable(pg, not test)
        # the journal lives beside `default` on the same server; JOURNAL_DATABASE_URL may only rename it
        named = os.environ.get("JOURNAL_DATABASE_URL", "").strip()
        journal_name = parse_url(named, "postgres").db if named else parse_url(journal_url_for(pg.url), "postgres").db
        journal = urlunsplit(urlsplit(pg.url)._replace(path="/" + journal_name))
        created = ensure_databases(pg.url, journal)
        default_name = parse_url(pg.url, "postgres").db
        ensure_roles(pg.url, [default_name, journal_name])
        names = f"{default_name}, {journal_name}"
        pg_line += f"; databases {names} " + (f"ready (created {', '.join(created)})" if created else "ready")
        pg_line += f"; roles {_dbroles().OWNER} (owner), {_dbroles().APP} (application)"

        rd = plans["redis"]
        rd_line = execute_redis(rd, redis_binary) if rd.start_port is not None else f"using {rd.how}"

        write_env(pg.url, journal, rd.url)
        say(f"postgres: {pg_line}")
        say(f"redis: {rd_line}")
        progress(f"wrote {rel(ENV_FILE)}")
    return 0


def cmd_stop() -> int:
    stopped = 0
    if not DATA.is_dir():
        say(f"no private servers: {rel(DATA)}/ does not exist")
        return 0
    with Locked():
        for server in PrivatePostgres.all():
            if server.stop():
                say(f"postgres: stopped private PostgreSQL server on 127.0.0.1:{server.port} ({rel(server.home)})")
                stopped += 1
        for server in PrivateRedis.all():
            if server.stop():
                say(f"redis: stopped private Redis server on 127.0.0.1:{server.port} ({rel(server.home)})")
                stopped += 1
    if not stopped:
        say(f"no private servers running under {rel(DATA)}/")
    return 0


def cmd_env() -> int:
    try:
        sys.stdout.write(ENV_FILE.read_text())
    except FileNotFoundError:
        print(f"{rel(ENV_FILE)} does not exist yet: run `python scripts/services.py ensure`", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    commands = {"ensure": cmd_ensure, "stop": cmd_stop, "env": cmd_env}
    test = argv[1:] == ["--test"] and argv[0] == "ensure"
    if not (len(argv) == 1 or test) or argv[0] not in commands:
        print(f"usage: {Path(sys.argv[0]).name} {{{'|'.join(commands)}}}   (ensure --test: the test suite's "
              f"non-durable private PostgreSQL)", file=sys.stderr)
        return 64
    try:
        return cmd_ensure(test=True) if test else commands[argv[0]]()
    except Fatal as exc:
        print(f"services.py: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
