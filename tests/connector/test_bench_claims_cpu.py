"""`manage.py bench claims`, issue 18 goal 4: the busy CPU per completion of the worker processes and of the
PostgreSQL backends serving them is measured from /proc over the window, and the product / procrastinate ratio is
computed from those figures (D-271). Proves: CV2-14-002 (the bench's figures are measured, on PostgreSQL)."""
from __future__ import annotations

import subprocess
import sys
import time

import psycopg
import pytest
from django.db import connection

from bench.claims_cpu import CpuOfWindow, cpu_check, cpu_lines, cpu_ratios
from bench.cpu import CLOCK_TICKS, CpuWindow, per_completion, process_jiffies
from bench.hot_pool import _conninfo
from tests.support import scaled

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass\ntime.sleep({linger})\n"
SERVER_WORK = "SELECT count(*) FROM generate_series(1, 4000000) g WHERE g % 7 = 3"


def _burner(seconds: float, linger: float = 0.0) -> subprocess.Popen:
    """A child process that burns `seconds` of CPU, then idles `linger` s (a stand-in for a bench worker)."""
    return subprocess.Popen([sys.executable, "-c", BURN.format(seconds=seconds, linger=linger)])


@pytest.mark.django_db
def test_cpu_window_counts_the_workers_and_the_backends_born_inside_it():
    """A worker burning 0.4 s of CPU and a backend, opened inside the window, running a query on the server: both
    parts are positive and at least what was burned, and the machine's busy time covers them."""
    conninfo = _conninfo(connection.settings_dict)
    child = _burner(0.4, linger=5.0)
    window = CpuWindow(conninfo, [connection.settings_dict["NAME"]], pids=[child.pid]).open()
    try:
        window.begin()
        with psycopg.connect(conninfo, autocommit=True) as work:  # its backend is born inside the window
            work.execute(SERVER_WORK).fetchone()
            deadline = time.time() + scaled(20)
            while (process_jiffies(child.pid) or 0) < 0.4 * CLOCK_TICKS and time.time() < deadline:
                time.sleep(0.02)  # until the burn is spent (the child idles afterwards)
            cpu = window.end()
    finally:
        window.close()
        child.kill()
        child.wait(timeout=scaled(30))
    assert cpu["workers"] == 1 and cpu["backends"] >= 1, cpu
    assert cpu["workers_ms"] >= 300, cpu  # 0.4 s burned (jiffies of 10 ms; the interpreter's start-up adds)
    assert cpu["backends_ms"] > 0, cpu
    assert cpu["machine_busy_ms"] + 50 >= cpu["workers_ms"] + cpu["backends_ms"], cpu
    per = per_completion(cpu, 10)
    assert per["busy_ms"] == pytest.approx((cpu["workers_ms"] + cpu["backends_ms"]) / 10, abs=0.001)


@pytest.mark.django_db
def test_claims_window_samples_exactly_the_window_and_divides_by_its_completions():
    """The bench's on_start hook samples [start + warm, start + warm + seconds] in a thread: CPU burned before the
    window does not count, CPU burned inside it does — also by a worker that exits inside the window (as one does
    when the backlog drains) — and the per-completion figure divides by the completions."""
    conninfo = _conninfo(connection.settings_dict)
    setup = {"names": {"default": connection.settings_dict["NAME"]}}
    before = _burner(0.3)
    start = time.time()
    before.wait(timeout=scaled(30))  # its CPU is all spent before the window opens
    inside = _burner(0.5, linger=5.0)
    exits = _burner(0.3, linger=0.5)  # burns, idles, exits about 1 s into the 4 s window
    hook = CpuOfWindow(setup, conninfo, warm=max(0.0, time.time() - start) + 0.05, seconds=4.0)
    hook(start, [before.pid, inside.pid, exits.pid])
    exits.wait(timeout=scaled(30))  # reaped inside the window, as `_run_workers` joins a worker that returned early
    try:
        with psycopg.connect(conninfo, autocommit=True) as work:
            work.execute(SERVER_WORK).fetchone()
            result = hook.result(completions=4)
    finally:
        inside.kill()
        inside.wait(timeout=scaled(30))
    assert "error" not in result, result
    assert result["workers"] == 2, result  # the process that exited before the window is not there
    assert exits.returncode == 0 and 600 <= result["workers_ms"] <= 1600, result  # 0.5 + 0.3 s burned inside
    assert result["backends_ms"] > 0, result
    per = result["per_completion_ms"]
    assert per["workers_ms"] == pytest.approx(result["workers_ms"] / 4, abs=0.001)
    assert per["busy_ms"] == pytest.approx((result["workers_ms"] + result["backends_ms"]) / 4, abs=0.001)


def _phase(mode: str, workers_ms: float, backends_ms: float, count: int) -> dict:
    cpu = {"window_seconds": 20.0, "workers": 2, "backends": 2, "workers_ms": workers_ms,
           "backends_ms": backends_ms, "machine_busy_ms": 40000.0, "machine_busy_pct": 99.0}
    return {"mode": mode, "count": count, "cpu": {**cpu, "per_completion_ms": per_completion(cpu, count)}}


def test_cpu_ratio_is_the_quotient_of_the_measured_figures():
    """product busy ms per completion / procrastinate's per job, from the phases' figures; None where a side was not
    measured; the text report names both figures, the ratio and the goal."""
    peer = _phase("peer", 1000.0, 1000.0, 1000)  # 2 ms per job
    single, batch = _phase("single", 6000.0, 2000.0, 1000), _phase("batch", 1500.0, 1500.0, 1000)
    assert cpu_ratios([single, batch], peer) == {"single_cpu_over_peer": 4.0, "batch_cpu_over_peer": 1.5}
    assert cpu_ratios([single], _phase("peer", 1000.0, 1000.0, 4000)) == {"single_cpu_over_peer": 16.0}
    assert cpu_ratios([single], {**peer, "cpu": {"error": "gone"}}) == {"single_cpu_over_peer": None}
    assert cpu_ratios([{**single, "cpu": None}], peer) == {"single_cpu_over_peer": None}
    report = {"throughput": [single, batch], "peer": peer, "ratios": cpu_ratios([single, batch], peer)}
    text = "\n".join(cpu_lines(report))
    assert "busy CPU single: 8.000 ms per completion" in text and "busy CPU procrastinate: 2.000 ms" in text
    assert "single / procrastinate: 4.0 (goal 4: <= 2)" in text


def test_check_fails_past_the_goal_and_without_a_measurement():
    """`--check` holds the batched mode to goal 4 (<= 2x procrastinate's busy CPU per job), computed from the
    figures: it passes at 1.5x, fails at 2.5x and fails when either side was not measured."""
    peer = _phase("peer", 1000.0, 1000.0, 1000)
    ok = {"ratios": cpu_ratios([_phase("batch", 1500.0, 1500.0, 1000)], peer)}
    assert cpu_check(ok) == ""
    over = {"ratios": cpu_ratios([_phase("batch", 2500.0, 2500.0, 1000)], peer)}
    assert "2.5 > 2" in cpu_check(over)
    unmeasured = {"ratios": cpu_ratios([_phase("batch", 1500.0, 1500.0, 1000)], {**peer, "cpu": None})}
    assert "not measured" in cpu_check(unmeasured)
