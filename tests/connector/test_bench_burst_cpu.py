"""`manage.py bench burst`, issue 18 goal 5: the busy CPU of every process of the burst is measured from /proc over
the burst's window, by role (run.py's children and their descendants, the bench's clients, the PostgreSQL backends
attributed to the role of the process holding their connection), and divided by the events (D-358).
Proves: CV2-14-002 (the bench's figures are measured, on PostgreSQL)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg
import pytest
from django.db import connection

from bench.burst import started_pid
from bench.burst_cpu import BurstCpu, cpu_lines, descendants, parent_pids, per_event
from bench.hot_pool import _conninfo
from tests.support import scaled

SERVER_WORK = "SELECT count(*) FROM generate_series(1, 4000000) g WHERE g % 7 = 3"
# A stand-in for a run.py child: after 0.5 s it starts a grandchild (born inside the window, as a Celery pool
# process or a gunicorn worker is) that burns 0.4 s of CPU, runs a query on PostgreSQL over TCP, idles, and exits.
GRANDCHILD = ("import sys, time, psycopg\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
              "with psycopg.connect(sys.argv[1], autocommit=True) as c:\n"
              f"    c.execute({SERVER_WORK!r}).fetchone()\n    time.sleep(2.0)\n")
CHILD = ("import subprocess, sys, time\ntime.sleep(0.5)\n"
         f"subprocess.run([sys.executable, '-c', {GRANDCHILD!r}, sys.argv[1]], check=True)\n")


@pytest.mark.django_db
def test_burst_window_counts_descendants_born_inside_it_and_their_backends_by_role():
    """A grandchild of a role's root process, born inside the window, burns 0.4 s and runs a query over its own
    connection, then exits before the window ends: its CPU counts under the root's role (up to its last poll), its
    backend's under `postgresql:<role>`; the bench's own process counts as `clients`; the machine covers them."""
    settings_dict = {**connection.settings_dict, "HOST": connection.settings_dict.get("HOST") or "127.0.0.1"}
    conninfo = _conninfo(settings_dict)
    root = subprocess.Popen([sys.executable, "-c", CHILD, conninfo])
    cpu = BurstCpu(conninfo, [settings_dict["NAME"]], {"web": root.pid}, client_pid=os.getpid(),
                   supervisor_pid=None).start()
    try:
        assert root.wait(timeout=scaled(60)) == 0
        time.sleep(0.6)  # one more poll after the exit changes nothing: an exited process keeps its last sample
        result = cpu.stop()
    finally:
        if root.poll() is None:
            root.kill()
            root.wait(timeout=scaled(30))
    roles = result["roles"]
    assert roles["web"]["processes"] >= 2, result  # the root and the grandchild born inside the window
    assert roles["web"]["ms"] >= 300, result  # 0.4 s burned (jiffies of 10 ms; interpreter start-up adds)
    assert roles["postgresql:web"]["ms"] > 0 and roles["postgresql:web"]["processes"] == 1, result
    assert "clients" in roles, result
    total = sum(entry["ms"] for entry in roles.values())
    assert result["machine_busy_ms"] + 50 >= total, result
    per = per_event(result, 10)
    assert per["web"] == pytest.approx(roles["web"]["ms"] / 10, abs=0.001)
    assert per["postgresql"] == pytest.approx(roles["postgresql:web"]["ms"] / 10 + (
        roles.get("postgresql:clients", {}).get("ms", 0) + roles.get("postgresql:?", {}).get("ms", 0)) / 10,
        abs=0.01)


def test_descendants_walk_the_whole_tree_and_nothing_else():
    """The walk from a root finds its children and grandchildren, not its siblings or parent."""
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 12, 20: 1, 21: 20}
    assert sorted(descendants(10, parents)) == [10, 11, 12, 13]
    assert descendants(21, parents) == [21]
    live = parent_pids()
    assert live[os.getpid()] == os.getppid()


def test_per_event_and_the_printed_table():
    """Each role's ms divided by the events; `postgresql` sums every backend role, `total` every role, `machine`
    the reference; the table names each role with its processes, and an unmeasured window says so."""
    cpu = {"window_seconds": 5.0, "machine_busy_ms": 9000.0, "machine_busy_pct": 90.0,
           "roles": {"web": {"ms": 2000.0, "processes": 6}, "claims": {"ms": 1000.0, "processes": 3},
                     "clients": {"ms": 500.0, "processes": 1},
                     "postgresql:web": {"ms": 400.0, "processes": 10},
                     "postgresql:claims": {"ms": 600.0, "processes": 2}}}
    per = per_event(cpu, 1000)
    assert per["web"] == 2.0 and per["claims"] == 1.0 and per["clients"] == 0.5
    assert per["postgresql"] == 1.0 and per["postgresql:claims"] == 0.6
    assert per["total"] == 4.5 and per["machine"] == 9.0
    assert list(per)[:3] == ["web", "claims", "clients"]  # the table's order: web first, clients last
    text = "\n".join(cpu_lines(cpu, 1000))
    assert "web" in text and "2.000 ms  (6 processes)" in text and "postgresql:claims" in text
    assert "9.0 ms per event" in text
    assert per_event(None, 1000) is None and per_event(cpu, 0) is None
    assert "not measured" in cpu_lines({"error": "no /proc"}, 1000)[0]


def test_run_py_start_lines_name_each_childs_pid():
    """bench burst learns each child's pid from run.py's own `started <name> (pid <n>)` line."""
    assert started_pid("run                | started web (pid 4242): -m gunicorn -c python:config.gunicorn") == (
        "web", 4242)
    assert started_pid("worker-claims      | [INFO] started web (pid 1)") is None
    assert started_pid("run                | Admin: http://127.0.0.1:8000/admin/") is None
