"""REST bulk delivery (docs/contracts/rest-bulk-delivery-design.v1.yaml): receiver bindings and their
certification, profiles, the remote job semaphore, effect conflict domain locks, parent plans, operations with the
contract's five-axis state machine, MAY_ATTEMPT markers, attempts, observations, range watermarks, the mutation
gate and reconciliations.

The operation's `state` is the name of one of the contract's legal tuples; its five axes are generated columns
computed by PostgreSQL from `state`, so no row can hold a tuple the contract does not list. The transitions are
django-fsm methods generated from the contract (`to_<tuple>` for automatic ones, `reconcile_to_<tuple>` for the
operator-only ones); a trigger installed from the same list refuses every other edge in the database.
"""
from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import DateRangeField, DateTimeRangeField, RangeOperators
from django.contrib.postgres.indexes import GistIndex
from django.db import models
from django.db.models import Case, Q, Value, When
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from connector.choices import StepFailureReason
from effects.delivery.contract import AXES, contract

__all__ = [
    "DeliveryApprovalReceipt", "ReceiverBinding", "ReceiverSecretVersion", "ReceiverCertification",
    "CertificationApproval", "DeliveryProfile", "RemoteJobSemaphore", "EffectDomainLock", "DeliveryParent",
    "DeliveryOperation", "MayAttemptMarker", "DeliveryAttempt", "DeliveryObservation", "DeliveryWatermark",
    "MutationGate", "ReconciliationCampaign", "DeliveryReconciliation", "JournalEpochAttestation",
]

_C = contract()
TUPLE_CHOICES = [(name, name) for name in _C.tuples]
# Operations waiting for a reconciliation (the quarantine board's delivery rows, governance WAITING_DELIVERY): the
# outcome is unknown, partial or unverified and not yet reconciled, or a reconciliation is open. One expression for
# the partial index that serves /metrics and for the reading itself, so the planner can match them (issue 21).
RECONCILIATION_WAITING_STATES = tuple(name for name in _C.tuples if name.startswith(
    ("final_unknown", "final_partial", "final_full_unverified", "reconciling_")))
RECONCILIATION_WAITING = (Q(state__in=[s for s in RECONCILIATION_WAITING_STATES if s.startswith("reconciling_")])
                          | Q(state__in=[s for s in RECONCILIATION_WAITING_STATES if s.startswith("final_")],
                              reconciled=False))


class DeliveryApprovalReceipt(models.Model):
    """The separate approval receipt (`dpone.rest-bulk-delivery-approval.v1`) that references the researched
    contract by digest and never edits it. Immutable; one per contract digest."""

    contract_digest = models.CharField(max_length=64, unique=True)
    schema = models.CharField(max_length=128, default="dpone.rest-bulk-delivery-approval.v1")
    adr_digests = models.JSONField()
    owner_approvals = models.JSONField()
    evidence_requirements = models.JSONField()
    approved_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"approval of contract {self.contract_digest[:12]}"


class AuthenticationMode(models.TextChoices):
    BEARER = "bearer"
    API_KEY_HEADER = "api_key_header"
    HTTP_BASIC = "http_basic"
    OAUTH2_CLIENT_CREDENTIALS = "oauth2_client_credentials"
    MTLS = "mtls"
    API_KEY_QUERY = "api_key_query"  # refused unless every exception requirement is recorded


class ReceiverBinding(models.Model):
    """A receiver's stable, non-secret identity (the contract's `stable_non_secret_identity_fields`) and its
    semantics digest. Immutable: a principal swap is a new binding; a secret rotation is a new
    ReceiverSecretVersion of the same binding."""

    name = models.CharField(max_length=128, unique=True)
    base_url = models.CharField(max_length=512)
    authority_origin = models.CharField(max_length=512)
    remote_principal_id = models.CharField(max_length=255)
    remote_account_id = models.CharField(max_length=255)
    remote_resource_namespace = models.CharField(max_length=255)
    authentication_mode = models.CharField(max_length=32, choices=AuthenticationMode.choices)
    authentication_semantics = models.CharField(max_length=255)
    tls_policy_identity = models.CharField(max_length=255)
    network_policy_identity = models.CharField(max_length=255)
    api_key_query_exception = models.JSONField(null=True, blank=True)
    semantics_digest = models.BinaryField(max_length=32, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.CheckConstraint(
            condition=~Q(authentication_mode="api_key_query") | Q(api_key_query_exception__isnull=False),
            name="delivery_binding_api_key_query_needs_exception")]

    def __str__(self) -> str:
        return self.name


