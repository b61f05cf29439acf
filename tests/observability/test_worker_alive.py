"""Celery worker liveness (issue 21): the heartbeat file a worker touches when ready and on every heartbeat of its
consumer loop, and `manage.py worker_alive --max-age S`, the orchestrator's liveness probe."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from observability import workers
from tests.faults.servers import child_environment
from tests.support import scaled, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _probe(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "worker_alive", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=scaled(60), check=False)


def test_worker_alive_reads_the_heartbeat_age(settings, tmp_path):
    """Fresh heartbeat: exit 0. Older than --max-age, or missing: exit 1 with a stable code in the message
    (WORKER_HEARTBEAT_STALE, WORKER_HEARTBEAT_MISSING). Proves: issue 21 (worker liveness)."""
    settings.CONNECTOR_WORKER_HEARTBEAT_FILE = str(tmp_path / "beat")
    with pytest.raises(CommandError, match="WORKER_HEARTBEAT_MISSING") as missing:
        call_command("worker_alive", "--max-age", "5")
    assert missing.value.returncode == 1
    workers.beat()
    call_command("worker_alive", "--max-age", "5")
    old = time.time() - 60
    os.utime(tmp_path / "beat", (old, old))
    with pytest.raises(CommandError, match="WORKER_HEARTBEAT_STALE") as stale:
        call_command("worker_alive", "--max-age", "30")
    assert stale.value.returncode == 1
    call_command("worker_alive", "--max-age", "90")


@pytest.mark.slow
def test_a_real_worker_beats_while_its_loop_runs_and_stops_beating_when_it_stops(tmp_path):
    """A real Celery worker (solo pool, its own Redis database) writes the file when ready and refreshes it every
    heartbeat (2 s), so the probe process exits 0; stopped (SIGTERM), it removes the file and the probe exits 1.
    Proves: issue 21 (Celery workers report liveness)."""
    beat = tmp_path / "worker.heartbeat"
    env = child_environment(secret_dir=str(tmp_path), CONNECTOR_WORKER_HEARTBEAT_FILE=str(beat),
                            REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/8"))
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "config", "worker", "-P", "solo",
                               "-Q", f"liveness-{os.getpid()}", "--without-mingle", "--without-gossip",
                               "-l", "warning", "-n", f"liveness-{os.getpid()}@%h"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(beat.exists, 60, "the worker wrote its heartbeat", interval=0.2, proc=worker)
        first = beat.stat().st_mtime
        wait_for(lambda: beat.stat().st_mtime > first, 15, "the heartbeat advanced", interval=0.2)
        alive = _probe(env, "--max-age", str(math.ceil(scaled(10))))
        assert alive.returncode == 0, alive.stderr
        assert alive.stdout.startswith("alive: last heartbeat")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=scaled(30))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    assert not beat.exists()
    dead = _probe(env, "--max-age", "10")
    assert dead.returncode == 1 and "WORKER_HEARTBEAT_MISSING" in dead.stderr
