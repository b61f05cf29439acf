"""`web_server`: the real web process as `make run` serves it (gunicorn with config/gunicorn.py), bound to this
run's test databases, started once for the module that asks for it."""
from contextlib import contextmanager

import pytest

from tests.faults.servers import (
    child_environment,
    free_port,
    run_database_env,
    wait_http,
    wait_web_workers,
    web_child,
)


def start_web(root, **extra):
    env = child_environment(secret_dir=str(root / "secrets"), REDIS_URL="redis://127.0.0.1:1/0",
                            DJANGO_STATIC_ROOT=str(root / "static"), **{**run_database_env(), **extra})
    port = free_port()
    web = web_child(env, port, root).start()
    try:
        wait_http(port, 90, web.proc)
        wait_web_workers(web)
    except BaseException:
        web.stop()
        raise
    return port, web


@pytest.fixture(scope="module")
def web_server(django_db_setup, tmp_path_factory):
    port, web = start_web(tmp_path_factory.mktemp("web-server"))
    try:
        yield port
    finally:
        web.stop()


@contextmanager
def in_memory_tracing(sampler=None):
    """Tracing on for the block, into an in-memory exporter (yielded); `sampler` as the SDK takes it (default:
    every span sampled)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from connector import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


@pytest.fixture
def spans():
    """Tracing on, into an in-memory exporter, for the test only."""
    with in_memory_tracing() as exporter:
        yield exporter
