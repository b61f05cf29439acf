"""OpenTelemetry traces across the pipeline (issue 21, D-225, D-226): one trace from the HTTP admission through
materialization, lane advance, claim, Runtime and the OutboundCommand to the egress request.

Only the OpenTelemetry API is used here; `observability.tracing.configure()` installs the SDK and its exporter
from the standard OTEL_* variables and calls `enable()`. Until then (the default) every helper returns at once:
no span, no statement, no header, so the hot path pays a boolean test per call and nothing else.

The context crosses process boundaries only through PostgreSQL: `remember` inserts the current span's W3C
`traceparent` beside the durable row written in the same transaction (connector.models.TraceCarrier tables);
`stage` reads it back in the next worker and starts a child span. A broker message never carries it, so a lost
message, a redelivery or a restarted worker continues the same trace."""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from django.db import connection
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from connector import logcontext

__all__ = ["enable", "disable", "enabled", "current", "remember", "stage", "entry", "minted", "traced", "server_span",
           "http_entry", "inject"]

_ENABLED = False
_TRACER: trace.Tracer | None = None
_PROPAGATOR = TraceContextTextMapPropagator()
_OFF = nullcontext()
TRACESTATE_MAX = 512  # the W3C limit; a longer incoming tracestate is dropped, never cut mid-member


def enable(provider: trace.TracerProvider | None = None) -> None:
    """Start tracing with `provider` (the global one when None). Called once per process by
    observability.tracing.configure(), or by a test with an in-memory exporter."""
    global _ENABLED, _TRACER
    _TRACER = (provider or trace.get_tracer_provider()).get_tracer("connector-v2")
    _ENABLED = True


def disable() -> None:
    global _ENABLED, _TRACER
    _ENABLED, _TRACER = False, None


def enabled() -> bool:
    return _ENABLED


def _carrier_of(span_context) -> tuple[str, str] | None:
    """The W3C headers of a sampled span context; None for an invalid or unsampled one (D-236: a trace the sampler
    dropped leaves no row behind, so the stages after it read nothing and start no span)."""
    if not span_context.is_valid or not span_context.trace_flags.sampled:
        return None
    headers: dict[str, str] = {}
    _PROPAGATOR.inject(headers, context=trace.set_span_in_context(trace.NonRecordingSpan(span_context)))
    state = headers.get("tracestate", "")
    return headers["traceparent"], state if len(state) <= TRACESTATE_MAX else ""


def current() -> tuple[str, str] | None:
    """The current span's (traceparent, tracestate) while tracing is on and a span is current, else None: what a
    hot path's one statement writes beside its row itself (`connector_receipt_admit`, D-235)."""
    if not _ENABLED:
        return None
    return _carrier_of(trace.get_current_span().get_span_context())


def remember(carrier, pk: int) -> None:
    """Record the current span's context for the durable row `pk` of `carrier` (a TraceCarrier model), in the
    caller's transaction (the row's own). Tracing off, or no current span: nothing, not even a statement. One
    INSERT otherwise; a row already carrying a context keeps it (the first writer's trace)."""
    if not _ENABLED:
        return
    found = _carrier_of(trace.get_current_span().get_span_context())
    if found is None:
        return
    meta = carrier._meta
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{meta.db_table}" ("{meta.pk.column}", traceparent, tracestate) VALUES (%s, %s, %s) '
            f'ON CONFLICT ("{meta.pk.column}") DO NOTHING', [pk, *found])


def remember_many(carrier, pks: list[int]) -> None:
    """`remember` for the rows a set-based statement wrote (a batch receipt's projections or executions): one
    INSERT for all of them, nothing when tracing is off or no span is current."""
    if not _ENABLED or not pks:
        return
    found = _carrier_of(trace.get_current_span().get_span_context())
    if found is None:
        return
    meta = carrier._meta
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{meta.db_table}" ("{meta.pk.column}", traceparent, tracestate) '
            f'SELECT pk, %s, %s FROM unnest(%s::bigint[]) AS pk ON CONFLICT ("{meta.pk.column}") DO NOTHING',
            [*found, list(pks)])


def _parent(carrier, lookup: dict):
    """The stored context of the row `lookup` selects in `carrier`; the empty (root) context when none is stored
    (the row was written while tracing was off)."""
    row = carrier.objects.filter(**lookup).values_list("traceparent", "tracestate").first()
    if row is None:
        return None
    headers = {"traceparent": row[0]}
    if row[1]:
        headers["tracestate"] = row[1]
    return _PROPAGATOR.extract(headers)


