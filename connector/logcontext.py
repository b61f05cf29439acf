"""The ids a log line of the hot path carries (issue 21): account_id, receipt_id, execution_id, effect_id,
trace_id and span_id. A stage entry point (a Celery task, the admission view, a tracing stage) binds what it
knows with `bound(...)`; code deeper in the stage adds what it learns with `note(...)` (it changes the innermost
binding only, so the next stage starts clean). `observability.logs.ContextFilter` copies the current fields onto every log record.
contextvars, so threads and asyncio tasks never see each other's ids. Costs one dict copy per binding."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["FIELDS", "bound", "current", "fresh", "note"]

#: The fields a record may carry, in the order the JSON formatter writes them.
FIELDS = ("account_id", "receipt_id", "execution_id", "effect_id", "trace_id", "span_id")

_CURRENT: ContextVar[dict | None] = ContextVar("connector_log_context", default=None)


@contextmanager
def bound(**fields) -> Iterator[dict]:
    """Bind `fields` (None values are ignored) on top of the enclosing binding for the duration of the block."""
    outer = _CURRENT.get()
    inner = dict(outer) if outer else {}
    inner.update((k, v) for k, v in fields.items() if v is not None)
    token = _CURRENT.set(inner)
    try:
        yield inner
    finally:
        _CURRENT.reset(token)


def note(**fields) -> None:
    """Add ids learnt inside a stage (e.g. the account once the receipt is read) to the innermost binding; outside
    any binding it does nothing (a stray call never leaks ids into the next stage)."""
    current = _CURRENT.get()
    if current is not None:
        current.update((k, v) for k, v in fields.items() if v is not None)


def current() -> dict:
    """The fields bound now (empty outside every binding)."""
    return _CURRENT.get() or {}


def fresh(fn):
    """Decorator: the call starts its own binding (ids it `note`s end with it), e.g. one claim of a worker loop."""
    import functools

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with bound():
            return fn(*args, **kwargs)
    return call
