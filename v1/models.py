"""The V1 authority tables: the pre-V2 execution model this product cuts over from.

V1 is deliberately small and deliberately unaware of V2: it never reads an AccountServingGate or any V2 table
(CV2-12-027). Its process generations, owner barriers, accepted WorkItems, outbound effects with their durable
pre-I/O marker, source cursors and typed high-waters are what the cutover coordinator drains, inventories,
tombstones and restores (through cutover.ports, never by importing this app).
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q
from django_fsm import FSMField, transition

RELEASE_ID = "v1-release-2026.12"


class GenerationState(models.TextChoices):
    RUNNING = "running"  # initial: a started process generation
    TERMINATED = "terminated"  # running -> terminated: the supervisor disabled it for good; terminal


GENERATION_TRANSITIONS = ((GenerationState.RUNNING, GenerationState.TERMINATED),)


class V1ProcessGeneration(models.Model):
    """One V1 process generation (ingress, workers, dispatchers). Invariants: at most one running; a terminated
    generation never runs again and an isolated one never regains provider egress (PostgreSQL triggers)."""

    generation_id = models.CharField(max_length=255, unique=True)
    release_id = models.CharField(max_length=255)
    state = FSMField(default=GenerationState.RUNNING, choices=GenerationState.choices, protected=True)
    egress_isolated = models.BooleanField(default=False)
    started_by = models.CharField(max_length=255, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    terminated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["state"], condition=Q(state=GenerationState.RUNNING),
                                    name="v1_generation_one_running"),
            models.CheckConstraint(condition=Q(state__in=GenerationState.values), name="v1_generation_state"),
        ]

    def __str__(self) -> str:
        return f"V1 generation {self.generation_id} ({self.state}{', isolated' if self.egress_isolated else ''})"

    @transition(field=state, source=GenerationState.RUNNING, target=GenerationState.TERMINATED)
    def terminate(self) -> None:
        pass


class BarrierKind(models.TextChoices):
    INGRESS = "ingress"
    ROOT_OUTBOUND = "root_outbound"
    AUTHORING = "authoring"


class V1Barrier(models.Model):
    """One owner-level maintenance barrier. Entry transactions hold it FOR SHARE; closing takes it FOR UPDATE, so
    a close waits for every in-flight entry transaction (which commits and joins the drain)."""

    kind = models.CharField(max_length=32, choices=BarrierKind.choices, unique=True)
    closed = models.BooleanField(default=False)
    attempt_key = models.CharField(max_length=255, default="")
    fence = models.BigIntegerField(default=1)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind"]

    def __str__(self) -> str:
        return f"V1 barrier {self.kind} ({'closed' if self.closed else 'open'})"


class V1SourceCursor(models.Model):
    """The durable cursor of one ingress source; a closed ingress barrier never advances it."""

    source_key = models.CharField(max_length=255, unique=True)
    cursor = models.CharField(max_length=255, default="")
    checkpointed = models.BooleanField(default=True)
    changed_at = models.DateTimeField(auto_now=True)


class WorkState(models.TextChoices):
    ACCEPTED = "accepted"  # initial: the inbound item is durable
    CLAIMED = "claimed"  # accepted -> claimed: a worker of a running generation holds the lease
    DONE = "done"  # claimed -> done: every outbound effect it needed is finalized; terminal


WORK_TRANSITIONS = ((WorkState.ACCEPTED, WorkState.CLAIMED), (WorkState.CLAIMED, WorkState.DONE),
                    (WorkState.CLAIMED, WorkState.ACCEPTED))


class V1WorkItem(models.Model):
    """One accepted inbound item and its work state. Unique per (account, source, transport key): a transport
    duplicate is recognized, never accepted twice."""

    account_key = models.CharField(max_length=255)
    source_key = models.CharField(max_length=255)
    transport_key = models.CharField(max_length=255)
    payload = models.BinaryField()
    payload_digest = models.BinaryField(max_length=32)
    route_key = models.CharField(max_length=255, default="records.webhook")
    partition = models.CharField(max_length=255)
    position = models.DecimalField(max_digits=38, decimal_places=0)
    state = FSMField(default=WorkState.ACCEPTED, choices=WorkState.choices, protected=True)
    lease_generation = models.CharField(max_length=255, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    # The deadline of the upstream dependency this item waits on (None: none). Set at acceptance, never changed:
    # V1 keeps the item open until the dependency resolves or this deadline passes, so the cutover's drain
    # projection covers the latest one (preflight measures it, CV2-12-016).
    dependency_deadline = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["account_key", "source_key", "transport_key"],
                                    name="v1_workitem_transport_unique"),
            models.CheckConstraint(condition=Q(state__in=WorkState.values), name="v1_workitem_state"),
        ]

    def __str__(self) -> str:
        return f"V1 work item {self.transport_key} ({self.state})"

    @transition(field=state, source=WorkState.ACCEPTED, target=WorkState.CLAIMED)
    def claim(self, *, generation_id: str, until) -> None:
        self.lease_generation, self.lease_until = generation_id, until

    @transition(field=state, source=WorkState.CLAIMED, target=WorkState.DONE)
    def complete(self) -> None:
        self.lease_until = None

    @transition(field=state, source=WorkState.CLAIMED, target=WorkState.ACCEPTED)
    def release(self) -> None:
        self.lease_generation, self.lease_until = "", None


class EffectState(models.TextChoices):
    INTENT = "intent"  # initial: authored, no byte may have left
    DISPATCHING = "dispatching"  # intent -> dispatching: THE durable pre-I/O marker, committed before the call
    FINALIZED = "finalized"  # dispatching -> finalized: the provider confirmed; terminal
    NO_EFFECT = "no_effect"  # dispatching -> no_effect: proved no provider effect (refused, or reconciled); terminal
    AMBIGUOUS = "ambiguous"  # dispatching -> ambiguous: the call's outcome is unknown; needs reconciliation


EFFECT_TRANSITIONS = (
    (EffectState.INTENT, EffectState.DISPATCHING),
    (EffectState.DISPATCHING, EffectState.FINALIZED),
    (EffectState.DISPATCHING, EffectState.NO_EFFECT),
    (EffectState.DISPATCHING, EffectState.AMBIGUOUS),
    (EffectState.AMBIGUOUS, EffectState.FINALIZED),
    (EffectState.AMBIGUOUS, EffectState.NO_EFFECT),
)
EFFECT_TERMINAL = (EffectState.FINALIZED, EffectState.NO_EFFECT)


class V1OutboundEffect(models.Model):
    """One V1 provider effect: a continuation of a WorkItem, or a root request (work_item null). `request_key` is
    its provider idempotency key. Evidence is appended when it terminalizes."""

    work_item = models.ForeignKey(V1WorkItem, on_delete=models.PROTECT, null=True, blank=True,
                                  related_name="effects")
    account_key = models.CharField(max_length=255)
    request_key = models.CharField(max_length=255, unique=True)
    request_body = models.BinaryField()
    request_digest = models.BinaryField(max_length=32)
    state = FSMField(default=EffectState.INTENT, choices=EffectState.choices, protected=True)
    dispatch_generation = models.CharField(max_length=255, default="")
    remote_id = models.CharField(max_length=255, default="")
    evidence = models.TextField(default="")
    created_at = models.DateTimeField(auto_now_add=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.CheckConstraint(condition=Q(state__in=EffectState.values), name="v1_effect_state")]

    def __str__(self) -> str:
        return f"V1 effect {self.request_key} ({self.state})"

    @transition(field=state, source=EffectState.INTENT, target=EffectState.DISPATCHING)
    def mark_dispatching(self, *, generation_id: str) -> None:
        self.dispatch_generation = generation_id

    @transition(field=state, source=[EffectState.DISPATCHING, EffectState.AMBIGUOUS], target=EffectState.FINALIZED)
    def finalize(self, *, remote_id: str, evidence: str) -> None:
        self.remote_id, self.evidence = remote_id, evidence

    @transition(field=state, source=[EffectState.DISPATCHING, EffectState.AMBIGUOUS], target=EffectState.NO_EFFECT)
    def prove_no_effect(self, *, evidence: str) -> None:
        self.evidence = evidence

    @transition(field=state, source=EffectState.DISPATCHING, target=EffectState.AMBIGUOUS)
    def mark_ambiguous(self, *, evidence: str) -> None:
        self.evidence = evidence


class V1HighWater(models.Model):
    """The typed high-water of one order-dependent route and partition (positions only move forward)."""

    account_key = models.CharField(max_length=255)
    route_key = models.CharField(max_length=255)
    partition = models.CharField(max_length=255)
    high_water = models.DecimalField(max_digits=38, decimal_places=0)
    comparator = models.CharField(max_length=64, default="integer")

    class Meta:
        ordering = ["pk"]
        constraints = [models.UniqueConstraint(fields=["account_key", "route_key", "partition"],
                                               name="v1_highwater_unique")]