class ReceiverSecretVersion(models.Model):
    """A version reference of the binding's secret in the secret backend (never the secret). Append-only; the
    newest is used. Rotation adds one and leaves the binding's identity as it was."""

    binding = models.ForeignKey(ReceiverBinding, on_delete=models.PROTECT, related_name="secret_versions")
    version = models.PositiveIntegerField()
    secret_version_ref = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["binding", "version"]
        constraints = [models.UniqueConstraint(fields=["binding", "version"], name="delivery_secret_version")]


class CertificationState(models.TextChoices):
    PENDING_APPROVAL = "pending_approval"  # platform_attested, waiting for two distinct approvers
    CERTIFIED = "certified"
    EXPIRED = "expired"  # valid_until passed: periodic recertification due


class ReceiverCertification(models.Model):
    """Certification of a binding from the connection handshake, with the remote identity (mode, principal,
    account, evidence ref, verified_at, valid_until) and immutable evidence (its digest). `platform_attested`
    needs dual approval and expires at `valid_until` (periodic recertification)."""

    binding = models.ForeignKey(ReceiverBinding, on_delete=models.PROTECT, related_name="certifications")
    assurance_mode = models.CharField(max_length=32, choices=[("receiver_attested", "receiver_attested"),
                                                              ("platform_attested", "platform_attested")])
    principal_id = models.CharField(max_length=255)
    account_id = models.CharField(max_length=255)
    evidence_ref = models.CharField(max_length=512)
    evidence = models.JSONField()
    evidence_digest = models.BinaryField(max_length=32)
    verified_at = models.DateTimeField()
    valid_until = models.DateTimeField()
    state = FSMField(default=CertificationState.PENDING_APPROVAL, choices=CertificationState.choices,
                     protected=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    certified_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.CheckConstraint(condition=Q(valid_until__gt=models.F("verified_at")),
                                              name="delivery_certification_window")]

    @transition(field=state, source=CertificationState.PENDING_APPROVAL, target=CertificationState.CERTIFIED)
    def certify(self, *, at) -> None:
        self.certified_at = at

    @transition(field=state, source=[CertificationState.PENDING_APPROVAL, CertificationState.CERTIFIED],
                target=CertificationState.EXPIRED)
    def expire(self) -> None:
        pass


class CertificationApproval(models.Model):
    """One approver's approval of a platform-attested certification. Append-only; one per (certification,
    approver), so two rows are two distinct people."""

    certification = models.ForeignKey(ReceiverCertification, on_delete=models.PROTECT, related_name="approvals")
    approver = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    digest_seen = models.BinaryField(max_length=32)  # the subject digest the approver was shown
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["certification", "approver"],
                                               name="delivery_approval_distinct_approver")]


class DeliveryProfile(models.Model):
    """An immutable operation profile: receiver kind, mutation policy, scope kind, the operation semantics
    (digested) and the execution policy (digested separately), and their profile contract digest."""

    name = models.CharField(max_length=128, unique=True)
    receiver_kind = models.CharField(max_length=16, choices=[("sync_batch", "sync_batch"),
                                                             ("async_bulk_job", "async_bulk_job")])
    mutation_policy = models.CharField(max_length=24, choices=[("incremental_append", "incremental_append"),
                                                               ("partition_replace", "partition_replace")])
    scope_kind = models.CharField(max_length=16, choices=[("date", "date"), ("timestamp", "timestamp")])
    operation_semantics = models.JSONField()
    execution_policy = models.JSONField()
    append_exception = models.JSONField(null=True, blank=True)
    profile_schema_id = models.CharField(max_length=128)
    profile_version = models.PositiveIntegerField()
    max_records_per_child = models.PositiveIntegerField()
    operation_semantics_digest = models.BinaryField(max_length=32)
    execution_policy_digest = models.BinaryField(max_length=32)
    profile_contract_digest = models.BinaryField(max_length=32, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return self.name

    def policy(self, name: str, default=None):
        return self.execution_policy.get(name, default)


class RemoteJobSemaphore(models.Model):
    """Remote job capacity per certified remote principal and operation profile. Reservations are the attempts
    whose `capacity_state` is `reserved`; the row is locked FOR UPDATE to count and reserve."""

    remote_principal_id = models.CharField(max_length=255)
    profile = models.ForeignKey(DeliveryProfile, on_delete=models.PROTECT, related_name="semaphores")
    capacity = models.PositiveIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["remote_principal_id", "profile"],
                                               name="delivery_semaphore_scope"),
                       models.CheckConstraint(condition=Q(capacity__gte=1), name="delivery_semaphore_capacity")]


