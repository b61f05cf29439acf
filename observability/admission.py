"""Admission rate and latency by outcome (issue 21): `connector_admission_duration_seconds{outcome}`, a
Prometheus histogram observed by a middleware around the transport admission endpoint.

`outcome` is `created`, `duplicate` or `v1_accepted` for an accepted delivery, else the error code the API answered
(SIGNATURE_INVALID, RECEIPT_DIGEST_MISMATCH, GATE_NOT_SERVING, REQUEST_INVALID, ... : the closed catalog of
connector/api/exceptions.py), so the label set stays closed. The rate is `rate(..._count[5m])`.

Several processes: with PROMETHEUS_MULTIPROC_DIR set (an empty directory per host, wiped when the service starts;
prometheus-client's multiprocess mode) every web worker writes its observations there and `/metrics` sums all
of them; unset, each process reports its own (correct only with one web process, e.g. development)."""
from __future__ import annotations

import time

from prometheus_client import Histogram

from connector.api.exceptions import API_ERROR_CODES

ACCEPTED = ("created", "duplicate", "v1_accepted")
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
ADMISSION = Histogram("connector_admission_duration_seconds",
                      "Transport admissions (POST .../receipts) by outcome: the created/duplicate answer or the "
                      "error code; seconds from the request reaching the app to its answer",
                      labelnames=["outcome"], buckets=BUCKETS, registry=None)
URL_NAME = "receipt-admit"


def observe(outcome: str, seconds: float) -> None:
    ADMISSION.labels(outcome=outcome).observe(seconds)


def outcome_of(response) -> str:
    """The closed outcome label of an admission response."""
    data = getattr(response, "data", None)
    if isinstance(data, dict):
        if response.status_code < 300 and data.get("admission") in ACCEPTED:
            return data["admission"]
        if data.get("code") in API_ERROR_CODES:
            return data["code"]
    return "INTERNAL_ERROR" if response.status_code >= 500 else "REQUEST_INVALID"


class AdmissionMetricsMiddleware:
    """Times every request the admission view answers (after URL resolution; other paths pay one comparison)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        began = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        if match is not None and match.url_name == URL_NAME:
            observe(outcome_of(response), time.perf_counter() - began)
        return response
