"""`make run`'s supervisor (scripts/run.py) as a real process against this test's databases and a private Redis,
with signed deliveries over HTTP: the harness of the fault tests of issue 37 items 5 and 6.

Every wait polls a condition; FAULT_TIME_FACTOR (default 1) stretches the bounds on a loaded machine."""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from connector.models import CredentialGeneration, ReceiptAdmissionKey
from connector.secrets import secret_backend
from connector.services.signatures import sign
from tests.faults.servers import Child, child_environment, free_port, run_database_env, wait_http
from tests.hostile.settled import receipt_outcome

CHANNEL = "records.webhook"
WORKERS = ("worker-materialize", "worker-claims", "worker-egress", "worker-sweeper")
FACTOR = float(os.environ.get("FAULT_TIME_FACTOR", "1") or 1)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    """Poll `predicate` until it returns a truthy value (returned) or `timeout` x FAULT_TIME_FACTOR seconds pass."""
    deadline = time.monotonic() + timeout * FACTOR
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout * FACTOR:.0f} s")
        time.sleep(interval)


def delivery(prefix: str, n: int) -> bytes:
    return json.dumps({"events": [{"id": f"{prefix}-ev-{n}", "type": "record.updated",
                                   "record_id": f"{prefix}-r-{n}", "sequence": 1,
                                   "occurred_at": "2026-01-01T00:00:00Z",
                                   "data": {"name": f"Fault {n}", "email": f"{prefix}{n}@example.com"}}]}).encode()


@dataclass
class Sender:
    """Signed single-event deliveries to one account over HTTP, each answer recorded."""

    url: str
    account: str
    prefix: str
    timeout: float = 30.0
    fresh_connections: bool = False  # a new TCP connection for each delivery (`Connection: close`), as many senders do
    answers: list[tuple[int, int | None, float, str]] = field(default_factory=list)  # (n, status, seconds, note)

    def __post_init__(self) -> None:
        generation = CredentialGeneration.objects.get(generation_id=f"{self.account}.webhook-signing.g1")
        self.secret = secret_backend().read(generation.secret_version_ref)
        self.client = httpx.Client(timeout=self.timeout)

    def post(self, n: int) -> tuple[int | None, float]:
        body = delivery(self.prefix, n)
        headers = {"Idempotency-Key": f"{self.prefix}-{n}", "Content-Type": "application/json",
                   "Connector-Signature": sign(self.secret, int(time.time()), body)}
        if self.fresh_connections:
            headers["Connection"] = "close"
        began = time.monotonic()
        try:
            response = self.client.post(f"{self.url}/api/v2/accounts/{self.account}/channels/{CHANNEL}/receipts",
                                        content=body, headers=headers)
            status, note = response.status_code, response.text[:200]
        except httpx.HTTPError as exc:
            status, note = None, f"{type(exc).__name__}: {exc}"
        elapsed = time.monotonic() - began
        self.answers.append((n, status, elapsed, note))
        return status, elapsed

    def accepted(self) -> list[int]:
        return [n for n, status, _, _ in self.answers if status == 201]

    def refused(self) -> list[tuple[int, int | None, str]]:
        return [(n, status, note) for n, status, _, note in self.answers if status != 201]


class Burst(threading.Thread):
    """A sender posting one delivery every `interval` seconds until stopped (a thread, so the test can act on the
    processes meanwhile)."""

    def __init__(self, sender: Sender, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.sender, self.interval, self.halt = sender, interval, threading.Event()
        self.count = 0

    def run(self) -> None:
        while not self.halt.is_set():
            self.sender.post(self.count)
            self.count += 1
            self.halt.wait(self.interval)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=60)


def unsettled(keys: list[str]) -> list[str]:
    """The transport keys among `keys` whose receipt does not exist or has not settled (tests/hostile/settled.py)."""
    receipts = dict(ReceiptAdmissionKey.objects.filter(transport_key__in=keys).values_list("transport_key",
                                                                                            "receipt_id"))
    return [key for key in keys if receipts.get(key) is None or receipt_outcome(receipts[key]) is None]


class Supervised:
    """scripts/run.py (make run's supervisor) with its output in a file."""

    def __init__(self, child: Child, port: int) -> None:
        self.child, self.port = child, port
        self.url = f"http://127.0.0.1:{port}"

    def output(self) -> str:
        return self.child.logs[-1].read_text(errors="replace")

    def pids(self, name: str) -> list[int]:
        """The pid of every start of child `name`, in order."""
        line = rf"(?m)^run\s*\| started {re.escape(name)}(?: \(restart \d+\))? \(pid (\d+)\)"
        return [int(pid) for pid in re.findall(line, self.output())]

    def ready_count(self, name: str) -> int:
        """How many times child `name` logged Celery's `ready.`"""
        return len(re.findall(rf"(?m)^{re.escape(name)}\s*\|.* ready\.", self.output()))

    def wait_workers_ready(self, timeout: float = 120.0) -> None:
        wait_for(lambda: all(self.ready_count(name) >= len(self.pids(name)) >= 1 for name in WORKERS), timeout,
                 "every worker group of make run ready", interval=0.5)

    def alive(self, pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        pid = self.pids(name)[-1]
        os.kill(pid, sig)
        return pid


def start_make_run(*, secret_dir: str, redis_url: str, log_dir: Path) -> Supervised:
    """scripts/run.py as `make run` runs it (web, every worker group, beat, the demo receiver) on free ports, with
    beat's schedule, the metrics directory and the worker heartbeat file under `log_dir`."""
    import sys

    port, receiver_port = free_port(), free_port()
    env = child_environment(secret_dir=secret_dir, REDIS_URL=redis_url, PORT=str(port),
                            DEMO_RECEIVER_PORT=str(receiver_port),
                            CONNECTOR_EGRESS_BASE_URL=f"http://127.0.0.1:{receiver_port}",
                            CONNECTOR_EGRESS_TIMEOUT_SECONDS="5", RUN_BEAT_SCHEDULE=str(log_dir / "beat-schedule"),
                            PROMETHEUS_MULTIPROC_DIR=str(log_dir / "metrics"),
                            CONNECTOR_WORKER_HEARTBEAT_FILE=str(log_dir / "worker.heartbeat"),
                            WEB_CONCURRENCY="2", **run_database_env())
    child = Child("make-run", [sys.executable, "scripts/run.py"], env, log_dir).start()
    supervised = Supervised(child, port)
    try:
        wait_http(port, 120 * FACTOR, child.proc)
    except BaseException:
        child.stop(grace=15)
        raise
    return supervised


def stop_make_run(supervised: Supervised) -> None:
    """SIGTERM to the supervisor (it stops its children within its 10 s grace); then SIGKILL to the process group of
    any child it started that is still there (only processes this test started)."""
    supervised.child.stop(grace=30)
    for pid in re.findall(r"(?m)^run\s*\| started \S+(?: \(restart \d+\))? \(pid (\d+)\)", supervised.output()):
        try:
            os.killpg(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
