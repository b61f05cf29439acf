"""Celery worker liveness (issue 21): a heartbeat file touched when the worker is ready and on every heartbeat of
its consumer loop (Celery's `heartbeat_sent`, every 2 s), read by `manage.py worker_alive --max-age S` as an
orchestrator's liveness probe. A worker whose consumer loop hangs stops touching it; one that shuts down removes
it. The file holds the last beat's Unix time and the worker's pid; its modification time is what counts."""
from __future__ import annotations

import os
import time

from django.conf import settings


def heartbeat_path() -> str:
    return settings.CONNECTOR_WORKER_HEARTBEAT_FILE


def beat(**_signal) -> None:
    """Touch the heartbeat file (write then rename: a reader never sees a half-written file)."""
    path = heartbeat_path()
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{time.time():.3f} {os.getpid()}\n")
    os.replace(tmp, path)


def gone(**_signal) -> None:
    """The worker stops: its heartbeat goes with it (a probe during shutdown reports it dead)."""
    path = heartbeat_path()
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def connect(signals) -> None:
    """Connect the liveness and tracing hooks to Celery's signals (config/celery.py)."""
    from observability import tracing

    signals.worker_ready.connect(beat, weak=False, dispatch_uid="observability.workers.ready")
    signals.heartbeat_sent.connect(beat, weak=False, dispatch_uid="observability.workers.heartbeat")
    signals.worker_shutdown.connect(gone, weak=False, dispatch_uid="observability.workers.shutdown")
    signals.worker_init.connect(lambda **_: tracing.configure(), weak=False,
                                dispatch_uid="observability.tracing.worker_init")
    signals.worker_process_init.connect(lambda **_: tracing.configure(), weak=False,
                                        dispatch_uid="observability.tracing.worker_process_init")
    signals.worker_process_shutdown.connect(lambda **_: tracing.shutdown(), weak=False,
                                            dispatch_uid="observability.tracing.worker_process_shutdown")
    signals.worker_shutdown.connect(lambda **_: tracing.shutdown(), weak=False,
                                    dispatch_uid="observability.tracing.worker_shutdown")
