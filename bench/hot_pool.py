"""The pool of bench client processes ('spawn' context, one database connection each) and the connection
string they share."""
from __future__ import annotations

import contextlib
import multiprocessing
import queue as queue_module
import time

from bench.hot_client import _process_main
from bench.hot_recorder import Progress


# =================================================================================================================
# the parent: process pool, phases, report
# =================================================================================================================

class Pool:
    """`size` bench processes (spawn), each bootstrapped once; commands go to chosen members."""

    def __init__(self, size: int, setup: dict, say: Progress, *, shared: int = 0) -> None:
        """`shared` > 0: every process holds the product mode's shared counters and wake-up semaphores for that many
        materialization slots (`self.shared`, bench.mix_product.Shared)."""
        ctx = multiprocessing.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(size)]
        self.shared = None
        target = _process_main
        if shared:
            from bench.mix_product import Shared, process_main as target

            self.shared = Shared(ctx, shared)
        extra = (self.shared,) if shared else ()
        self.processes = [ctx.Process(target=target, args=(i, setup, self.inboxes[i], self.outbox, *extra),
                                      name=f"bench-hot-{i}", daemon=True) for i in range(size)]
        say(f"starting {size} bench processes (spawn)")
        for p in self.processes:
            p.start()
        self._collect(range(size), timeout=180, what="bootstrap")

    def _collect(self, indexes, *, timeout: float, what: str) -> dict[int, object]:
        """One answer from each of `indexes`. A failure is raised only after every member answered, so no late
        answer of this command is mistaken for one of the next."""
        wanted, results, failures = set(indexes), {}, []
        until = time.time() + timeout
        while wanted:
            try:
                kind, index, payload = self.outbox.get(timeout=max(0.1, until - time.time()))
            except queue_module.Empty:
                dead = [i for i in wanted if not self.processes[i].is_alive()]
                raise RuntimeError(f"bench processes {sorted(wanted)} gave no {what} result in {timeout:.0f} s"
                                   + (f" (dead: {dead})" if dead else "")) from None
            wanted.discard(index)
            if kind == "failed":
                failures.append(f"bench process {index} failed during {what}:\n{payload}")
            else:
                results[index] = payload
        if failures:
            raise RuntimeError("\n".join(failures))
        return results

    def run(self, commands: dict[int, dict], *, timeout: float, what: str) -> dict[int, object]:
        for index, command in commands.items():
            self.inboxes[index].put(command)
        return self._collect(commands, timeout=timeout, what=what)

    def close(self) -> None:
        for inbox in self.inboxes:
            with contextlib.suppress(Exception):
                inbox.put(None)
        for p in self.processes:
            p.join(timeout=10)
        for p in self.processes:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


def _conninfo(settings_dict: dict) -> str:
    from psycopg.conninfo import make_conninfo

    parts = {"dbname": settings_dict["NAME"], "host": settings_dict.get("HOST") or None,
             "port": settings_dict.get("PORT") or None, "user": settings_dict.get("USER") or None,
             "password": settings_dict.get("PASSWORD") or None}
    return make_conninfo(**{k: str(v) for k, v in parts.items() if v})
