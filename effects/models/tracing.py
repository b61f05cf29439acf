"""The durable trace context of an OutboundCommand (issue 21, D-225): the Runtime span under which the command was
authored, inserted in the application transaction that authors it, so the dispatch worker continues the trace
after the outbox (and after any restart) and the egress request carries it to the receiver."""
from __future__ import annotations

from django.db import models

from connector.selectors.rows import TraceCarrier
from effects.models.outbound import OutboundCommand

__all__ = ["CommandTrace"]


class CommandTrace(TraceCarrier):
    """The context of the Runtime span that authored an OutboundCommand (see connector.models.TraceCarrier)."""

    command = models.OneToOneField(OutboundCommand, on_delete=models.PROTECT, primary_key=True,
                                   related_name="trace")

    class Meta(TraceCarrier.Meta):
        pass
