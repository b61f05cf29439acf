"""ServingEpoch (with its frozen proof rows), AccountServingGate and CredentialGenerationDispatchGate.

State columns are django-fsm `FSMField(protected=True)`; transitions are called only by services. The database
also refuses any state change not in the seed's table (trigger `connector_enforce_transition`) and any fence
that does not advance by exactly one on a gate transition (trigger `connector_gate_fence`).
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from connector import hooks
from connector.choices import CredentialGateMode, EpochState, GATE_V2_MODES, GateMode
from connector.models.owners import (
    BindingDefinition,
    CatalogBinding,
    ConnectorAccount,
    CredentialGeneration,
    IntegrationBindingView,
    PackGeneration,
    ServiceConfigurationGeneration,
)

__all__ = [
    "ServingEpoch",
    "ServingEpochBindingProof",
    "ServingEpochCredentialProof",
    "AccountServingGate",
    "CredentialGenerationDispatchGate",
]


class ServingEpoch(ConcurrentTransitionMixin, models.Model):
    """One exact serving generation. Invariants: `preimage` is the V2 profile's closed nested encoding of the
    candidate and `digest` its sha256; both, and every proof row, are immutable (only state columns change);
    a null `profile_id` is the legacy unprofiled stored form, never an alias of "" (refused by a constraint)."""

    epoch_id = models.CharField(max_length=255, unique=True)
    profile_id = models.CharField(max_length=255, null=True, blank=True)
    serving_scope_digest = models.BinaryField(max_length=32)
    catalog_view = models.ForeignKey(IntegrationBindingView, on_delete=models.PROTECT, null=True,
                                     related_name="epochs")
    configuration = models.ForeignKey(ServiceConfigurationGeneration, on_delete=models.PROTECT, null=True,
                                      related_name="epochs")
    configuration_receipt = models.BinaryField(null=True)
    configuration_receipt_digest = models.BinaryField(max_length=32, null=True)
    preimage = models.BinaryField()
    digest = models.BinaryField(max_length=32, unique=True)
    state = FSMField(default=EpochState.PREPARED, choices=EpochState.choices, protected=True)
    state_changed_at = models.DateTimeField(auto_now=True)
    rejection_code = models.CharField(max_length=64, blank=True, default="")
    rejection_detail = models.TextField(blank=True, default="")
    # Set only by a service cutover's first activation transaction (with `verified -> active`) and cleared only by
    # its exact activation readback's transaction: while set, no DispatchPermit is granted on the epoch and no
    # provider I/O starts (CV2-12-071, D-321). Never set again once cleared (trigger, connector migration 0023).
    provider_io_held = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.CheckConstraint(condition=~Q(profile_id=""), name="connector_servingepoch_profile_not_blank",
                                   violation_error_code="digest_profile_empty"),
            models.CheckConstraint(condition=Q(state__in=EpochState.values), name="connector_servingepoch_state"),
            models.CheckConstraint(
                condition=Q(state=EpochState.REJECTED) | Q(rejection_code=""),
                name="connector_servingepoch_rejection_only_when_rejected"),
        ]
        permissions = [
            ("verify_servingepoch", "Can verify a prepared ServingEpoch"),
            ("reject_servingepoch", "Can reject an abandoned verified ServingEpoch"),
            ("activate_servingepoch", "Can run the first activation of a verified ServingEpoch"),
            ("retire_servingepoch", "Can retire a draining ServingEpoch whose facts are all terminal"),
        ]

    def __str__(self) -> str:
        return f"{self.epoch_id} ({self.state})"

    @transition(field=state, source=EpochState.PREPARED, target=EpochState.VERIFIED)
    def verify(self) -> None:
        pass

    @transition(field=state, source=[EpochState.PREPARED, EpochState.VERIFIED], target=EpochState.REJECTED)
    def reject(self, *, code: str, detail: str) -> None:
        self.rejection_code = code
        self.rejection_detail = detail

    @transition(field=state, source=EpochState.VERIFIED, target=EpochState.ACTIVE)
    def activate(self) -> None:
        pass

    @transition(field=state, source=EpochState.ACTIVE, target=EpochState.DRAINING)
    def drain(self) -> None:
        pass

    @transition(field=state, source=EpochState.DRAINING, target=EpochState.RETIRED)
    def retire(self) -> None:
        pass


class ServingEpochBindingProof(models.Model):
    """One Catalog binding and its binding-owner proof, frozen in an epoch in ordinal order. Invariant:
    immutable; one per (epoch, ordinal); the foreign keys keep the referenced generations undeletable."""

    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="binding_proofs")
    ordinal = models.PositiveIntegerField()
    binding = models.ForeignKey(CatalogBinding, on_delete=models.PROTECT, related_name="+")
    pack_generation = models.ForeignKey(PackGeneration, on_delete=models.PROTECT, related_name="+")
    definition = models.ForeignKey(BindingDefinition, on_delete=models.PROTECT, related_name="+")
    canonical_definition_digest = models.BinaryField(max_length=32)
    owner_receipt = models.BinaryField()
    owner_receipt_digest = models.BinaryField(max_length=32)

    class Meta:
        ordering = ["epoch", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["epoch", "ordinal"], name="connector_epochbindingproof_unique_ordinal"),
        ]


class ServingEpochCredentialProof(models.Model):
    """One credential-generation proof of an epoch, in ascending generation-ID byte order. Invariant: immutable;
    one per (epoch, ordinal) and per (epoch, generation)."""

    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="credential_proofs")
    ordinal = models.PositiveIntegerField()
    credential_generation = models.ForeignKey(CredentialGeneration, on_delete=models.PROTECT, related_name="+")
    owner_receipt = models.BinaryField()
    owner_receipt_digest = models.BinaryField(max_length=32)

    class Meta:
        ordering = ["epoch", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["epoch", "ordinal"], name="connector_epochcredproof_unique_ordinal"),
            models.UniqueConstraint(fields=["epoch", "credential_generation"],
                                    name="connector_epochcredproof_unique_generation"),
        ]


def halt_clear(gate) -> bool:
    """The one condition of `confirm_halted`: no halt blocker (the open-permit set is empty). Named, so the
    whole-service halt can check it is the condition it evaluates set-based (connector.services.gate_sets, D-281)."""
    return not hooks.halt_blockers(gate)


class AccountServingGate(ConcurrentTransitionMixin, models.Model):
    """The one fenced per-account serving gate. Invariants: one per account; `fence` advances by exactly one on
    every transition; the gate names an exact epoch (ID and digest) in the V2 modes and none otherwise; the
    open-permit set is the set of open permit rows referencing the gate (not a column here)."""

    account = models.OneToOneField(ConnectorAccount, on_delete=models.PROTECT, related_name="serving_gate")
    mode = FSMField(default=GateMode.V1_SERVING, choices=GateMode.choices, protected=True)
    fence = models.BigIntegerField(default=1)
    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, null=True, blank=True, related_name="gates")
    epoch_digest = models.BinaryField(max_length=32, null=True, blank=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["account_id"]
        permissions = [("operate_accountservinggate", "Can apply serving-gate transitions")]
        constraints = [
            models.CheckConstraint(condition=Q(mode__in=GateMode.values), name="connector_gate_mode"),
            models.CheckConstraint(condition=Q(fence__gte=1), name="connector_gate_fence_positive"),
            models.CheckConstraint(
                condition=(Q(mode__in=GATE_V2_MODES, epoch__isnull=False, epoch_digest__isnull=False)
                           | (~Q(mode__in=GATE_V2_MODES) & Q(epoch__isnull=True, epoch_digest__isnull=True))),
                name="connector_gate_epoch_iff_v2_mode", violation_error_code="gate_epoch_mode_mismatch"),
        ]

    def __str__(self) -> str:
        return f"gate[{self.account_id}] {self.mode} fence={self.fence}"

    def _advance(self) -> None:
        self.fence += 1

    def _bind(self, epoch: ServingEpoch) -> None:
        self.epoch = epoch
        self.epoch_digest = bytes(epoch.digest)
        self._advance()

    def _unbind(self) -> None:
        self.epoch = None
        self.epoch_digest = None
        self._advance()

    @transition(field=mode, source=GateMode.V1_SERVING, target=GateMode.HALTING_V1,
                permission="connector.operate_accountservinggate")
    def halt_v1(self) -> None:
        self._advance()

    @transition(field=mode, source=GateMode.HALTING_V1, target=GateMode.V1_SERVING,
                permission="connector.operate_accountservinggate")
    def abort_halt_v1(self) -> None:
        self._advance()

    @transition(field=mode, source=GateMode.HALTING_V1, target=GateMode.V1_STOPPED,
                permission="connector.operate_accountservinggate")
    def stop_v1(self) -> None:
        self._advance()

    @transition(field=mode, source=GateMode.V1_STOPPED, target=GateMode.V1_DRAINED,
                permission="connector.operate_accountservinggate")
    def certify_drained(self) -> None:
        self._advance()

    @transition(field=mode, source=GateMode.V1_DRAINED, target=GateMode.V1_SERVING,
                permission="connector.operate_accountservinggate")
    def cold_abort(self) -> None:
        self._advance()

    @transition(field=mode, source=GateMode.V1_DRAINED, target=GateMode.V2_VALIDATING,
                permission="connector.operate_accountservinggate")
    def begin_validation(self) -> None:
        self._advance()

    @transition(field=mode, source=GateMode.V2_VALIDATING, target=GateMode.V1_DRAINED,
                permission="connector.operate_accountservinggate")
    def restore_v1(self) -> None:
        self._advance()

    @transition(field=mode, source=GateMode.V2_VALIDATING, target=GateMode.V2_SERVING,
                permission="connector.operate_accountservinggate")
    def activate_first(self, *, epoch: ServingEpoch) -> None:
        self._bind(epoch)

    @transition(field=mode, source=GateMode.V2_SERVING, target=GateMode.HALTING_V2,
                permission="connector.operate_accountservinggate")
    def halt_v2(self) -> None:
        self._advance()

    @transition(field=mode, source=GateMode.HALTING_V2, target=GateMode.V2_HALTED,
                permission="connector.operate_accountservinggate",
                conditions=[halt_clear])
    def confirm_halted(self) -> None:
        self._advance()

    @transition(field=mode, source=GateMode.V2_HALTED, target=GateMode.V2_SERVING,
                permission="connector.operate_accountservinggate",
                conditions=[lambda gate: not hooks.resume_blockers(gate)])
    def resume_predecessor(self) -> None:
        self._advance()

    @transition(field=mode, source=GateMode.V2_HALTED, target=GateMode.V2_SERVING,
                permission="connector.operate_accountservinggate")
    def activate_successor(self, *, epoch: ServingEpoch) -> None:
        self._bind(epoch)


class CredentialGenerationDispatchGate(ConcurrentTransitionMixin, models.Model):
    """Dispatch eligibility of one exact credential generation. Invariants: one per generation (created with
    it); `fence` advances by exactly one on every transition; status never mutates the generation."""

    credential_generation = models.OneToOneField(CredentialGeneration, on_delete=models.PROTECT,
                                                 related_name="dispatch_gate")
    mode = FSMField(default=CredentialGateMode.ENABLED, choices=CredentialGateMode.choices, protected=True)
    fence = models.BigIntegerField(default=1)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["credential_generation_id"]
        constraints = [
            models.CheckConstraint(condition=Q(mode__in=CredentialGateMode.values),
                                   name="connector_credentialgate_mode"),
            models.CheckConstraint(condition=Q(fence__gte=1), name="connector_credentialgate_fence_positive"),
        ]
        permissions = [
            ("revoke_credentialgenerationdispatchgate", "Can revoke a credential generation's dispatch"),
            ("reenable_credentialgenerationdispatchgate", "Can re-enable a revoked credential generation"),
        ]

    def __str__(self) -> str:
        return f"credential gate[{self.credential_generation_id}] {self.mode} fence={self.fence}"

    @transition(field=mode, source=CredentialGateMode.ENABLED, target=CredentialGateMode.REVOKED,
                permission="connector.revoke_credentialgenerationdispatchgate")
    def revoke(self) -> None:
        self.fence += 1

    @transition(field=mode, source=CredentialGateMode.REVOKED, target=CredentialGateMode.ENABLED,
                permission="connector.reenable_credentialgenerationdispatchgate")
    def reenable(self) -> None:
        self.fence += 1