class EffectDomainLock(models.Model):
    """One row per effect conflict domain (a physical receiver resource shared across local namespaces and
    mutation kinds), created with INSERT ... ON CONFLICT DO NOTHING and locked FOR UPDATE in canonical order
    (domain digest) by every admission, submit and effect commit of the domain."""

    domain_digest = models.BinaryField(max_length=32, unique=True)
    remote_principal_id = models.CharField(max_length=255)
    remote_account_id = models.CharField(max_length=255)
    remote_resource_namespace = models.CharField(max_length=255)
    receiver_resource_id = models.CharField(max_length=255)
    effect_conflict_group = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "rest_delivery_effect_domain_lock"

    def __str__(self) -> str:
        return f"{self.remote_account_id}/{self.receiver_resource_id}/{self.effect_conflict_group}"


class ScopedGeneration(models.Model):
    """A half-open scope range (daterange or tstzrange, by the profile's scope kind) and a generation
    (scheduled interval end, correction revision)."""

    scope_date = DateRangeField(null=True, blank=True)
    scope_ts = DateTimeRangeField(null=True, blank=True)
    generation_end = models.DateTimeField()
    correction_revision = models.PositiveIntegerField()

    class Meta:
        abstract = True

    @property
    def scope(self):
        return self.scope_date if self.scope_date is not None else self.scope_ts

    @property
    def generation(self) -> tuple:
        return (self.generation_end, self.correction_revision)


def _one_scope(prefix: str) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Q(scope_date__isnull=True, scope_ts__isnull=False)
                                  | Q(scope_date__isnull=False, scope_ts__isnull=True), name=f"{prefix}_one_scope")


class ParentState(models.TextChoices):
    PLANNING = "PLANNING"
    ADMITTED = "ADMITTED"


class DeliveryParent(ConcurrentTransitionMixin, ScopedGeneration):
    """The immutable parent: frozen (materialized) before planning, its source snapshot closed, then admitted with
    its complete plan in one transaction. An existing parent never re-plans."""

    namespace = models.BinaryField(max_length=32)
    parent_key = models.CharField(max_length=255)
    binding = models.ForeignKey(ReceiverBinding, on_delete=models.PROTECT, related_name="parents")
    profile = models.ForeignKey(DeliveryProfile, on_delete=models.PROTECT, related_name="parents")
    domain = models.ForeignKey(EffectDomainLock, on_delete=models.PROTECT, related_name="parents")
    logical_route_id = models.CharField(max_length=255)
    source_boundary = models.CharField(max_length=255)
    frozen_parent = models.BinaryField()
    frozen_parent_digest = models.BinaryField(max_length=32)
    record_count = models.PositiveIntegerField()
    snapshot_closed_at = models.DateTimeField(null=True, blank=True)
    state = FSMField(default=ParentState.PLANNING, choices=ParentState.choices, protected=True)
    planner_algorithm_version = models.CharField(max_length=64, blank=True, default="")
    compiled_plan_digest = models.BinaryField(max_length=32, null=True, blank=True)
    coverage_proof = models.JSONField(null=True, blank=True)
    parent_plan_digest = models.BinaryField(max_length=32, null=True, blank=True)
    contiguous_checkpoint_frontier = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    admitted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["namespace", "parent_key"], name="delivery_parent_key"),
            _one_scope("delivery_parent"),
            models.CheckConstraint(condition=Q(state="PLANNING") | Q(parent_plan_digest__isnull=False,
                                                                     snapshot_closed_at__isnull=False),
                                   name="delivery_parent_admitted_whole"),
        ]

    def __str__(self) -> str:
        return f"parent {self.parent_key} ({self.state})"

    @transition(field=state, source=ParentState.PLANNING, target=ParentState.ADMITTED)
    def admit(self, *, at) -> None:
        self.admitted_at = at


def _axis_field(axis: str) -> models.GeneratedField:
    index = AXES.index(axis)
    return models.GeneratedField(
        expression=Case(*(When(state=name, then=Value(values[index])) for name, values in _C.tuples.items()),
                        output_field=models.CharField(max_length=24)),
        output_field=models.CharField(max_length=24), db_persist=True)


