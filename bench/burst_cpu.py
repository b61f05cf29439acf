"""The busy CPU of `manage.py bench burst`, per process role (issue 18 goal 5; decision D-358).

Over the burst's window (the first POST to the last ApplicationResult) it samples utime + stime from
/proc/<pid>/stat of:

* each child scripts/run.py started (`web`, `worker-materialize`, `worker-claims`, `worker-egress`,
  `worker-sweeper`, `beat`, `receiver`) and every descendant of it (gunicorn's workers, Celery's pool processes),
  found by walking /proc's parent pids at every poll, so a process born inside the window counts from its birth;
* scripts/run.py's own process (`supervisor`: it relays every line its children print, e.g. the access log);
* the bench process itself (`clients`: the posting threads, the bench's own progress polling, this sampler, and
  the thread copying run.py's output to its log file);
* the PostgreSQL client backends of the bench's databases (`pg_stat_activity` by database name), each attributed to
  the role whose process holds the other end of its TCP connection (`postgresql:<role>`; `postgresql:?` when the
  socket was not found, e.g. a connection over a Unix socket).

A process (or backend) that exits inside the window counts up to its last poll (every POLL_SECONDS). The machine's
busy jiffies over the window are the reference: the difference is the rest of the machine (other helpers' work,
Redis, the kernel). `per_event` divides each role's busy ms by the events completed.
"""
from __future__ import annotations

import os
import threading
import time

from bench.cpu import ServerSampler, busy_percent, cpu_sample, ms, process_jiffies

POLL_SECONDS = 0.5
ROLE_NAMES = {"web": "web", "worker-materialize": "materialize", "worker-claims": "claims",
              "worker-egress": "egress", "worker-sweeper": "sweeper", "beat": "beat", "receiver": "receiver"}
ORDER = ["web", "materialize", "claims", "egress", "sweeper", "beat", "receiver", "supervisor", "clients"]

BACKEND_PORTS_SQL = ("SELECT pid, client_port FROM pg_stat_activity WHERE datname = ANY(%s) "
                     "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")


def parent_pids(proc: str = "/proc") -> dict[int, int]:
    """{pid: parent pid} of every process on the machine."""
    out: dict[int, int] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/stat", encoding="ascii", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        try:
            out[int(entry)] = int(fields[1])
        except (IndexError, ValueError):
            continue
    return out


def descendants(root: int, parents: dict[int, int]) -> list[int]:
    """`root` and every process below it in `parents` ({pid: parent pid})."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def local_port_inodes(proc: str = "/proc") -> dict[int, int]:
    """{local TCP port: socket inode} of the machine's TCP sockets (IPv4 and IPv6)."""
    out: dict[int, int] = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{name}", encoding="ascii") as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    port = int(fields[1].rsplit(":", 1)[1], 16)
                    inode = int(fields[9])
                    if inode:
                        out.setdefault(port, inode)
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    return out


def socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


