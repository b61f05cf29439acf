"""The delivery error catalog: the contract's `error_catalog`, verbatim. `DeliveryError(code, detail)` carries the
contract's exit class, retryability, operator action, alert severity and evidence schema for its code; an unknown
code is a programming error (KeyError), never a new code. Refusals outside the contract's catalog (a malformed
request to the service layer, a missing approval) are `DeliveryRequestInvalid` with exit class 2."""
from __future__ import annotations

from connector.errors import ConnectorError

from .contract import ErrorSpec, contract


class DeliveryError(ConnectorError):
    """A delivery operation refused or held with one of the contract's stable codes; nothing half-written."""

    http_status = 409

    def __init__(self, code: str, detail: str, **context: object) -> None:
        self.spec: ErrorSpec = contract().error(code)
        self.code = code
        self.exit_class = self.spec.exit_class
        self.retryable = self.spec.retryability not in ("never", "blocked")
        self.operator_action = self.spec.operator_action
        super().__init__(detail, **context)

    def as_dict(self) -> dict[str, object]:
        spec = self.spec
        return {"code": self.code, "detail": self.detail, "exit_class": spec.exit_class,
                "retryability": spec.retryability, "operator_action": spec.operator_action,
                "alert_severity": spec.alert_severity, "evidence_schema": spec.evidence_schema}


class DeliveryRequestInvalid(ConnectorError):
    """The delivery request itself is malformed (unknown profile, empty scope, records outside the parent scope,
    a reconciliation without its proof or approval); nothing was written."""

    code = "DELIVERY_REQUEST_INVALID"
    exit_class = 2
    operator_action = "Correct the request; nothing was written."


class DeliveryPermissionDenied(ConnectorError):
    """The user lacks the permission the delivery action needs, or approves what they already approved."""

    code = "DELIVERY_PERMISSION_DENIED"
    http_status = 403
    exit_class = 2
    operator_action = "Ask a user with the named permission; dual approval needs two distinct people."
