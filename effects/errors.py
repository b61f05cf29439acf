"""The effects app's closed error catalog (extends connector.errors.ConnectorError)."""
from __future__ import annotations

from connector.errors import ApplicationItemRejected, ConnectorError


class OutboundRefused(ConnectorError):
    """The command cannot be authored: a replay context, a missing frozen reference, or a conflicting intent."""

    code = "OUTBOUND_REFUSED"
    http_status = 409


class OutboundPathUnsafe(OutboundRefused, ApplicationItemRejected):
    """A path or query value would change the outbound request's structure (a "/", "\\", "?", "#", a dot
    segment, an empty value, a control character, or a percent-encoding or NFKC form of one of them, or a path
    longer than the frozen column): the command is not authored and Runtime records the item `rejected`
    (D-170, D-172). Nothing was written and nothing is sent."""

    code = "OUTBOUND_PATH_UNSAFE"
    http_status = 422
    operator_action = ("Correct the record identity at the source and send a new event; the item was rejected and "
                       "no outbound call was made. Values that are not path-safe never reach the provider.")


class OutboundConflict(ConnectorError):
    """The logical-effect key exists with a different frozen binding; nothing was written."""

    code = "OUTBOUND_CONFLICT"
    http_status = 409


class PermitRefused(ConnectorError):
    """No permit: the effect, lease, holder or credential gate is not in the required state."""

    code = "PERMIT_REFUSED"
    http_status = 409
    retryable = True


class ProviderIoHeld(PermitRefused):
    """No permit: the exact epoch's first activation has not been read back yet, so provider I/O is still
    disabled (CV2-12-071, D-321). Nothing was written; the effect stays `prepared` and claimable."""

    code = "PROVIDER_IO_NOT_ENABLED"
    http_status = 503
    retryable = True
    operator_action = ("Let the cutover coordinator finish `first_activation_commit` (its exact readback enables "
                       "provider I/O); rerun it if it stopped.")


class EgressRefused(ConnectorError):
    """The egress adapter refuses to send: the permit is not `granted` for this holder and fence, the holder is
    terminated, or the credential generation's dispatch gate was revoked or re-fenced."""

    code = "EGRESS_REFUSED"
    http_status = 409


class DestinationDeferred(EgressRefused):
    """The egress adapter refuses to mark a limited destination's permit `sending` while its receiver's deferral
    (`429` / `Retry-After`) is pending (D-371, D-402); the permit stays `granted` and is withdrawn."""


class AbandonRefused(ConnectorError):
    """A permit closes only with durable proof: holder terminated and its egress revoked, or (granted only) a
    revocation that committed first. Elapsed time proves nothing."""

    code = "ABANDON_REFUSED"
    http_status = 409


class ReconcileRefused(ConnectorError):
    """The reconciliation is not allowed from the effect's state or lacks the proof it needs."""

    code = "RECONCILE_REFUSED"
    http_status = 409


class RateLimitInvalid(OutboundRefused):
    """The callout's `rate_limit` is not `{"requests_per_second": R, "max_in_flight": K}` with R and K integers from
    1 to 100000 (and an optional integer `burst` from 1 to R): the command is not authored; nothing was written
    (D-222)."""

    code = "RATE_LIMIT_INVALID"
    http_status = 422
    operator_action = "Correct the callout definition's rate_limit in the pack and install a new pack generation."


class RetryPolicyInvalid(OutboundRefused):
    """The callout's `retry` is not `{"schedule_seconds": [d1, d2, ...]}` (1 to 100 integers from 1 to 604800) nor
    `{"exponential": {"first_seconds": F, "factor": X, "max_delay_seconds": M}, "horizon_seconds": H}`: the command
    is not authored; nothing was written (D-420)."""

    code = "RETRY_POLICY_INVALID"
    http_status = 422
    operator_action = "Correct the callout definition's retry in the pack and install a new pack generation."


class DestinationDeferred(ConnectorError):
    """The destination's declared limit admits no permit now (its in-flight maximum is reached, its token bucket
    is empty, or a receiver's Retry-After defers it): no permit was granted, nothing was sent, and the effect is
    `prepared` and claimable again once the destination admits it (D-222)."""

    code = "DESTINATION_DEFERRED"
    http_status = 429
    retryable = True


class RemoteCallRefused(ConnectorError):
    """An intentional new remote call cannot be admitted as asked: no reason, no RemoteEffect exists for the
    EffectRoot and slot (a first call is Runtime's, not an operator intent), or the intent ID exists with different
    bytes. Nothing was written (D-305)."""

    code = "REMOTE_CALL_REFUSED"
    http_status = 409
    operator_action = ("Name an EffectRoot and slot that already has effects, give a reason, and use a new intent ID "
                       "for a different request.")


class RemoteCallEffectOccurred(ConnectorError):
    """A predecessor RemoteEffect of the EffectRoot and slot is `remote_confirmed` or `finalized`: the effect
    occurred, so no new EffectGenerationID is authorized. Nothing was written (CV2-09-022, D-306)."""

    code = "REMOTE_CALL_EFFECT_OCCURRED"
    http_status = 409
    operator_action = "The remote call happened; a different business change is a new application intent."


class RemoteCallBlocked(ConnectorError):
    """A predecessor RemoteEffect of the EffectRoot and slot is `uncertain` (or `quarantined`, whose outcome was
    never proven): no successor until reconciliation proves it confirmed or terminal `no_effect`. Nothing was
    written; time never unblocks it (CV2-09-023, D-306)."""

    code = "REMOTE_CALL_BLOCKED"
    http_status = 409
    operator_action = ("Reconcile the uncertain effect with the provider's evidence (effect_reconcile); then ask "
                       "again.")
