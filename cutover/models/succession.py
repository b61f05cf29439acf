"""V2 -> V2 succession: the publication barrier set that freezes one successor attempt, and the per-lane
OrderingHandoff that carries a predecessor lane's frozen high-water into the successor epoch.

Both live in the `default` database next to the epochs, gates and lanes they bind (the successor activation
transaction locks them together). PostgreSQL enforces the barrier-set transition table, its fence and its
immutable binding columns, and refuses every UPDATE or DELETE of a handoff (migration
`0004_succession_db_rules`).
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from cutover.choices import (BARRIER_SET_OPEN, SINGLE_OWNER_KINDS, SUCCESSION_DRAIN_CLOSED, BarrierOwnerKind,
                             BarrierSetState, SuccessionDrainState, SuccessorClass)

__all__ = ["ServingPublicationBarrierSet", "BarrierOwnerReceipt", "OrderingHandoff", "SuccessionDrain"]


class ServingPublicationBarrierSet(ConcurrentTransitionMixin, models.Model):
    """Activation evidence of one successor attempt, or of the first activation of a service cutover attempt
    (no predecessor; `attempt_key` names the attempt; its frozen digest also covers the readiness and shutdown
    certificates and the restore point): binds the exact predecessor and successor epochs (ID and
    digest) and the successor's serving scope, and, once held, the digest of the owner receipts reread under it.
    Invariants: at most one nonreleased set per predecessor epoch (the activation scope of a V2 -> V2
    succession); `fence` advances by exactly one on every transition and a stale holder's fence is refused;
    the binding columns never change; only `requires_drain` successors exist; `released` is terminal; the set
    never expires into release (there is no time column that decides anything)."""

    # Null for a first activation (V1 -> V2), which names its service cutover attempt instead.
    predecessor_epoch = models.ForeignKey("connector.ServingEpoch", on_delete=models.PROTECT, related_name="+",
                                          null=True, blank=True)
    predecessor_digest = models.BinaryField(max_length=32, null=True, blank=True)
    attempt_key = models.CharField(max_length=255, blank=True, default="")
    successor_epoch = models.ForeignKey("connector.ServingEpoch", on_delete=models.PROTECT, related_name="+")
    successor_key = models.CharField(max_length=255)  # the successor's exact epoch ID
    successor_digest = models.BinaryField(max_length=32)
    scope_digest = models.BinaryField(max_length=32)
    successor_class = models.CharField(max_length=32, choices=SuccessorClass.choices,
                                       default=SuccessorClass.REQUIRES_DRAIN)
    holder = models.CharField(max_length=255)
    state = FSMField(default=BarrierSetState.ACQUIRING, choices=BarrierSetState.choices, protected=True)
    fence = models.BigIntegerField(default=1)
    owner_receipts_digest = models.BinaryField(max_length=32, null=True, blank=True)
    release_reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["predecessor_epoch"], condition=Q(state__in=BARRIER_SET_OPEN),
                                    name="cutover_barrierset_one_open_per_predecessor",
                                    violation_error_code="barrier_set_open"),
            models.UniqueConstraint(fields=["successor_epoch"], condition=Q(state__in=BARRIER_SET_OPEN,
                                                                           predecessor_epoch__isnull=True),
                                    name="cutover_barrierset_one_open_first_activation",
                                    violation_error_code="barrier_set_open"),
            models.CheckConstraint(condition=(Q(predecessor_epoch__isnull=True, predecessor_digest__isnull=True)
                                              & ~Q(attempt_key=""))
                                   | (Q(predecessor_epoch__isnull=False, predecessor_digest__isnull=False)
                                      & Q(attempt_key="")),
                                   name="cutover_barrierset_first_activation_or_succession"),
            models.CheckConstraint(condition=Q(successor_class=SuccessorClass.REQUIRES_DRAIN),
                                   name="cutover_barrierset_requires_drain_only",
                                   violation_error_code="successor_class_unsupported"),
            models.CheckConstraint(condition=Q(state__in=BarrierSetState.values), name="cutover_barrierset_state"),
            models.CheckConstraint(condition=~Q(predecessor_epoch=models.F("successor_epoch")),
                                   name="cutover_barrierset_distinct_epochs"),
            models.CheckConstraint(
                condition=Q(state=BarrierSetState.ACQUIRING) | Q(owner_receipts_digest__isnull=False)
                | Q(state=BarrierSetState.RELEASED),
                name="cutover_barrierset_held_has_receipts"),
        ]
        permissions = [("coordinate_succession", "Can run V2 -> V2 successor activation phases")]

    def __str__(self) -> str:
        return f"barrier set #{self.pk} -> {self.successor_key} ({self.state}, fence {self.fence})"

    @transition(field=state, source=BarrierSetState.ACQUIRING, target=BarrierSetState.HELD)
    def hold(self, *, owner_receipts_digest: bytes) -> None:
        self.owner_receipts_digest = owner_receipts_digest
        self.fence += 1

    @transition(field=state, source=BarrierSetState.HELD, target=BarrierSetState.ACTIVATION_COMMITTED)
    def commit_activation(self) -> None:
        self.fence += 1

    @transition(field=state, source=[BarrierSetState.ACQUIRING, BarrierSetState.HELD,
                                     BarrierSetState.ACTIVATION_COMMITTED], target=BarrierSetState.RELEASED)
    def release(self, *, reason: str) -> None:
        self.release_reason = reason
        self.fence += 1

    def take_over(self, *, holder: str) -> None:
        """A fenced successor coordinator takes over the same open set (CV2-11-049/056): the holder changes and
        the fence advances by one, the state does not (not an edge of the state machine; PostgreSQL allows a
        holder change only on an open set and only with that fence step, migration 0015). Every later act of the
        previous holder is refused by its holder and fence."""
        assert self.state in BARRIER_SET_OPEN and holder and holder != self.holder
        self.holder = holder
        self.fence += 1


class BarrierOwnerReceipt(models.Model):
    """One external owner's fenced publication-barrier receipt, frozen in a barrier set when the set is acquired
    (CV2-15-009, CV2-11-033/037): the owner (kind and exact ID), the digest of what that owner certified for the
    candidate, the holder and the set fence that recorded it. Invariants: append-only; exactly one receipt per
    (set, owner kind, owner ID), and one per set for each of Catalog, the L2 configuration owner and credential
    authority; the set's owners are checked against these rows before it is held and on every recovery."""

    barrier_set = models.ForeignKey(ServingPublicationBarrierSet, on_delete=models.PROTECT,
                                    related_name="owner_receipts")
    owner_kind = models.CharField(max_length=32, choices=BarrierOwnerKind.choices)
    owner_id = models.CharField(max_length=255)
    receipt_digest = models.BinaryField(max_length=32)
    holder = models.CharField(max_length=255)
    fence = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["barrier_set", "owner_kind", "owner_id"]
        constraints = [
            models.UniqueConstraint(fields=["barrier_set", "owner_kind", "owner_id"],
                                    name="cutover_barrierreceipt_one_per_owner",
                                    violation_error_code="barrier_receipt_exists"),
            models.UniqueConstraint(fields=["barrier_set", "owner_kind"],
                                    condition=Q(owner_kind__in=SINGLE_OWNER_KINDS),
                                    name="cutover_barrierreceipt_one_singleton_owner",
                                    violation_error_code="barrier_receipt_exists"),
            models.CheckConstraint(condition=Q(owner_kind__in=BarrierOwnerKind.values),
                                   name="cutover_barrierreceipt_owner_kind"),
            models.CheckConstraint(condition=Q(fence__gte=1), name="cutover_barrierreceipt_fence_positive"),
            models.CheckConstraint(condition=Q(receipt_digest__length=32),
                                   name="cutover_barrierreceipt_digest_len"),
            models.CheckConstraint(condition=~Q(owner_id="") & ~Q(holder=""),
                                   name="cutover_barrierreceipt_named"),
        ]

    def __str__(self) -> str:
        return f"receipt {self.owner_kind}:{self.owner_id} of set #{self.barrier_set_id} (fence {self.fence})"


