"""gunicorn settings of the web process, for `make run` (scripts/run.py) and production alike (decision D-162).

    gunicorn -c python:config.gunicorn            # DJANGO_SETTINGS_MODULE picks the settings (production default)

Every value can be overridden on the command line (`--bind`, `--workers`, ...); the environment variables below
size it without editing the file. The worker class (config/webserver.py) answers every refusal of the server with
the API's JSON error catalog, refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE before reading it, and keeps the raw
Idempotency-Key."""
from __future__ import annotations

import os

from config.env import env_int, env_str

wsgi_app = "config.wsgi:application"
worker_class = "config.webserver.ConnectorWorker"

# Loopback unless told otherwise: a reverse proxy or load balancer faces the network.
bind = [env_str("WEB_BIND", f"127.0.0.1:{env_str('PORT', '8000')}")]
# Connections the kernel queues before gunicorn accepts them (capped by net.core.somaxconn). runserver's 10
# reset clients of a 32-connection burst; this holds thousands.
backlog = env_int("WEB_BACKLOG", 2048)

# Processes sized to the machine, threads for requests that wait on PostgreSQL: one process per core plus one
# (D-360). A request is mostly Python holding its process's GIL; the 4 threads of each process already cover the
# waits on PostgreSQL, so more processes than cores only add PostgreSQL backends, per-process warm-up and
# context switches on the cores the Celery stages and PostgreSQL share (bench burst's busy CPU per event).
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers(cores: int) -> int:
    return cores + 1


workers = env_int("WEB_CONCURRENCY", default_workers(_CORES))
threads = env_int("WEB_THREADS", 4)

# A worker whose main loop is silent this long is replaced; a stop waits this long for requests in flight
# (below scripts/run.py's 10 s before SIGKILL); idle keep-alive connections close after this.
timeout = env_int("WEB_TIMEOUT", 30)
graceful_timeout = 8
keepalive = 5

# Slow clients (issue 37 item 6, D-412): the worker's main loop reads a request's head and body before a thread takes
# it (config/webserver.py), so a trickling client holds a connection slot, never a thread. The head must be complete
# within WEB_HEADER_TIMEOUT seconds (default 10) of the connection's accept (kept alive: of the next request's first
# byte), the body within WEB_BODY_TIMEOUT seconds (default 30) of the head's end; otherwise the connection is closed.
# Each worker holds at most this many connections (a head and a body of at most DATA_UPLOAD_MAX_MEMORY_SIZE buffered
# each), the rest wait in the listen backlog.
worker_connections = env_int("WEB_WORKER_CONNECTIONS", 100)

# Request head limits. The API's largest header is a 255-code-point Idempotency-Key (at most 1,020 bytes).
limit_request_line = 8190  # gunicorn's maximum
limit_request_fields = 100
limit_request_field_size = 8190

# HTTP/1.1 only, parsed in Python: config/webserver.py reads the raw Idempotency-Key from the header block.
http_protocols = "h1"
http_parser = "python"

# No runtime control socket: its default path is per user, shared by every gunicorn of that user.
control_socket_disable = True

accesslog = "-"
errorlog = "-"
loglevel = env_str("WEB_LOG_LEVEL", "info")


def post_worker_init(worker) -> None:
    """One line per worker once it has loaded the app and can serve (gunicorn logs only its fork)."""
    worker.log.info("Worker ready (pid: %s)", worker.pid)