def _transition_methods() -> dict:
    """One django-fsm method per target tuple and kind, with the contract's sources. Operator-only methods need the
    `effects.reconcile_delivery` permission."""
    methods: dict = {}
    for operator_only, prefix in ((False, "to_"), (True, "reconcile_to_")):
        for target, sources in _C.sources_by_target(operator_only=operator_only).items():
            def method(self) -> None:
                pass
            method.__name__ = prefix + target
            method.__qualname__ = "DeliveryTransitions." + method.__name__
            decorator = transition(field="state", source=list(sources), target=target,
                                   permission="effects.reconcile_delivery" if operator_only else None)
            methods[method.__name__] = decorator(method)
    return methods


DeliveryTransitions = type("DeliveryTransitions", (), _transition_methods())


class DeliveryOperation(DeliveryTransitions, ConcurrentTransitionMixin, ScopedGeneration):
    """One child mutation of a parent plan: its delivery key (unique per namespace), receiver mutation key,
    sealed payload, mutation intent, and the contract's five-axis state. `revision` advances on every transition
    (the compare-and-swap token), `attempt_ordinal` and `observation_ordinal` never decrease."""

    parent = models.ForeignKey(DeliveryParent, on_delete=models.PROTECT, related_name="children")
    ordinal = models.PositiveIntegerField()
    frontier_order = models.PositiveIntegerField()
    namespace = models.BinaryField(max_length=32)
    logical_route_id = models.CharField(max_length=255)
    target_effect_scope = models.CharField(max_length=255)
    source_boundary = models.CharField(max_length=255)
    mutation_kind = models.CharField(max_length=24)
    explicit_generation = models.CharField(max_length=64)
    delivery_key = models.BinaryField(max_length=32)
    receiver_mutation_key = models.BinaryField(max_length=32)
    binding = models.ForeignKey(ReceiverBinding, on_delete=models.PROTECT, related_name="operations")
    profile = models.ForeignKey(DeliveryProfile, on_delete=models.PROTECT, related_name="operations")
    domain = models.ForeignKey(EffectDomainLock, on_delete=models.PROTECT, related_name="operations")
    payload = models.BinaryField()
    payload_digest = models.BinaryField(max_length=32)
    record_count = models.PositiveIntegerField()
    coverage_proof = models.JSONField()
    rendered_request_semantics_digest = models.BinaryField(max_length=32)
    mutation_intent_digest = models.BinaryField(max_length=32)
    state = FSMField(default=_C.initial, choices=TUPLE_CHOICES, protected=True)
    execution = _axis_field("execution")
    remote_effect = _axis_field("remote_effect")
    acknowledgement = _axis_field("acknowledgement")
    verification = _axis_field("verification")
    checkpoint = _axis_field("checkpoint")
    revision = models.PositiveIntegerField(default=0)
    attempt_ordinal = models.PositiveIntegerField(default=0)
    observation_ordinal = models.PositiveIntegerField(default=0)
    next_attempt_after = models.DateTimeField(null=True, blank=True)
    remote_receipt_id = models.CharField(max_length=255, blank=True, default="")
    applied_count = models.PositiveIntegerField(null=True, blank=True)
    last_code = models.CharField(max_length=64, blank=True, default="")
    last_detail = models.TextField(blank=True, default="")
    reconciliation_id = models.CharField(max_length=128, blank=True, default="")
    reconciled = models.BooleanField(default=False)
    # A deterministic failure of a delivery step holds the operation for an operator (decision D-168): the sweep
    # and the step skip it; the contract state is left exactly as it was (held is not a delivery state).
    held_reason = models.CharField(max_length=64, blank=True, default="")
    held_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["parent", "ordinal"]
        constraints = [
            models.CheckConstraint(condition=(Q(held_reason="", held_at__isnull=True)
                                              | Q(held_reason=StepFailureReason.DELIVERY_STEP_FAILED,
                                                  held_at__isnull=False)),
                                   name="delivery_operation_hold_whole"),
            models.UniqueConstraint(fields=["namespace", "delivery_key"], name="delivery_unique_admission_key"),
            models.UniqueConstraint(fields=["parent", "ordinal"], name="delivery_child_ordinal"),
            models.CheckConstraint(condition=Q(state__in=list(_C.tuples)), name="delivery_state_is_legal_tuple"),
            _one_scope("delivery_operation"),
        ]
        indexes = [
            GistIndex(fields=["scope_ts"], name="delivery_op_scope_ts_gist"),
            GistIndex(fields=["scope_date"], name="delivery_op_scope_date_gist"),
            models.Index(fields=["domain", "state"], name="delivery_op_domain_state"),
            models.Index(fields=["state", "next_attempt_after"], name="delivery_op_due"),
            # /metrics (issue 21): held operations without scanning the delivered history.
            models.Index(fields=["held_reason", "held_at"], name="delivery_op_held", condition=~Q(held_reason="")),
            models.Index(fields=["changed_at"], name="delivery_op_reconciling", condition=RECONCILIATION_WAITING),
        ]
        permissions = [("reconcile_delivery", "Can open and resolve delivery reconciliations"),
                       ("approve_certification", "Can approve platform-attested receiver certifications"),
                       ("approve_journal_epoch", "Can approve a new delivery journal epoch")]

    def __str__(self) -> str:
        return f"delivery #{self.pk} child {self.ordinal} ({self.state})"

    @property
    def axes(self) -> tuple[str, ...]:
        return _C.tuples[self.state]

    def axis(self, name: str) -> str:
        """The axis value of the current (in-memory) state; the generated columns are for queries and are only
        refreshed from the database."""
        return _C.tuples[self.state][AXES.index(name)]


