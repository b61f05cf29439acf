"""V1's refusals, in the product's closed error catalog (docs/errors.md)."""
from __future__ import annotations

from connector.errors import ConnectorError


class V1BarrierClosed(ConnectorError):
    """A V1 owner barrier is closed for maintenance: the new root is refused retryably; nothing was committed and
    no cursor moved (push deliveries stay unacknowledged and are retried by the source)."""

    code = "V1_BARRIER_CLOSED"
    http_status = 503
    retryable = True
    operator_action = "Wait for the cutover to finish or abort; the source retries the delivery."


class V1GenerationRefused(ConnectorError):
    """The V1 process generation is not running (terminated generations never restart) or its provider egress is
    isolated; no V1 work or provider I/O happens under it."""

    code = "V1_GENERATION_REFUSED"
    http_status = 409
    operator_action = "Start a new generation of the exact certified release (cold abort or restore)."


class V1BootCheckFailed(ConnectorError):
    """Booting the V1 release against another database found a different schema, release or missing rows."""

    code = "V1_BOOT_CHECK_FAILED"
    http_status = 409
    operator_action = "Read the boot-check report; the restored database or release does not match."


class V1ReconcileRefused(ConnectorError):
    """Only a `dispatching` or `ambiguous` V1 effect can be reconciled, to `remote_finalized` or `no_effect`."""

    code = "V1_RECONCILE_REFUSED"
    http_status = 409
    operator_action = "Reconcile only effects the inventory lists as io_may_have_started or effect_unproven."
