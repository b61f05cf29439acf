"""The connector model classes other apps may name (D-259): as types, for `isinstance`, as the subject of their
own read queries in their selectors, and (TraceCarrier) as an abstract base. `connector.models` itself is private
to the connector app (an import-linter contract holds it); this list is the public part, and growing it is a
reviewed change. Foreign keys from other apps' models name these lazily ("connector.ServingEpoch") instead.

Writes never go through these classes from another app: every write is a connector service function (one
transaction, canonical lock order, fences and exact epochs checked), and row locks are `connector.selectors.locks`.
"""
from __future__ import annotations

from connector.models import (
    AccountServingGate,
    ApplicationResult,
    ApprovalKind,
    AuditRecord,
    ConnectorAccount,
    CredentialGenerationDispatchGate,
    DualApprovalRequest,
    Event,
    Execution,
    GapDecision,
    LaneResumption,
    MaterializationDue,
    OrderingLane,
    Projection,
    ProjectionWindow,
    Receipt,
    ReceiptComponent,
    ReplayRequest,
    ServiceConfigurationAccount,
    ServiceConfigurationCredentialMapping,
    ServiceConfigurationGeneration,
    ServingEpoch,
    ServingEpochBindingProof,
    ServingEpochCredentialProof,
    StepFailure,
    TraceCarrier,
    V1AcceptanceTombstone,
)
from connector.models.approvals import APPROVAL_LIVE
from connector.models.routing import RoutedSaveMixin  # a model base: the shard column in guarded saves (D-244)

__all__ = [
    "APPROVAL_LIVE", "AccountServingGate", "ApplicationResult", "ApprovalKind", "AuditRecord", "ConnectorAccount",
    "CredentialGenerationDispatchGate", "DualApprovalRequest", "Event", "Execution",
    "GapDecision", "LaneResumption", "MaterializationDue", "OrderingLane", "Projection", "ProjectionWindow",
    "Receipt", "ReceiptComponent", "ReplayRequest", "RoutedSaveMixin", "ServiceConfigurationAccount",
    "ServiceConfigurationCredentialMapping",
    "ServiceConfigurationGeneration", "ServingEpoch", "ServingEpochBindingProof", "ServingEpochCredentialProof",
    "StepFailure", "TraceCarrier", "V1AcceptanceTombstone",
]
