"""Durable trace contexts (issue 21, D-225): the W3C trace context under which a durable row was written, kept in a
side table keyed by that row, inserted in the row's own transaction. A later stage (another worker, after a
restart) continues the trace from it. Written only while tracing is on; nothing reads or writes them otherwise."""
from __future__ import annotations

from django.db import models

from connector.models.execution import Execution, Projection
from connector.models.ingress import Receipt

__all__ = ["TraceCarrier", "ReceiptTrace", "ProjectionTrace", "ExecutionTrace", "TRACEPARENT_PATTERN"]

#: W3C Trace Context `traceparent`, version 00, lowercase hex, as the propagator writes it (55 characters).
TRACEPARENT_PATTERN = r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"


class TraceCarrier(models.Model):
    """The trace context of one durable row. Invariants: one per row (the row is the primary key); `traceparent`
    is a well-formed W3C version-00 header value; immutable (append-only trigger); never holds a secret (ids
    only: trace id, parent span id, flags, the vendor `tracestate`)."""

    traceparent = models.CharField(max_length=55)
    tracestate = models.CharField(max_length=512, blank=True, default="")

    class Meta:
        abstract = True
        constraints = [
            models.CheckConstraint(condition=models.Q(traceparent__regex=TRACEPARENT_PATTERN),
                                   name="%(app_label)s_%(class)s_traceparent_w3c",
                                   violation_error_code="traceparent_malformed"),
        ]

    def __str__(self) -> str:
        return self.traceparent


class ReceiptTrace(TraceCarrier):
    """The admission span's context of a Receipt (materialization continues it)."""

    receipt = models.OneToOneField(Receipt, on_delete=models.PROTECT, primary_key=True, related_name="trace")

    class Meta(TraceCarrier.Meta):
        pass


class ProjectionTrace(TraceCarrier):
    """The materialization span's context of a lane Projection (the lane advance that mints it continues it)."""

    projection = models.OneToOneField(Projection, on_delete=models.PROTECT, primary_key=True, related_name="trace")

    class Meta(TraceCarrier.Meta):
        pass


class ExecutionTrace(TraceCarrier):
    """The context of the span that minted an Execution (materialization or lane advance); the claim continues
    it."""

    execution = models.OneToOneField(Execution, on_delete=models.PROTECT, primary_key=True, related_name="trace")

    class Meta(TraceCarrier.Meta):
        pass
