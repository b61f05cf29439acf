"""Real concurrent transactions: each worker runs in its own thread with its own database connection."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from tests.support import holds_within, scaled


class Worker(threading.Thread):
    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished_at: float | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
        finally:
            self.finished_at = time.monotonic()
            connections.close_all()


def start(fn: Callable[[], Any], name: str = "worker") -> Worker:
    worker = Worker(fn, name)
    worker.start()
    return worker


def backend_pid_waiting(using: str = "default") -> list[int]:
    """PIDs of sessions of this test database currently waiting on a lock (pg_locks not granted)."""
    with connections[using].cursor() as cursor:
        # row-lock waits are on transaction ids (no database column): join the session to its database
        cursor.execute("SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                       "WHERE NOT l.granted AND a.datname = current_database()")
        return [r[0] for r in cursor.fetchall()]


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether `predicate` comes true within `timeout` seconds scaled by the suite's time factor (tests.support)."""
    return holds_within(predicate, timeout)


def run_concurrently(jobs: list, expect: type[BaseException] | tuple[type[BaseException], ...] = BaseException,
                     before: Callable[[], Any] | None = None) -> list:
    """Run each job on its own thread (its own PostgreSQL connection), released together by a barrier; `before`,
    if given, runs on each thread ahead of the barrier (e.g. `lambda: connection.ensure_connection()`, so the
    jobs really overlap instead of racing through connection setup). Returns
    each job's value or the exception it raised; every thread closes its connection. An exception that is not an
    instance of `expect` (the refusals the test allows) is raised again here, after every thread has ended, so an
    unexpected error fails the test instead of becoming a result."""
    barrier = threading.Barrier(len(jobs))
    results: list = [None] * len(jobs)

    def run(i: int, job) -> None:
        try:
            if before is not None:
                before()
            barrier.wait(timeout=scaled(30))
            results[i] = job()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(120))
        assert not t.is_alive(), "a thread hung (lock wait without end?)"
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, expect):
            raise result
    return results


def raised(results: list) -> list[BaseException]:
    """The exceptions among `run_concurrently`'s results."""
    return [r for r in results if isinstance(r, BaseException)]
