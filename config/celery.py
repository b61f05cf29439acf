import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.local")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _close_old_connections(task=None, **kwargs) -> None:
    """At each task boundary, keep or drop the process's database connections by Django's rule (CONN_MAX_AGE,
    CONN_HEALTH_CHECKS, a connection broken by an error), as around a web request. Celery's fixup would close them
    unconditionally; CELERY_DB_REUSE_MAX turns that off (D-198). An eager task runs inside its caller's
    transaction and is left alone, as the fixup does."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


signals.task_prerun.connect(_close_old_connections, weak=False)
signals.task_postrun.connect(_close_old_connections, weak=False)

# Worker liveness file and the OpenTelemetry SDK of each worker process (issue 21, observability/).
from observability import workers as _observability_workers  # noqa: E402

_observability_workers.connect(signals)
