"""`/metrics` in the Prometheus text format. A custom collector reads PostgreSQL at scrape time (observability/
readings.py), so the gauges are the same whichever web worker answers and however many run. The latencies counted in
process memory where the work happens (the admission histogram, connector.stage_metrics) are added by
`add_counted`: with PROMETHEUS_MULTIPROC_DIR, summed over every process writing that directory (a worker's own
scrape, observability/workers.py, uses the same). Protected by a bearer token when CONNECTOR_METRICS_TOKEN is set
(production requires it)."""
from __future__ import annotations

import hmac
import os
import time

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.http import HttpResponse
from django.utils import timezone
from django.utils.module_loading import import_string
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from connector.stage_metrics import COLLECTORS
from observability.admission import ADMISSION

from . import readings


class EngineCollector(Collector):
    """Every figure of one scrape, read in one read-only REPEATABLE READ snapshot of `default`."""

    def collect(self):
        began = time.monotonic()
        with transaction.atomic():
            if _outermost():
                with connection.cursor() as cursor:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            now = timezone.now()
            backlogs = readings.backlogs(now)
            gates = readings.gates_by_mode()
            epochs = readings.epochs_by_state()
            quarantines = readings.quarantines()
            permits = readings.open_permits()
        items = GaugeMetricFamily("connector_backlog_items", "Items waiting at a stage of the pipeline",
                                  labels=["stage"])
        ages = GaugeMetricFamily("connector_backlog_oldest_age_seconds",
                                 "Seconds the oldest item of a stage has waited (0 when the stage is empty)",
                                 labels=["stage"])
        for backlog in backlogs:
            items.add_metric([backlog.stage], backlog.count)
            ages.add_metric([backlog.stage], backlog.age(now))
        yield items
        yield ages
        gate_family = GaugeMetricFamily("connector_serving_gates", "Account serving gates by mode", labels=["mode"])
        for mode, n in sorted(gates.items()):
            gate_family.add_metric([mode], n)
        yield gate_family
        epoch_family = GaugeMetricFamily("connector_serving_epochs", "Serving epochs by state", labels=["state"])
        for state, n in sorted(epochs.items()):
            epoch_family.add_metric([state], n)
        yield epoch_family
        held = GaugeMetricFamily("connector_quarantined_items",
                                 "Halted or quarantined items by kind and closed reason code (governance/reasons.py)",
                                 labels=["kind", "reason"])
        held_age = GaugeMetricFamily("connector_quarantined_oldest_age_seconds",
                                     "Seconds since the oldest item of a kind and reason was halted or quarantined",
                                     labels=["kind", "reason"])
        for q in quarantines:
            held.add_metric([q.kind, q.reason], q.count)
            held_age.add_metric([q.kind, q.reason], max(0.0, (now - q.oldest).total_seconds()) if q.oldest else 0.0)
        yield held
        yield held_age
        gates_open = GaugeMetricFamily("connector_gates_with_open_permits",
                                       "Serving gates holding at least one open (granted or sending) dispatch permit")
        gates_open.add_metric([], permits.gates)
        yield gates_open
        most = GaugeMetricFamily("connector_open_permits_max_per_gate",
                                 "The most open dispatch permits any one serving gate holds (a halt of that gate "
                                 "waits for all of them; per-stage totals are connector_backlog_items{stage=~"
                                 "\"permit_.*\"})")
        most.add_metric([], permits.max_per_gate)
        yield most
        took = GaugeMetricFamily("connector_scrape_duration_seconds", "Seconds this scrape spent reading PostgreSQL")
        took.add_metric([], time.monotonic() - began)
        yield took


def _outermost() -> bool:
    """True when the scrape's atomic block is the connection's outermost one (a test wraps it in its own)."""
    return not connection.savepoint_ids


def _registry() -> CollectorRegistry:
    """The engine's figures, every collector settings.OBSERVABILITY_COLLECTORS names (an app above this one, the
    operator screens' reason map in governance.metrics, contributes its own figures without observability importing
    it), and the histograms and counters counted in process memory (`add_counted`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector())
    for path in getattr(settings, "OBSERVABILITY_COLLECTORS", ()):
        registry.register(import_string(path)())
    add_counted(registry)
    return registry


def counted_collectors() -> tuple:
    """Every metric counted in process memory: the admission histogram (web) and the stage latencies, egress and
    deferrals counted where the work happens (connector.stage_metrics, workers)."""
    return (ADMISSION, *COLLECTORS)


def add_counted(registry: CollectorRegistry) -> CollectorRegistry:
    """Counted in process memory, unlike the readings above: with PROMETHEUS_MULTIPROC_DIR, the sum of every
    process's files in that directory (prometheus-client's multiprocess mode: every web worker, every worker
    process of the host that shares it); without, this process's own figures."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        for collector in counted_collectors():
            registry.register(collector)
    return registry


def _authorized(request) -> bool:
    token = settings.CONNECTOR_METRICS_TOKEN
    if not token:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@never_cache
@require_GET
def metrics(request):
    """The scrape. 401 without the right bearer token when one is configured."""
    if not _authorized(request):
        response = HttpResponse("bearer token required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    try:
        body = generate_latest(_registry())
    except DatabaseError as exc:
        # Prometheus records the failed scrape (`up` 0); the figures are never guessed without PostgreSQL.
        return HttpResponse(f"database unavailable: {type(exc).__name__}\n", status=503, content_type="text/plain")
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