class MayAttemptMarker(models.Model):
    """The immutable pre-attempt marker, created if absent per (namespace, operation, attempt ordinal) in the same
    transaction as the capacity reservation, the attempt row and the CAS to SUBMITTING."""

    kind = models.CharField(max_length=16, default="MAY_ATTEMPT", editable=False)
    attempt_id = models.UUIDField(unique=True, default=uuid.uuid4)
    attempt_ordinal = models.PositiveIntegerField()
    operation = models.ForeignKey(DeliveryOperation, on_delete=models.PROTECT, related_name="markers")
    operation_namespace = models.BinaryField(max_length=32)
    parent_and_child_identity = models.CharField(max_length=512)
    generation = models.CharField(max_length=64)
    expected_journal_revision = models.PositiveIntegerField()
    journal_epoch = models.PositiveIntegerField()
    mutation_intent_digest = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operation", "attempt_ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["operation_namespace", "operation", "attempt_ordinal"],
                                    name="delivery_marker_create_if_absent_key"),
            models.CheckConstraint(condition=Q(kind="MAY_ATTEMPT"), name="delivery_marker_kind"),
        ]


class CapacityState(models.TextChoices):
    RESERVED = "reserved"
    RELEASED = "released"
    TRANSFERRED = "transferred"  # audited incident capacity transfer


class DeliveryAttempt(models.Model):
    """One submit attempt, bound to its MAY_ATTEMPT marker and holding a remote job capacity reservation until
    the contract's release policy lets it go. `io_may_have_started` is committed by the egress adapter before any
    byte leaves; the outcome is written once."""

    operation = models.ForeignKey(DeliveryOperation, on_delete=models.PROTECT, related_name="attempts")
    ordinal = models.PositiveIntegerField()
    attempt_id = models.UUIDField(unique=True)
    marker = models.OneToOneField(MayAttemptMarker, on_delete=models.PROTECT, related_name="attempt")
    semaphore = models.ForeignKey(RemoteJobSemaphore, on_delete=models.PROTECT, related_name="attempts")
    capacity_state = models.CharField(max_length=16, choices=CapacityState.choices, default=CapacityState.RESERVED)
    capacity_released_reason = models.CharField(max_length=64, blank=True, default="")
    io_may_have_started = models.BooleanField(default=False)
    io_started_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=24, blank=True, default="")  # not_started | answered | ambiguous
    response_status = models.PositiveIntegerField(null=True, blank=True)
    response_digest = models.BinaryField(max_length=32, null=True, blank=True)
    evidence = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["operation", "ordinal"]
        constraints = [models.UniqueConstraint(fields=["operation", "ordinal"], name="delivery_attempt_ordinal")]
        indexes = [models.Index(fields=["semaphore"], name="delivery_capacity_reserved",
                                condition=Q(capacity_state="reserved"))]


