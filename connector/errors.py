"""The connector's closed error catalog: code, HTTP status, retryability, operator action.

Every domain exception carries one catalog entry; views, admin actions and commands report `code` and the
exception's message unchanged. A rejection changes nothing: services raise before or instead of writing, and
the enclosing transaction rolls back.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class CatalogEntry:
    code: str
    http_status: int
    retryable: bool
    operator_action: str


class ConnectorError(Exception):
    """Base of every connector domain error."""

    code = "CONNECTOR_ERROR"
    http_status = 400
    retryable = False
    operator_action = "Inspect the request; nothing was written."

    def __init__(self, detail: str | None = None, **context: object) -> None:
        self.detail = detail or (self.__doc__ or self.code).strip()
        self.context = context
        super().__init__(self.detail)

    def as_dict(self) -> dict[str, object]:
        return {"code": self.code, "detail": self.detail}




class IdentityInvalid(ConnectorError):
    """An identity or locator is not canonical (whitespace, empty, invalid encoding, null/blank ambiguity)."""

    code = "IDENTITY_INVALID"
    operator_action = "Send the exact canonical value; the service never trims or folds case."


class OwnerUnavailable(ConnectorError):
    """An owner could not be read right now; the candidate stays as it was."""

    code = "OWNER_UNAVAILABLE"
    http_status = 503
    retryable = True
    operator_action = "Retry later; the sweeper retries prepared epochs automatically."


class OwnerFactInvalid(ConnectorError):
    """An owner fact is absent, mutable, malformed or disagrees with its receipt."""

    code = "OWNER_FACT_INVALID"
    operator_action = "Author a new immutable generation; existing generations are never edited."


class CalloutTemplateInvalid(OwnerFactInvalid):
    """A callout profile's path_template is outside the closed grammar: it is not an absolute path, names a scheme
    or host, or puts a placeholder inside a segment instead of filling a whole path segment or query value."""

    code = "CALLOUT_TEMPLATE_INVALID"
    operator_action = ("Install a pack generation whose callout path_template uses only whole-segment {name} "
                       "placeholders (docs/decisions.md D-170); the binding is refused at install and read.")


class ApplicationItemRejected(ConnectorError):
    """One item of a Runtime command cannot be applied as asked (its values cannot form its outbound intent);
    Runtime records the item `rejected` with this code and keeps nothing of it. Raised by the outbound author
    hook (connector.hooks.author_outbound), never by connector itself."""

    code = "APPLICATION_ITEM_REJECTED"
    http_status = 422
    operator_action = "Correct the source record and send a new event; the rejected item changed nothing."


class CredentialMappingInvalid(ConnectorError):
    """The (account, binding CredentialRef) -> CredentialGenerationID relation is not exhaustive and exact."""

    code = "CREDENTIAL_MAPPING_INVALID"
    operator_action = "Author a configuration generation that maps every account and binding CredentialRef once."


class EpochCandidateInvalid(ConnectorError):
    """The ServingEpoch candidate is incomplete, mixed or not authored under the V2 profile."""

    code = "EPOCH_CANDIDATE_INVALID"
    operator_action = "Prepare a new candidate from the exact owner generations."


class EpochNotFound(ConnectorError):
    """No ServingEpoch has that exact ID and digest."""

    code = "EPOCH_NOT_FOUND"
    http_status = 404


class TransitionRefused(ConnectorError):
    """The requested transition is not allowed from the current state, or its guard failed."""

    code = "TRANSITION_REFUSED"
    http_status = 409
    operator_action = "Reload: the item is not in a state that allows this action."


class EpochRetentionUnmet(ConnectorError):
    """The draining epoch may not retire: facts that name it are not terminal yet (D-267). The detail lists each
    blocker as `CODE: rows`; `context["blockers"]` holds the (code, detail) pairs. Nothing was written."""

    code = "EPOCH_RETENTION_UNMET"
    http_status = 409
    operator_action = ("Finish or remediate the named work (each code's remedy is in docs/errors.md), then ask for "
                       "the retirement again; time alone never retires an epoch.")


class ActivationCardinalityExceeded(ConnectorError):
    """The activation names more accounts than the declared maximum (CONNECTOR["ACTIVATION_MAX_ACCOUNTS"]); it was
    refused before any barrier closed or anything was written."""

    code = "ACTIVATION_CARDINALITY_EXCEEDED"
    http_status = 409
    operator_action = ("Author configuration generations of at most the declared maximum of accounts, or raise "
                       "CONNECTOR_ACTIVATION_MAX_ACCOUNTS after measuring activation at that size "
                       "(docs/benchmarks.md).")


class FenceStale(ConnectorError):
    """The caller acted on an older fence than the row now holds; nothing was written."""

    code = "FENCE_STALE"
    http_status = 409
    retryable = True
    operator_action = "Reload the current state and decide again."


class GateNotServing(ConnectorError):
    """The account gate is not v2_serving on an exact active epoch; no V2 production write is allowed."""

    code = "GATE_NOT_SERVING"
    http_status = 503
    retryable = True
    operator_action = "Wait for the gate to serve again or check the cutover console."



# The constraint name of the trigger (cutover migration 0014) that refuses a new root of a predecessor epoch while
# its succession drain is open (CV2-11-005, D-315): a new Receipt, or an OutboundCommand no Execution authored.
SUCCESSION_ROOTS_CLOSED_CONSTRAINT = "cutover_succession_roots_closed"


class SuccessionRootsClosed(ConnectorError):
    """A successor activation is draining this epoch: new roots (a new Receipt by transport or replay admission, an
    OutboundCommand not authored by an Execution of already admitted work) are refused; continuation work of
    roots already admitted still completes. Nothing was written."""

    code = "SUCCESSION_ROOTS_CLOSED"
    http_status = 503
    retryable = True
    operator_action = "Retry after the successor serves (or the succession is aborted); the source retries."


def roots_closed(exc: BaseException) -> SuccessionRootsClosed | None:
    """The SuccessionRootsClosed an IntegrityError raised by the roots-closed trigger stands for, else None."""
    name = getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None)
    if name != SUCCESSION_ROOTS_CLOSED_CONSTRAINT:
        return None
    return SuccessionRootsClosed(str(getattr(getattr(exc.__cause__, "diag", None), "message_primary", "") or exc))

class PermissionRefused(ConnectorError):
    """The actor lacks the permission this transition requires."""

    code = "PERMISSION_REFUSED"
    http_status = 403
    operator_action = "Ask a user holding the permission."


class SecretBackendError(ConnectorError):
    """The secret backend refused the request."""

    code = "SECRET_BACKEND_ERROR"
    http_status = 503
    retryable = True
    operator_action = "Check the secret backend directory and its version references."


class ApprovalRefused(ConnectorError):
    """The approval (or refusal) cannot be recorded: the requester may not approve or refuse their own request, one
    person approves once, the subject changed since it was shown (approvals of an old digest are void), or the
    request is no longer pending."""

    code = "APPROVAL_REFUSED"
    http_status = 409
    operator_action = "Reload the subject and its current digest; a second approval needs a different person."


class ApprovalReasonMissing(ConnectorError):
    """A dual-approval request needs the requester's reason and evidence reference, and a refusal needs the
    refuser's reason; nothing was written."""

    code = "APPROVAL_REASON_MISSING"
    http_status = 400
    operator_action = "Say why (and, for a request, where the evidence is) and submit again."


