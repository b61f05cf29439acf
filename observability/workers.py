"""Celery worker liveness (issue 21): a heartbeat file touched when the worker is ready and on every heartbeat of
its consumer loop (Celery's `heartbeat_sent`, every 2 s), read by `manage.py worker_alive --max-age S` as an
orchestrator's liveness probe. A worker whose consumer loop hangs stops touching it; one that shuts down removes
it. The file holds the last beat's Unix time and the worker's pid; its modification time is what counts.

A worker's own scrape (D-231): with CONNECTOR_WORKER_METRICS_PORT set, the worker's main process serves the metrics
counted in process memory (observability.metrics.add_counted) on that port from `worker_ready`, once."""
from __future__ import annotations

import logging
import os
import time

from django.conf import settings

from observability import tracing

log = logging.getLogger(__name__)
_served: dict[str, object] = {}


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


def serve_metrics(**_signal) -> int | None:
    """Start this worker's metrics server (a daemon thread of the main process) on CONNECTOR_WORKER_METRICS_PORT;
    0 serves nothing. Returns the bound port. Without PROMETHEUS_MULTIPROC_DIR it can only show the main process's
    own counts, which a prefork pool's children never reach: it warns."""
    port = int(getattr(settings, "CONNECTOR_WORKER_METRICS_PORT", 0) or 0)
    if port <= 0:
        return None
    if "server" in _served:
        return _served["port"]
    from prometheus_client import start_http_server
    from prometheus_client.registry import CollectorRegistry

    # local (layout allow-list): config.celery imports this module before settings load; metrics reads the models
    from observability.metrics import add_counted

    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        log.warning("CONNECTOR_WORKER_METRICS_PORT without PROMETHEUS_MULTIPROC_DIR: the scrape shows this process's "
                    "own counts only (a prefork pool's children are not included)")
    addr = getattr(settings, "CONNECTOR_WORKER_METRICS_ADDR", "127.0.0.1")
    server, _thread = start_http_server(port, addr=addr, registry=add_counted(CollectorRegistry(auto_describe=False)))
    _served.update(server=server, port=server.server_port)
    log.info("worker metrics served on %s:%s", addr, server.server_port)
    return server.server_port


def connect(signals) -> None:
    """Connect the liveness and tracing hooks to Celery's signals (config/celery.py)."""
    signals.worker_ready.connect(beat, weak=False, dispatch_uid="observability.workers.ready")
    signals.worker_ready.connect(serve_metrics, weak=False, dispatch_uid="observability.workers.metrics")
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