class OrderingHandoff(models.Model):
    """The frozen end of one predecessor lane and the baseline of its successor lane. Invariants: immutable and
    undeletable; one per (successor epoch, predecessor lane) and one per successor lane; `high_water` equals the
    predecessor lane's final high-water at `predecessor_lane_fence` and the successor lane's baseline; the
    comparator/partition contract digest is equal on both sides (no L1 transformation is supported); a handoff to
    a replacement successor copies the frozen high-water and fence of the handoff it `derived_from`."""

    barrier_set = models.ForeignKey(ServingPublicationBarrierSet, on_delete=models.PROTECT, related_name="handoffs")
    predecessor_epoch = models.ForeignKey("connector.ServingEpoch", on_delete=models.PROTECT, related_name="+")
    successor_epoch = models.ForeignKey("connector.ServingEpoch", on_delete=models.PROTECT, related_name="+")
    account = models.ForeignKey("connector.ConnectorAccount", on_delete=models.PROTECT, related_name="+")
    predecessor_lane = models.ForeignKey("connector.OrderingLane", on_delete=models.PROTECT, related_name="+")
    predecessor_lane_fence = models.BigIntegerField()
    successor_lane = models.OneToOneField("connector.OrderingLane", on_delete=models.PROTECT, related_name="+")
    route = models.CharField(max_length=255)
    predecessor_route_version = models.PositiveIntegerField()
    successor_route_version = models.PositiveIntegerField()
    partition = models.CharField(max_length=255)
    contract = models.CharField(max_length=32)
    contract_digest = models.BinaryField(max_length=32)
    high_water = models.DecimalField(max_digits=38, decimal_places=0, null=True, blank=True)
    high_water_tie = models.BinaryField(null=True, blank=True)
    # A replacement successor's handoff derives from the first, frozen one and cites it (CV2-11-021).
    derived_from = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    handoff_digest = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["successor_epoch", "predecessor_lane"],
                                    name="cutover_orderinghandoff_one_per_lane",
                                    violation_error_code="handoff_exists"),
        ]

    def __str__(self) -> str:
        return f"handoff {self.route}/{self.partition} hw={self.high_water} -> epoch #{self.successor_epoch_id}"


