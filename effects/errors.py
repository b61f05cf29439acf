"""The effects app's closed error catalog (extends connector.errors.ConnectorError)."""
from __future__ import annotations

from connector.errors import ConnectorError


class OutboundRefused(ConnectorError):
    """The command cannot be authored: a replay context, a missing frozen reference, or a conflicting intent."""

    code = "OUTBOUND_REFUSED"
    http_status = 409


class OutboundConflict(ConnectorError):
    """The logical-effect key exists with a different frozen binding; nothing was written."""

    code = "OUTBOUND_CONFLICT"
    http_status = 409


class PermitRefused(ConnectorError):
    """No permit: the effect, lease, holder or credential gate is not in the required state."""

    code = "PERMIT_REFUSED"
    http_status = 409
    retryable = True


class EgressRefused(ConnectorError):
    """The egress adapter refuses to send: the permit is not `granted` for this holder and fence, the holder is
    terminated, or the credential generation's dispatch gate was revoked or re-fenced."""

    code = "EGRESS_REFUSED"
    http_status = 409


class AbandonRefused(ConnectorError):
    """A permit closes only with durable proof: holder terminated and its egress revoked, or (granted only) a
    revocation that committed first. Elapsed time proves nothing."""

    code = "ABANDON_REFUSED"
    http_status = 409


class ReconcileRefused(ConnectorError):
    """The reconciliation is not allowed from the effect's state or lacks the proof it needs."""

    code = "RECONCILE_REFUSED"
    http_status = 409
