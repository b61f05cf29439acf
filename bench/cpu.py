"""Busy CPU from /proc, shared by the benches (`bench hot-account`, `bench claims`; decision D-271).

* `cpu_sample` / `busy_percent`: the whole machine's busy and total jiffies from /proc/stat (every process, other
  engineers' included: a reference, not a figure of the product).
* `process_jiffies`: utime + stime of one process from /proc/<pid>/stat (its own threads; not its children).
* `CpuWindow`: the busy CPU of a set of processes — the bench's worker processes plus the PostgreSQL backends
  serving them, found in `pg_stat_activity` by database — and of the machine, between `begin()` and `end()`.
  A backend absent at `begin()` was born inside the window, so all its CPU counts; a process that exits inside
  the window (a worker that found the backlog drained, and its backends) counts up to its last `poll()`, which
  `run_between` calls every POLL_SECONDS: at most that much of a dying process's CPU is missed.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Self

try:
    CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # not Linux
    CLOCK_TICKS = 100


def cpu_sample() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine from /proc/stat, or None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = [int(v) for v in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def busy_percent(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] == before[1]:
        return None
    return round(100.0 * (after[0] - before[0]) / (after[1] - before[1]), 1)


def process_jiffies(pid: int) -> int | None:
    """utime + stime of `pid` in clock ticks, or None if it is gone (or there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) ": state is field 3, utime 14, stime 15
    try:
        return int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def ms(jiffies: int) -> float:
    return jiffies * 1000.0 / CLOCK_TICKS


POLL_SECONDS = 0.2

BACKENDS_SQL = ("SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s) AND backend_type = 'client backend' "
                "AND pid <> pg_backend_pid()")


class ServerSampler:
    """The autocommit connection a sampler lists PostgreSQL's backends through (`conninfo`): `open()` / `close()`."""

    conninfo: str
    conn = None

    def open(self) -> Self:
        import psycopg

        self.conn = psycopg.connect(self.conninfo, autocommit=True)
        return self

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class CpuWindow(ServerSampler):
    """Busy CPU of `pids` (the workers) and of the client backends of `databases` (their connections), and of the
    machine, over [begin(), end()]. `conninfo` reaches the server (any database on it) to list the backends."""

    def __init__(self, conninfo: str, databases: list[str], pids: list[int] = ()) -> None:
        self.conninfo, self.databases, self.pids = conninfo, list(databases), list(pids)
        self.conn = None
        self.before: dict[str, dict[int, int]] = {}
        self.latest: dict[str, dict[int, int]] = {"workers": {}, "backends": {}}
        self.machine_before = None
        self.began = self.ended = 0.0
        self.result: dict | None = None

    def _backends(self) -> list[int]:
        return [row[0] for row in self.conn.execute(BACKENDS_SQL, [self.databases]).fetchall()]

    def _sample(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {"workers": {}, "backends": {}}
        for kind, pids in (("workers", self.pids), ("backends", self._backends())):
            for pid in pids:
                value = process_jiffies(pid)
                if value is not None:
                    out[kind][pid] = value
        return out

    def begin(self) -> None:
        self.began = time.time()
        self.machine_before = cpu_sample()
        self.before = self._sample()
        self.latest = {kind: dict(values) for kind, values in self.before.items()}

    def poll(self) -> None:
        """Remember each process's latest CPU, so one that exits before `end()` still counts up to here."""
        for kind, values in self._sample().items():
            self.latest[kind].update(values)

    def end(self) -> dict:
        self.poll()
        after = self.latest
        machine_after = cpu_sample()
        self.ended = time.time()
        busy = {kind: sum(v - self.before[kind].get(pid, 0) for pid, v in after[kind].items())
                for kind in ("workers", "backends")}
        machine = (machine_after[0] - self.machine_before[0]
                   if machine_after is not None and self.machine_before is not None else None)
        self.result = {
            "window_seconds": round(self.ended - self.began, 2),
            "workers": len(after["workers"]), "backends": len(after["backends"]),
            "workers_ms": round(ms(busy["workers"]), 1), "backends_ms": round(ms(busy["backends"]), 1),
            "machine_busy_ms": round(ms(machine), 1) if machine is not None else None,
            "machine_busy_pct": busy_percent(self.machine_before, machine_after),
        }
        return self.result

    def run_between(self, t0: float, t1: float) -> threading.Thread:
        """A thread that opens, waits until t0, begins, waits until t1, ends and closes; `result` after join()."""

        def run() -> None:
            try:
                self.open()
                time.sleep(max(0.0, t0 - time.time()))
                self.begin()
                while time.time() < t1:
                    time.sleep(max(0.0, min(POLL_SECONDS, t1 - time.time())))
                    if time.time() < t1:
                        self.poll()
                self.end()
            except Exception as exc:  # noqa: BLE001 - reported in the result, the bench goes on
                self.result = {"error": repr(exc)}
            finally:
                self.close()

        thread = threading.Thread(target=run, name="cpu-window", daemon=True)
        thread.start()
        return thread


def per_completion(cpu: dict | None, completions: int) -> dict | None:
    """The window's busy ms divided by its completions: workers + backends (the figure), each part, and the machine
    (reference). None without a measurement or without completions."""
    if not cpu or "error" in cpu or completions <= 0:
        return None
    out = {"busy_ms": round((cpu["workers_ms"] + cpu["backends_ms"]) / completions, 3),
           "workers_ms": round(cpu["workers_ms"] / completions, 3),
           "backends_ms": round(cpu["backends_ms"] / completions, 3)}
    if cpu.get("machine_busy_ms") is not None:
        out["machine_busy_ms"] = round(cpu["machine_busy_ms"] / completions, 3)
    return out
