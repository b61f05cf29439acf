"""The OpenTelemetry SDK of a process (issue 21, D-226): off unless OTEL_TRACES_EXPORTER names an exporter.

    OTEL_TRACES_EXPORTER=otlp  OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318   # OTLP/HTTP (protobuf)
    OTEL_TRACES_EXPORTER=console                                                   # spans on stdout (debugging)

Every other standard variable applies as the SDK reads it: OTEL_SERVICE_NAME (default `connector-v2`),
OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG), OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT/HEADERS/TIMEOUT,
OTEL_BSP_* (the batch processor) and OTEL_SDK_DISABLED. Unset (the default), nothing is installed and
`connector.tracing` stays off: no span, no statement, no header.

Called once per process where it starts serving: config/wsgi.py (each gunicorn worker loads the app after its
fork) and the Celery signals of config/celery.py (a prefork child configures its own provider, never the parent's
export thread). The provider is the process's own, not the global one, so a test installs its in-memory exporter
with `connector.tracing.enable(provider)` without fighting a global."""
from __future__ import annotations

import logging
import os

from connector import tracing

log = logging.getLogger(__name__)
_CONFIGURED_PID: int | None = None
_PROVIDER = None


def wanted(environ=os.environ) -> str | None:
    """The exporter the environment asks for (`otlp`, `console`), or None for off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    name = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    return None if name in ("", "none") else name


def configure(environ=os.environ) -> bool:
    """Install the SDK in this process if the environment asks for it (idempotent per process). True when on."""
    global _CONFIGURED_PID, _PROVIDER
    if _CONFIGURED_PID == os.getpid():
        return tracing.enabled()
    _CONFIGURED_PID = os.getpid()
    name = wanted(environ)
    if name is None:
        tracing.disable()
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    elif name == "console":
        exporter = ConsoleSpanExporter()
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: supported are otlp, console, none")
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: "connector-v2"}
    _PROVIDER = TracerProvider(resource=Resource.create(attributes))
    _PROVIDER.add_span_processor(BatchSpanProcessor(exporter))
    tracing.enable(_PROVIDER)
    log.info("tracing on", extra={"exporter": name})
    return True


def shutdown() -> None:
    """Flush and stop this process's exporter (a worker's shutdown signal)."""
    if _PROVIDER is not None and _CONFIGURED_PID == os.getpid():
        _PROVIDER.shutdown()