class SuccessionDrain(ConcurrentTransitionMixin, models.Model):
    """The drain phase of one successor attempt (CV2-11-005, D-315/D-316): opened under the attempt's held barrier
    set while every gate is still `v2_serving` on the active predecessor. While it is `draining` or `drained`, a
    trigger (migration 0014) refuses every new root bound to the predecessor (a Receipt; an OutboundCommand with
    no source Execution) with SUCCESSION_ROOTS_CLOSED; continuation work of admitted roots proceeds. It becomes
    `drained` only when the predecessor's continuation inventory, measured in the database, is empty; the
    coordinator's halt requires that. Invariants: one per barrier set; at most one closing the roots of an epoch;
    `fence` advances by one on every transition; `released` (the barrier set's release) is terminal; no time column
    decides anything."""

    barrier_set = models.OneToOneField(ServingPublicationBarrierSet, on_delete=models.PROTECT,
                                       related_name="drain")
    predecessor_epoch = models.ForeignKey("connector.ServingEpoch", on_delete=models.PROTECT, related_name="+")
    state = FSMField(default=SuccessionDrainState.DRAINING, choices=SuccessionDrainState.choices, protected=True)
    fence = models.BigIntegerField(default=1)
    # The inventory measured when it completed (empty, with the counts per kind), kept as evidence.
    drained_inventory = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["predecessor_epoch"], condition=Q(state__in=SUCCESSION_DRAIN_CLOSED),
                                    name="cutover_successiondrain_one_closed_per_epoch",
                                    violation_error_code="succession_drain_open"),
            models.CheckConstraint(condition=Q(state__in=SuccessionDrainState.values),
                                   name="cutover_successiondrain_state"),
            models.CheckConstraint(condition=~Q(state=SuccessionDrainState.DRAINED)
                                   | Q(drained_inventory__isnull=False),
                                   name="cutover_successiondrain_drained_has_inventory"),
        ]

    def __str__(self) -> str:
        return f"succession drain #{self.pk} of barrier set #{self.barrier_set_id} ({self.state}, fence {self.fence})"

    @transition(field=state, source=SuccessionDrainState.DRAINING, target=SuccessionDrainState.DRAINED)
    def complete(self, *, inventory: dict) -> None:
        self.drained_inventory = inventory
        self.fence += 1

    @transition(field=state, source=[SuccessionDrainState.DRAINING, SuccessionDrainState.DRAINED],
                target=SuccessionDrainState.RELEASED)
    def release(self) -> None:
        self.fence += 1
