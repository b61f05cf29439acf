"""Persistent database connections (issue 18, D-198): a worker process keeps its connection from one Celery task
to the next, and a connection PostgreSQL terminated in between is replaced at the next task, not reported as an
error by it."""
from __future__ import annotations

import psycopg
import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.conf import settings
from django.db import connection

from config.celery import _close_old_connections, app
from connector import tasks


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _task_boundary(fixup: DjangoWorkerFixup, task) -> None:
    """What a worker process runs between two tasks: the end of one, the start of the next."""
    fixup.on_task_postrun(sender=task)
    _close_old_connections(task=task)
    fixup.on_task_prerun(sender=task)
    _close_old_connections(task=task)


def test_both_databases_keep_connections_with_health_checks():
    """Both databases keep a connection for DATABASE_CONN_MAX_AGE (default 600 s) and health-check it on reuse."""
    for alias in ("default", "journal"):
        assert settings.DATABASES[alias]["CONN_MAX_AGE"] == settings.DATABASE_CONN_MAX_AGE == 600
        assert settings.DATABASES[alias]["CONN_HEALTH_CHECKS"] is True


@pytest.mark.django_db(transaction=True)
def test_a_worker_keeps_its_connection_between_tasks_and_replaces_a_terminated_one():
    """Celery's Django fixup no longer closes the connection at every task boundary: the next task runs on the
    same PostgreSQL session. When PostgreSQL terminates that session between tasks (a restart, an operator's
    pg_terminate_backend), the health check at the next use notices and the task runs on a new session."""
    fixup = DjangoWorkerFixup(app)
    task = tasks.receipt_materialize
    first = _backend_pid()
    _task_boundary(fixup, task)
    assert _backend_pid() == first, "the connection was closed between tasks"

    s = connection.settings_dict
    with psycopg.connect(host=s["HOST"] or None, port=s["PORT"] or None, user=s["USER"] or None,
                         password=s["PASSWORD"] or None, dbname=s["NAME"], autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [first]).fetchone()[0] is True
    _task_boundary(fixup, task)
    second = _backend_pid()
    assert second != first
    _task_boundary(fixup, task)
    assert _backend_pid() == second
