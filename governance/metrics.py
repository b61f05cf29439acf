"""What the operator screens add to /metrics (observability.metrics reads settings.OBSERVABILITY_COLLECTORS): the
closed reason map's alert deadlines, so an alert rule compares a quarantined item's age with its reason's deadline."""
from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .reasons import REASONS


class ReasonDeadlineCollector(Collector):
    def collect(self):
        family = GaugeMetricFamily("connector_reason_alert_deadline_seconds",
                                   "Alert deadline of each closed reason code (governance/reasons.py)",
                                   labels=["reason"])
        for code, reason in sorted(REASONS.items()):
            family.add_metric([code], reason.deadline.total_seconds())
        yield family
