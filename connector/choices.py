"""Closed vocabularies. Each state's comment names the transition that enters it (STYLE R5)."""
from __future__ import annotations

from django.db import models


class BindingKind(models.TextChoices):
    """The four closed Catalog binding kinds (CV2-02-011)."""

    INBOUND_ROUTE = "inbound_route"
    CALLOUT_PROFILE = "callout_profile"
    FIELD_MAPPING = "field_mapping"
    PUSH_CONTRACT = "push_contract"


class EpochState(models.TextChoices):
    PREPARED = "prepared"  # initial (epoch_prepare)
    VERIFIED = "verified"  # prepared -> verified (epoch_verify)
    REJECTED = "rejected"  # prepared|verified -> rejected (epoch_verify, epoch_reject)
    ACTIVE = "active"  # verified -> active (activation)
    DRAINING = "draining"  # active -> draining (successor activation)
    RETIRED = "retired"  # draining -> retired (epoch_retire)


EPOCH_TRANSITIONS: tuple[tuple[str, str], ...] = (
    (EpochState.PREPARED, EpochState.VERIFIED),
    (EpochState.PREPARED, EpochState.REJECTED),
    (EpochState.VERIFIED, EpochState.ACTIVE),
    (EpochState.VERIFIED, EpochState.REJECTED),
    (EpochState.ACTIVE, EpochState.DRAINING),
    (EpochState.DRAINING, EpochState.RETIRED),
)
# An epoch some admitted work may still resume under: its owners must stay readable (CV2-02-013).
EPOCH_RESUMABLE = (EpochState.PREPARED, EpochState.VERIFIED, EpochState.ACTIVE, EpochState.DRAINING)


class GateMode(models.TextChoices):
    V1_SERVING = "v1_serving"  # initial; halting_v1 -> v1_serving (abort); v1_drained -> v1_serving (cold abort)
    HALTING_V1 = "halting_v1"  # v1_serving -> halting_v1 (maintenance barriers close)
    V1_STOPPED = "v1_stopped"  # halting_v1 -> v1_stopped (termination + egress isolation receipts)
    V1_DRAINED = "v1_drained"  # v1_stopped -> v1_drained (V1ShutdownCertificate); v2_validating -> v1_drained (restore)
    V2_VALIDATING = "v2_validating"  # v1_drained -> v2_validating (restore point durable)
    V2_SERVING = "v2_serving"  # v2_validating -> v2_serving (first activation); v2_halted -> v2_serving
    HALTING_V2 = "halting_v2"  # v2_serving -> halting_v2
    V2_HALTED = "v2_halted"  # halting_v2 -> v2_halted (open-permit set empty)


GATE_TRANSITIONS: tuple[tuple[str, str], ...] = (
    (GateMode.V1_SERVING, GateMode.HALTING_V1),
    (GateMode.HALTING_V1, GateMode.V1_SERVING),
    (GateMode.HALTING_V1, GateMode.V1_STOPPED),
    (GateMode.V1_STOPPED, GateMode.V1_DRAINED),
    (GateMode.V1_DRAINED, GateMode.V1_SERVING),
    (GateMode.V1_DRAINED, GateMode.V2_VALIDATING),
    (GateMode.V2_VALIDATING, GateMode.V1_DRAINED),
    (GateMode.V2_VALIDATING, GateMode.V2_SERVING),
    (GateMode.V2_SERVING, GateMode.HALTING_V2),
    (GateMode.HALTING_V2, GateMode.V2_HALTED),
    (GateMode.V2_HALTED, GateMode.V2_SERVING),
)
# Modes in which the gate names an exact epoch.
GATE_V2_MODES = (GateMode.V2_SERVING, GateMode.HALTING_V2, GateMode.V2_HALTED)


class CredentialGateMode(models.TextChoices):
    ENABLED = "enabled"  # initial (created with its CredentialGeneration); revoked -> enabled (reenable)
    REVOKED = "revoked"  # enabled -> revoked (revoke)


CREDENTIAL_GATE_TRANSITIONS: tuple[tuple[str, str], ...] = (
    (CredentialGateMode.ENABLED, CredentialGateMode.REVOKED),
    (CredentialGateMode.REVOKED, CredentialGateMode.ENABLED),
)


class ReceiptKind(models.TextChoices):
    TRANSPORT = "transport"  # admitted over REST with a transport idempotency key
    REPLAY = "replay"  # created with its ReplayRequest


class ComponentDisposition(models.TextChoices):
    EVENT = "event"  # the component produced a new Event
    DUPLICATE_EVENT = "duplicate_event"  # identical bytes of a live SourceEventKey seen before (decision 14)
    QUARANTINED = "quarantined"  # EVENT_KEY_CONFLICT: same key, different bytes (decision 14)


