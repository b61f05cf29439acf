"""The cutover app's closed error catalog for V2 -> V2 succession (extends connector.errors.ConnectorError).
Every refusal writes nothing: services raise before or instead of writing and the transaction rolls back."""
from __future__ import annotations

from connector.errors import ConnectorError


class SuccessorClassUnsupported(ConnectorError):
    """Only the `requires_drain` successor transition is authorized; every other class is refused regardless of
    the compatibility evidence supplied (CV2-11-002/003/058)."""

    code = "SUCCESSOR_CLASS_UNSUPPORTED"
    http_status = 422
    operator_action = "Plan a requires_drain succession; another class needs a separate normative change."


class BarrierSetRefused(ConnectorError):
    """The publication barrier set is missing, held by another attempt, in the wrong state, or its release is not
    allowed by the succession rules."""

    code = "BARRIER_SET_REFUSED"
    http_status = 409
    operator_action = "Read `manage.py succession status`; act with the current holder fence."


class SuccessorDrifted(ConnectorError):
    """The successor epoch is not the exact verified epoch the barrier set binds, or its owners changed."""

    code = "SUCCESSOR_DRIFTED"
    http_status = 409
    operator_action = "Release the barrier set and prepare and verify a new successor epoch."


class HandoffRefused(ConnectorError):
    """The OrderingHandoff cannot be frozen: a gate is not v2_halted, the lane still has nonterminal work, or its
    comparator or partition contract changed."""

    code = "HANDOFF_REFUSED"
    http_status = 409
    retryable = True
    operator_action = "Drain the predecessor lane to terminal decisions (and halt every gate), then retry."


class SuccessorActivationRefused(ConnectorError):
    """The successor activation transaction found a gate, epoch, handoff or successor lane not as required;
    nothing moved."""

    code = "SUCCESSOR_ACTIVATION_REFUSED"
    http_status = 409
    operator_action = "Complete the missing phase (`manage.py succession status` names it) and retry."