class DeliveryObservation(models.Model):
    """Append-only evidence of each answer the receiver gave (submit response, receipt poll)."""

    operation = models.ForeignKey(DeliveryOperation, on_delete=models.PROTECT, related_name="observations")
    ordinal = models.PositiveIntegerField()
    attempt = models.ForeignKey(DeliveryAttempt, on_delete=models.PROTECT, null=True, related_name="+")
    kind = models.CharField(max_length=16)  # submit | poll | verify
    acknowledgement = models.CharField(max_length=24)
    http_status = models.PositiveIntegerField(null=True)
    applied_count = models.IntegerField(null=True)
    body_digest = models.BinaryField(max_length=32, null=True)
    detail = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operation", "ordinal"]
        constraints = [models.UniqueConstraint(fields=["operation", "ordinal"], name="delivery_observation_ordinal")]


class DeliveryWatermark(ScopedGeneration):
    """The normalized, non-overlapping interval map of highest applied generation per effect conflict domain.
    Non-overlap is an exclusion constraint; split and merge happen under the domain lock in the effect commit."""

    domain = models.ForeignKey(EffectDomainLock, on_delete=models.PROTECT, related_name="watermarks")

    class Meta:
        ordering = ["domain", "pk"]
        constraints = [
            _one_scope("delivery_watermark"),
            ExclusionConstraint(name="delivery_watermark_ts_disjoint", index_type="gist",
                                expressions=[("domain", RangeOperators.EQUAL),
                                             ("scope_ts", RangeOperators.OVERLAPS)]),
            ExclusionConstraint(name="delivery_watermark_date_disjoint", index_type="gist",
                                expressions=[("domain", RangeOperators.EQUAL),
                                             ("scope_date", RangeOperators.OVERLAPS)]),
        ]


class GateState(models.TextChoices):
    ENABLED = "ENABLED"
    BLOCKED = "BLOCKED"


class MutationGate(ConcurrentTransitionMixin, models.Model):
    """The delivery mutation gate (one row). Submits lock it FOR SHARE and require ENABLED and the journal epoch
    attested in the journal database; blocking and unblocking lock it FOR UPDATE."""

    singleton = models.BooleanField(default=True, unique=True)
    state = FSMField(default=GateState.ENABLED, choices=GateState.choices, protected=True)
    journal_epoch = models.PositiveIntegerField(default=1)
    blocked_reason = models.CharField(max_length=64, blank=True, default="")
    blocked_detail = models.TextField(blank=True, default="")
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(singleton=True), name="delivery_gate_singleton")]

    @transition(field=state, source=[GateState.ENABLED, GateState.BLOCKED], target=GateState.BLOCKED)
    def block(self, *, reason: str, detail: str) -> None:
        self.blocked_reason, self.blocked_detail = reason, detail

    @transition(field=state, source=GateState.BLOCKED, target=GateState.ENABLED,
                permission="effects.approve_journal_epoch")
    def unblock(self, *, journal_epoch: int) -> None:
        self.journal_epoch = journal_epoch
        self.blocked_reason, self.blocked_detail = "", ""


class ReconciliationCampaign(models.Model):
    """A journal reconciliation campaign: every operation with an open attempt reconciled by attempt ID, with
    its findings. Required (completed) to unblock the mutation gate."""

    campaign_id = models.CharField(max_length=128, unique=True)
    reason = models.CharField(max_length=64)
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    findings = models.JSONField(default=list)
    completed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)


class DeliveryReconciliation(models.Model):
    """Append-only record of one operator-only transition: reconciliation ID, the tuple moved from and to, the
    proof it carried (effect proof, evidence digest or verification proof) and the approving user."""

    operation = models.ForeignKey(DeliveryOperation, on_delete=models.PROTECT, related_name="reconciliations")
    reconciliation_id = models.CharField(max_length=128)
    from_state = models.CharField(max_length=64)
    to_state = models.CharField(max_length=64)
    revision = models.PositiveIntegerField()
    proof_kind = models.CharField(max_length=24, blank=True, default="")
    proof = models.JSONField(null=True, blank=True)
    proof_digest = models.BinaryField(max_length=32, null=True, blank=True)
    approved_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operation", "pk"]
        constraints = [models.UniqueConstraint(fields=["operation", "revision"],
                                               name="delivery_reconciliation_revision")]


class JournalEpochAttestation(models.Model):
    """An attested journal epoch, kept in the `journal` database (outside what a restore of `default` replaces).
    The newest attestation is the epoch submits must match; a restored `default` that lags it is detected."""

    journal_database = True

    epoch = models.PositiveIntegerField(unique=True)
    reason = models.CharField(max_length=64)
    campaign_id = models.CharField(max_length=128, blank=True, default="")
    attested_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["epoch"]
