"""`manage.py worker_alive --max-age S`: a Celery worker's liveness probe (issue 21, docs/operations.md).

Exit 0 when the worker's heartbeat file (CONNECTOR_WORKER_HEARTBEAT_FILE, touched by observability.workers on
Celery's ready and heartbeat signals) was touched at most S seconds ago; exit 1 when it is older or missing (the
worker never became ready, its consumer loop hangs, or it shut down). Reads no database and no broker: a probe
must not fail because PostgreSQL or Redis is down (readiness is /readyz's business)."""
from __future__ import annotations

import os
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Exit non-zero when this host's Celery worker heartbeat is older than --max-age seconds."
    requires_system_checks: list = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("--max-age", type=float, default=30.0, help="seconds (default 30; heartbeats every 2)")
        parser.add_argument("--file", default=None, help="heartbeat file (default CONNECTOR_WORKER_HEARTBEAT_FILE)")

    def handle(self, *args, max_age: float, file: str | None, **options) -> None:
        path = file or settings.CONNECTOR_WORKER_HEARTBEAT_FILE
        try:
            age = time.time() - os.stat(path).st_mtime
        except FileNotFoundError:
            raise CommandError(f"WORKER_HEARTBEAT_MISSING: no heartbeat file {path}", returncode=1)
        if age > max_age:
            raise CommandError(f"WORKER_HEARTBEAT_STALE: last heartbeat {age:.1f} s ago (max {max_age:g} s)",
                               returncode=1)
        self.stdout.write(f"alive: last heartbeat {age:.1f} s ago")