class BurstCpu(ServerSampler):
    """Busy CPU of run.py's process tree by role, of the bench process and of the PostgreSQL backends (by the role
    of their client), and of the machine, between `begin()` and `end()`. `roots` maps a role to the pid of the
    child run.py started for it; `conninfo` reaches the server to list the backends of `databases`."""

    def __init__(self, conninfo: str, databases: list[str], roots: dict[str, int], client_pid: int,
                 supervisor_pid: int | None = None) -> None:
        self.conninfo, self.databases = conninfo, list(databases)
        self.roots, self.client_pid, self.supervisor_pid = dict(roots), client_pid, supervisor_pid
        self.conn = None
        self.backend_role: dict[int, str] = {}
        self.before: dict[int, int] = {}
        self.latest: dict[int, int] = {}
        self.role_of: dict[int, str] = {}
        self.machine_before = None
        self.began = 0.0
        self.result: dict | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _processes(self) -> dict[int, str]:
        parents = parent_pids()
        out = {self.client_pid: "clients"}
        if self.supervisor_pid is not None:
            out[self.supervisor_pid] = "supervisor"  # run.py itself: it relays every child's output lines
        for role, root in self.roots.items():
            for pid in descendants(root, parents):
                out[pid] = role
        return out

    def _backends(self, processes: dict[int, str]) -> dict[int, str]:
        rows = self.conn.execute(BACKEND_PORTS_SQL, [self.databases]).fetchall()
        unknown = [(pid, port) for pid, port in rows if pid not in self.backend_role]
        if unknown:  # attribute each new backend once, by the process holding its client socket
            inodes = local_port_inodes()
            owner: dict[int, str] = {}
            for pid, role in processes.items():
                for inode in socket_inodes(pid):
                    owner[inode] = role
            for pid, port in unknown:
                inode = inodes.get(port) if port and port > 0 else None
                self.backend_role[pid] = f"postgresql:{owner.get(inode, '?') if inode else '?'}"
        return {pid: self.backend_role[pid] for pid, _ in rows}

    def _sample(self) -> dict[int, int]:
        processes = self._processes()
        processes.update(self._backends(processes))
        out = {}
        for pid, role in processes.items():
            value = process_jiffies(pid)
            if value is not None:
                out[pid] = value
                self.role_of.setdefault(pid, role)
        return out

    def begin(self) -> None:
        self.began = time.time()
        self.machine_before = cpu_sample()
        self.before = self._sample()
        self.latest = dict(self.before)

    def poll(self) -> None:
        self.latest.update(self._sample())

    def end(self) -> dict:
        self.poll()
        machine_after = cpu_sample()
        roles: dict[str, dict] = {}
        for pid, value in self.latest.items():
            role = self.role_of[pid]
            entry = roles.setdefault(role, {"ms": 0.0, "processes": 0})
            entry["ms"] += ms(value - self.before.get(pid, 0))
            entry["processes"] += 1
        for entry in roles.values():
            entry["ms"] = round(entry["ms"], 1)
        machine = (machine_after[0] - self.machine_before[0]
                   if machine_after is not None and self.machine_before is not None else None)
        self.result = {"window_seconds": round(time.time() - self.began, 2), "roles": roles,
                       "machine_busy_ms": round(ms(machine), 1) if machine is not None else None,
                       "machine_busy_pct": busy_percent(self.machine_before, machine_after)}
        return self.result

    def start(self) -> BurstCpu:
        """Open, begin, and poll in a thread until `stop()`."""
        self.open()
        self.begin()

        def run() -> None:
            while not self._stop.wait(POLL_SECONDS):
                try:
                    self.poll()
                except Exception:  # noqa: BLE001 - a failed poll only loses that sample
                    pass

        self._thread = threading.Thread(target=run, name="burst-cpu", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            return self.end()
        finally:
            self.close()


def per_event(cpu: dict | None, events: int) -> dict | None:
    """{role: busy ms per event} plus `postgresql` (every backend), `total` (every measured process) and `machine`
    (the reference), from a BurstCpu result; None without a measurement or without events."""
    if not cpu or "roles" not in cpu or events <= 0:
        return None
    roles = cpu["roles"]
    out = {role: round(roles[role]["ms"] / events, 3) for role in ORDER if role in roles}
    pg = {role: entry["ms"] for role, entry in roles.items() if role.startswith("postgresql")}
    out["postgresql"] = round(sum(pg.values()) / events, 3)
    for role in sorted(pg):
        out[role] = round(pg[role] / events, 3)
    out["total"] = round(sum(entry["ms"] for entry in roles.values()) / events, 3)
    if cpu.get("machine_busy_ms") is not None:
        out["machine"] = round(cpu["machine_busy_ms"] / events, 3)
    return out


def cpu_lines(cpu: dict | None, events: int) -> list[str]:
    """The printed table: busy ms per event of each role, and how many processes it had."""
    per = per_event(cpu, events)
    if per is None:
        return [f"  busy CPU per event: not measured ({(cpu or {}).get('error', 'no events')})"]
    roles = cpu["roles"]
    lines = [f"  busy CPU per event over {cpu['window_seconds']} s ({events} events; machine "
             f"{cpu.get('machine_busy_pct')} % busy, {per.get('machine')} ms per event):"]
    for role, value in per.items():
        if role in ("machine",):
            continue
        count = roles[role]["processes"] if role in roles else None
        lines.append(f"    {role:<24} {value:8.3f} ms" + (f"  ({count} processes)" if count is not None else ""))
    return lines
