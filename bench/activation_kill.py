"""An activation killed in the middle of its transaction: a child process holds the locks at a kill point, the
bench kills it, then counts the locks, checks nothing partial is visible and times the recovery."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from django.db import connection, connections

from bench.activation_timing import CHILD_ARGS, CHILD_COMMITTED, CHILD_HOLDING
from bench.activation_world import (ActivationBenchError, ActivationWorld, PartialActivationVisible, Progress, _ms,
                                    _observer, _url)
from bench.wal import Wal, insert_lsn, retain_wal, wal_of

KILL_POINTS = ("before_commit", "after_gate_locks")

LOCKED_TABLES = ("connector_accountservinggate", "connector_servingepoch")

SUCCESSOR_LOCKED_TABLES = (*LOCKED_TABLES, "cutover_servingpublicationbarrierset", "connector_orderinglane")

LOCKED_TABLES_OF = {"first": LOCKED_TABLES, "cutover": (*LOCKED_TABLES, "cutover_servingpublicationbarrierset"),
                    "successor": SUCCESSOR_LOCKED_TABLES}


# -- 1. killed mid-transaction --------------------------------------------------------------------------------

@dataclass
class LockCensus:
    point: str  # where the transaction was paused
    row_locks: dict[str, int]  # table -> rows locked by the transaction (pgrowlocks); empty without it
    lock_table: dict[str, int]  # "locktype mode" -> pg_locks entries of its backend

    @property
    def total_row_locks(self) -> int | None:
        return sum(self.row_locks.values()) if self.row_locks else None

    @property
    def total_lock_table(self) -> int:
        return sum(self.lock_table.values())


@dataclass
class Untouched:
    """What a second session sees after the kill."""

    epoch_state: str
    gates: int
    gates_validating: int  # gates still in the scenario's pre-activation mode (v2_validating, or v2_halted)
    gates_naming_epoch: int
    fences_changed: int
    activation_audit_rows: int
    rows_still_locked: int | None

    def partial(self, accounts: int) -> bool:
        return not (self.epoch_state == "verified" and self.gates == self.gates_validating == accounts
                    and self.gates_naming_epoch == 0 and self.fences_changed == 0
                    and self.activation_audit_rows == 0 and not self.rows_still_locked)


@dataclass
class Recovery:
    kill_at: str
    census: LockCensus
    untouched: Untouched
    locks_released_ms: float  # SIGKILL -> the backend is gone and with it every lock
    child_wal: Wal  # what the killed attempt had written (after a CHECKPOINT: full-page images included)
    # SIGKILL -> the retried activation's COMMIT acknowledged, when the retry starts as soon as the locks are gone:
    # locks_released_ms + the retry's whole call (the bench's own checks in between are not counted)
    retried_commit_ms: float | None = None
    partial_visible: bool = False


ACTIVATION_ACTIONS = {"first": ("epoch_activate_first", "gate_activate_first"),
                      "cutover": ("epoch_activate_first", "gate_activate_first"),
                      "successor": ("successor_activate", "gate_activate_successor")}

CHILD_SCRIPT = """\
import django
django.setup()
from bench.activation_timing import child_main
child_main()
"""


def _spawn_child(world: ActivationWorld, kill_at: str) -> subprocess.Popen:
    from django.conf import settings

    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "JOURNAL_DATABASE_URL", "TEST_DB_SUFFIX", "CONNECTOR_FAULT_POINT")}
    root = str(Path(settings.BASE_DIR))
    env.update({
        "DJANGO_SETTINGS_MODULE": (os.environ.get("DJANGO_SETTINGS_MODULE") or getattr(settings, "SETTINGS_MODULE", None)
                                   or "config.django.local"),
        "DJANGO_DEBUG": "0",
        "DATABASE_URL": _url(connection.settings_dict),
        "JOURNAL_DATABASE_URL": _url(connections["journal"].settings_dict),
        "CONNECTOR_SECRET_DIR": str(settings.CONNECTOR["SECRET_BACKEND_DIR"]),
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH", "")])),
        CHILD_ARGS: json.dumps({"epoch_pk": world.epoch_pk, "accounts": world.accounts, "kill_at": kill_at,
                                "scenario": world.scenario, "barrier_set_pk": world.barrier_set_pk,
                                "attempt_key": world.attempt_key}),
    })
    return subprocess.Popen([sys.executable, "-c", CHILD_SCRIPT], env=env, cwd=root, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _await_holding(child: subprocess.Popen, timeout: float) -> dict:
    lines: queue.Queue[str | None] = queue.Queue()
    errors: list[str] = []

    def pump(stream, sink) -> None:
        for line in stream:
            sink(line)
        if stream is child.stdout:
            lines.put(None)

    threading.Thread(target=pump, args=(child.stdout, lines.put), daemon=True).start()
    threading.Thread(target=pump, args=(child.stderr, errors.append), daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise ActivationBenchError(f"the activation child did not reach its kill point in {timeout:.0f} s")
        if line is None:
            child.wait()
            raise ActivationBenchError(f"the activation child exited ({child.returncode}) before its kill point:\n"
                                       + "".join(errors[-30:]))
        if line.startswith(CHILD_HOLDING):
            return json.loads(line[len(CHILD_HOLDING):])
        if line.startswith(CHILD_COMMITTED):
            raise ActivationBenchError(f"the activation child committed without pausing: {line.strip()}")


def _census(observer, *, point: str, pid: int, xid: int, rowlocks: bool,
            tables: Sequence[str] = LOCKED_TABLES) -> LockCensus:
    lock_table = {f"{locktype} {mode}": count for locktype, mode, count in observer.execute(
        "SELECT locktype, mode, count(*) FROM pg_locks WHERE pid = %s GROUP BY 1, 2 ORDER BY 1, 2", [pid])}
    row_locks = {}
    if rowlocks:
        for table in tables:
            row_locks[table] = observer.execute(
                "SELECT count(*) FROM pgrowlocks(%s) WHERE %s::text::xid = ANY(xids)", [table, str(xid)]).fetchone()[0]
    return LockCensus(point=point, row_locks=row_locks, lock_table=lock_table)


def observe_untouched(observer, world: ActivationWorld, *, xid: int | None = None,
                      rowlocks: bool = True) -> Untouched:
    """The epoch's state and every gate of the configuration, as a second session sees them."""
    (state,) = observer.execute("SELECT state FROM connector_servingepoch WHERE id = %s", [world.epoch_pk]).fetchone()
    gates = observer.execute(
        "SELECT g.account_id, g.mode, g.fence, g.epoch_id FROM connector_accountservinggate g "
        "JOIN connector_serviceconfigurationaccount c ON c.account_id = g.account_id WHERE c.generation_id = %s",
        [world.configuration_pk]).fetchall()
    (audits,) = observer.execute(
        "SELECT count(*) FROM connector_auditrecord WHERE action = ANY(%s) AND evidence_digest = %s",
        [list(ACTIVATION_ACTIONS[world.scenario]), world.epoch_digest]).fetchone()
    still_locked = None
    if rowlocks and xid is not None:
        still_locked = sum(observer.execute(
            "SELECT count(*) FROM pgrowlocks(%s) WHERE %s::text::xid = ANY(xids)", [table, str(xid)]).fetchone()[0]
            for table in LOCKED_TABLES_OF[world.scenario])
    return Untouched(
        epoch_state=state, gates=len(gates), gates_validating=sum(1 for g in gates if g[1] == world.gate_mode_before),
        gates_naming_epoch=sum(1 for g in gates if g[3] == world.epoch_pk),
        fences_changed=sum(1 for g in gates if world.fences.get(g[0]) != g[2]), activation_audit_rows=audits,
        rows_still_locked=still_locked)