class ApprovalMissing(ConnectorError):
    """The subject needs two distinct approvals of its exact current digest before this step may run."""

    code = "APPROVAL_MISSING"
    http_status = 409
    operator_action = "Request dual approval of the current subject (attestations screen) and wait for two approvers."


class ApprovalMemberChanged(ConnectorError):
    """One member of an approved set (D-494) changed since the requester saw it: its current digest is not the one
    the approvers approved, so that member is not applied; the set's other members are decided on their own."""

    code = "APPROVAL_MEMBER_CHANGED"
    http_status = 409
    operator_action = ("Reload the member's own page; request dual approval of it as it is now (alone or in a new "
                       "set) and wait for two approvers.")


class StateTokenInvalid(ConnectorError):
    """The decision carries no valid state token (missing or malformed): an operator decision is applied only to
    the exact state the page showed, so a decision without one is refused, never applied unchecked."""

    code = "STATE_TOKEN_INVALID"
    http_status = 400
    operator_action = "Reload the page and decide again; the form carries the state it shows."


class FormInvalid(ConnectorError):
    """A form value is missing or malformed (a timestamp, a number, a digest, a choice); nothing was written."""

    code = "FORM_INVALID"
    http_status = 400
    operator_action = "Correct the named fields (or reload the page) and submit again."


class ApproverNotIndependent(ConnectorError):
    """The approval would not come from an independent person: within the identity cooling period the approver's
    account (creation, role or permission grant, activation, password) was controlled by the requester or by a
    person who also controls another approval of the same subject."""

    code = "APPROVER_NOT_INDEPENDENT"
    http_status = 409
    operator_action = ("Ask an approver whose account nobody involved in this request created or changed within "
                       "the cooling period (the identity changes are in the audit trail).")


ERROR_CATALOG = MappingProxyType({
    cls.code: CatalogEntry(cls.code, cls.http_status, cls.retryable, cls.operator_action)
    for cls in (ConnectorError, IdentityInvalid, OwnerUnavailable, OwnerFactInvalid, CalloutTemplateInvalid,
                ApplicationItemRejected, CredentialMappingInvalid,
                EpochCandidateInvalid, EpochNotFound, TransitionRefused, EpochRetentionUnmet,
                ActivationCardinalityExceeded, FenceStale,
                GateNotServing, SuccessionRootsClosed, PermissionRefused, SecretBackendError, ApprovalRefused, ApprovalMissing,
                ApprovalReasonMissing, ApprovalMemberChanged,
                StateTokenInvalid, FormInvalid, ApproverNotIndependent)
})