class OrderingContract(models.TextChoices):
    ORDER_INDEPENDENT = "order_independent"
    LATEST_SOURCE_POSITION = "latest_source_position"
    STRICT_SOURCE_SEQUENCE = "strict_source_sequence"


class LaneState(models.TextChoices):
    OPEN = "open"
    HALTED = "halted"  # a gap deadline with quarantine_partition, or a quarantined execution blocks the partition


class WindowState(models.TextChoices):
    OPEN = "open"  # initial
    SEALED = "sealed"  # open -> sealed (window_seal)
    QUARANTINED = "quarantined"  # open -> quarantined (window_quarantine)


WINDOW_TRANSITIONS = ((WindowState.OPEN, WindowState.SEALED), (WindowState.OPEN, WindowState.QUARANTINED))


class ExecutionState(models.TextChoices):
    READY = "ready"  # initial; waiting_dependency -> ready (dependency satisfied)
    WAITING_DEPENDENCY = "waiting_dependency"  # ready -> waiting_dependency
    COMPLETED = "completed"  # ready -> completed (Runtime result receipt recorded)
    QUARANTINED = "quarantined"  # ready|waiting_dependency -> quarantined


EXECUTION_TRANSITIONS = (
    (ExecutionState.READY, ExecutionState.WAITING_DEPENDENCY),
    (ExecutionState.READY, ExecutionState.COMPLETED),
    (ExecutionState.READY, ExecutionState.QUARANTINED),
    (ExecutionState.WAITING_DEPENDENCY, ExecutionState.READY),
    (ExecutionState.WAITING_DEPENDENCY, ExecutionState.QUARANTINED),
)
EXECUTION_ACTIVE = (ExecutionState.READY, ExecutionState.WAITING_DEPENDENCY)


class DependencyState(models.TextChoices):
    WAITING = "waiting"  # initial
    SATISFIED = "satisfied"  # waiting -> satisfied
    EXPIRED = "expired"  # waiting -> expired (deadline passed)
    REJECTED = "rejected"  # waiting -> rejected


DEPENDENCY_TRANSITIONS = ((DependencyState.WAITING, DependencyState.SATISFIED),
                          (DependencyState.WAITING, DependencyState.EXPIRED),
                          (DependencyState.WAITING, DependencyState.REJECTED))


class ResultOutcome(models.TextChoices):
    APPLIED = "applied"
    NOOP = "noop"
    REJECTED = "rejected"
    FAILED = "failed"


class ReplayMode(models.TextChoices):
    SUPPRESS_EXTERNAL_EFFECTS = "suppress_external_effects"  # the sole valid mode


class StepFailureReason(models.TextChoices):
    """Closed reasons of an item quarantined (or held) after a deterministic failure of a sweeper or worker step
    (decision D-168). Each is mapped in governance.reasons (owner, alert deadline, remediation)."""

    MATERIALIZATION_FAILED = "MATERIALIZATION_FAILED"  # a Receipt's MaterializationDue row held
    LANE_STEP_FAILED = "LANE_STEP_FAILED"  # open -> halted (lane_advance, lane_gap_deadline)
    WINDOW_SEAL_FAILED = "WINDOW_SEAL_FAILED"  # open -> quarantined (window_seal_due)
    EXECUTION_STEP_FAILED = "EXECUTION_STEP_FAILED"  # ready|waiting_dependency -> quarantined (claim, run, dependency)
    EPOCH_VERIFY_FAILED = "EPOCH_VERIFY_FAILED"  # a prepared epoch the sweeper stops verifying
    EFFECT_STEP_FAILED = "EFFECT_STEP_FAILED"  # prepared -> quarantined, or a hold on a later state
    DELIVERY_STEP_FAILED = "DELIVERY_STEP_FAILED"  # a DeliveryOperation held (delivery step, orphan recovery)


class SweepStep(models.TextChoices):
    """The sweeper and worker steps that isolate failures per item (decision D-168)."""

    RECEIPT_MATERIALIZE = "receipt_materialize"
    LANE_ADVANCE = "lane_advance"
    LANE_GAP_DEADLINE = "lane_gap_deadline"
    WINDOW_SEAL_DUE = "window_seal_due"
    DEPENDENCY_RESOLVE = "dependency_resolve"
    EXECUTION_CLAIM = "execution_claim"
    EXECUTION_RUN = "execution_run"
    EPOCH_VERIFY = "epoch_verify"
    EFFECT_CLAIM = "effect_claim"
    PERMIT_ACQUIRE = "permit_acquire"
    EFFECT_SEND = "effect_send"
    EFFECT_FINALIZE = "effect_finalize"
    DELIVERY_STEP = "delivery_step"
    DELIVERY_RECOVER_ORPHAN = "delivery_recover_orphan"