def kill_mid_activation(world: ActivationWorld, *, kill_at: str = "before_commit", progress: Progress | None = None,
                        timeout: float | None = None, raise_on_partial: bool = True) -> Recovery:
    """Run `epoch_activate_first` in a child process, pause it at `kill_at` holding its locks, count them from a
    second session, SIGKILL it and time until its backend (and with it every lock) is gone. Then, from the second
    session: the WAL the killed attempt wrote and what is visible. Raises PartialActivationVisible when any of the
    activation's effects or locks remain visible (unless raise_on_partial is false)."""
    if kill_at not in KILL_POINTS:
        raise ActivationBenchError(f"kill point {kill_at!r} is not one of {', '.join(KILL_POINTS)}")
    say = progress or (lambda _msg: None)
    timeout = timeout if timeout is not None else 300 + world.accounts * 0.02
    rowlocks = world.extensions.get("pgrowlocks", False)
    observer = _observer()
    child = None
    try:
        retain_wal(observer)
        start_lsn = insert_lsn(observer)
        say(f"  killed attempt: child runs the {world.scenario} activation and pauses at {kill_at}")
        child = _spawn_child(world, kill_at)
        holding = _await_holding(child, timeout)
        census = _census(observer, point=holding["point"], pid=holding["pid"], xid=holding["xid"],
                         rowlocks=rowlocks,
                         tables=LOCKED_TABLES_OF[world.scenario])
        say(f"  killed attempt: holding {census.total_row_locks} row locks, {census.total_lock_table} lock-table "
            "entries; SIGKILL")
        killed = time.perf_counter()
        os.kill(child.pid, signal.SIGKILL)
        while observer.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                               [holding["pid"]]).fetchone()[0]:
            time.sleep(0.0005)
        released = time.perf_counter()
        child.wait()
        server_bytes = observer.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)::bigint",
                                        [start_lsn]).fetchone()[0]
        child_wal = wal_of(observer, start_lsn, holding["xid"], server_bytes=server_bytes,
                            enabled=world.extensions.get("pg_walinspect", False))
        untouched = observe_untouched(observer, world, xid=holding["xid"], rowlocks=rowlocks)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        observer.close()
    recovery = Recovery(kill_at=kill_at, census=census, untouched=untouched,
                        locks_released_ms=_ms(released - killed), child_wal=child_wal,
                        partial_visible=untouched.partial(world.accounts))
    if recovery.partial_visible and raise_on_partial:
        raise PartialActivationVisible(f"after the kill at {kill_at}: {untouched}")
    return recovery