@contextmanager
def _span(name: str, *, context=None, kind=SpanKind.INTERNAL, attributes: dict | None = None) -> Iterator:
    attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
    with _TRACER.start_as_current_span(name, context=context, kind=kind, attributes=attrs) as span:
        sc = span.get_span_context()
        with logcontext.bound(trace_id=format(sc.trace_id, "032x"), span_id=format(sc.span_id, "016x")):
            yield span


def stage(name: str, carrier=None, *, log: dict | None = None, attributes: dict | None = None,
          kind: SpanKind | None = None, **lookup):
    """A span for one pipeline stage, continuing the trace stored with the durable row `lookup` selects in
    `carrier` (one SELECT), or the current span when no carrier is named; `log` ids are bound for the block's
    log lines (connector.logcontext) whether tracing is on or not. Off and no `log`: a shared no-op."""
    if not _ENABLED:
        return logcontext.bound(**log) if log else _OFF
    context = _parent(carrier, lookup) if carrier is not None else None
    if carrier is not None and context is None:
        # No stored context: the row was written while tracing was off, or its trace was not sampled. Start no
        # stray root trace (D-236); the log ids are bound all the same.
        return logcontext.bound(**log) if log else _OFF
    if kind is None:
        kind = SpanKind.CONSUMER if carrier is not None else SpanKind.INTERNAL
    span = _span(name, context=context, kind=kind, attributes={**(attributes or {}), **(log or {})})
    if not log:
        return span
    return _both(logcontext.bound(**log), span)


@contextmanager
def _both(first, second) -> Iterator:
    with first, second as value:
        yield value


def entry(name: str, carrier=None, *, arg: str, lookup: str | None = None, log: str | None = None,
          kind: SpanKind | None = None) -> Callable:
    """Decorator for a stage entry point (a Celery task, the egress call) that receives a row id as keyword or
    first positional argument `arg`: binds it in the log context as `log` and runs the call in `stage(name,
    carrier, **{lookup: id})`. Off: one log binding (when `log`), no span, no statement."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            value = kwargs[arg] if arg in kwargs else args[0]
            with stage(name, carrier if lookup else None, log={log: value} if log else None, kind=kind,
                       **({lookup: value} if lookup else {})):
                return fn(*args, **kwargs)
        return call
    return wrap


def minted(carrier, pk: int, *, name: str, parent, **lookup) -> None:
    """Record the context of a row minted by a stage: the current span's when one is recording (the row is
    written inside a traced stage), else a `name` span continuing the context stored with the `parent` row that
    `lookup` selects (e.g. a lane Projection's, for the lane advance that mints its Execution). Nothing when
    tracing is off or neither context exists (no stray root traces)."""
    if not _ENABLED:
        return
    if trace.get_current_span().get_span_context().is_valid:
        remember(carrier, pk)
        return
    context = _parent(parent, lookup)
    if context is None:
        return
    with _span(name, context=context, kind=SpanKind.CONSUMER):
        remember(carrier, pk)


def traced(name: str) -> Callable:
    """Decorator: the call runs in a child span of the current one while tracing is on and a span is recording."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            # Only ever a child: outside a recorded stage (tracing off, or the stage's trace was not sampled or
            # never stored) no stray root trace starts here (D-236).
            if not _ENABLED or not trace.get_current_span().is_recording():
                return fn(*args, **kwargs)
            with _span(name):
                return fn(*args, **kwargs)
        return call
    return wrap


def server_span(name: str, headers, *, attributes: dict | None = None):
    """The span of an incoming HTTP request: continues the caller's trace when `headers` (a mapping with
    `traceparent`/`tracestate`, case-insensitive as Django's request.headers) carries a valid W3C context, else
    starts a new trace. An invalid `traceparent` is ignored (a new trace), never an error."""
    if not _ENABLED:
        return _OFF
    carrier = {}
    for key in ("traceparent", "tracestate"):
        value = headers.get(key)
        if value:
            carrier[key] = value
    return _span(name, context=_PROPAGATOR.extract(carrier), kind=SpanKind.SERVER, attributes=attributes)


def http_entry(name: str) -> Callable:
    """Decorator for an API view method `(self, request, **kwargs)`: a log binding of its own (the service
    `note`s the account and receipt ids), and while tracing is on a SERVER span continuing the caller's
    `traceparent`."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(view, request, *args, **kwargs):
            with logcontext.bound(), server_span(name, request.headers):
                return fn(view, request, *args, **kwargs)
        return call
    return wrap


def inject(headers: dict) -> None:
    """Add the current span's `traceparent` (and `tracestate`) to an outgoing request's headers; off: nothing."""
    if _ENABLED:
        _PROPAGATOR.inject(headers)
