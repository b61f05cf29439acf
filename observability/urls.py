"""The health and metrics endpoints, mounted at the root by config/urls.py (no sign-in; /metrics has its token)."""
from django.urls import path

from . import health, metrics

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
]
