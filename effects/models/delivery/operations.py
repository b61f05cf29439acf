"""Parent plans and their child operations with the contract's five-axis state machine.

The operation's `state` is the name of one of the contract's legal tuples; its five axes are generated columns
computed by PostgreSQL from `state`, so no row can hold a tuple the contract does not list. The transitions are
django-fsm methods generated from the contract (`to_<tuple>` for automatic ones, `reconcile_to_<tuple>` for the
operator-only ones); a trigger installed from the same list refuses every other edge in the database.
"""
from __future__ import annotations

from django.contrib.postgres.indexes import GistIndex
from django.db import models
from django.db.models import Case, Q, Value, When
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from connector.choices import StepFailureReason
from effects.choices import ParentState
from effects.delivery.contract import AXES, contract
from effects.models.delivery.domains import EffectDomainLock, ScopedGeneration, one_scope
from effects.models.delivery.profiles import DeliveryProfile
from effects.models.delivery.receivers import ReceiverBinding

__all__ = ["DeliveryParent", "DeliveryTransitions", "DeliveryOperation", "TUPLE_CHOICES", "RECONCILIATION_WAITING",
           "RECONCILIATION_WAITING_STATES"]

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
            one_scope("delivery_parent"),
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
            one_scope("delivery_operation"),
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
