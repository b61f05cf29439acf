"""OutboundCommand (with its FrozenDispatchBinding), RemoteEffect, RemoteEffectAttempt, DispatchPermit, RemoteLink."""
from __future__ import annotations

from django.db import models
from django.db.models import Q, Value
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from connector.selectors.rows import RoutedSaveMixin
from effects.choices import DEFAULT_RETRY_SCHEDULE, UNCERTAIN_HOLDS, AttemptOutcome, EffectState, LinkState, PermitState
from effects.models.holders import ProcessGeneration

__all__ = ["OutboundCommand", "RemoteEffect", "RemoteEffectAttempt", "DispatchPermit", "RemoteLink",
           "RemoteLinkResolution"]


class OutboundCommand(models.Model):
    """Runtime's immutable outbox intent, inserted in the application transaction that requested the effect, with
    its complete FrozenDispatchBinding. Invariants: one per (account, application scope, EffectRoot, EffectSlot,
    EffectGeneration); `idempotency_key` (the canonical tuple digest) unique; one chain head (no predecessor) per
    (account, application scope, EffectRoot, EffectSlot); never updated; no secret bytes."""

    account = models.ForeignKey("connector.ConnectorAccount", on_delete=models.PROTECT,
                                related_name="outbound_commands")
    application_scope = models.CharField(max_length=255)
    effect_root_id = models.CharField(max_length=255)
    effect_slot_id = models.CharField(max_length=255)
    effect_generation_id = models.CharField(max_length=255)
    idempotency_key = models.BinaryField(max_length=32, unique=True)
    source_execution = models.ForeignKey("connector.Execution", on_delete=models.PROTECT, null=True, blank=True,
                                         related_name="outbound_commands")
    # FrozenDispatchBinding
    epoch = models.ForeignKey("connector.ServingEpoch", on_delete=models.PROTECT, related_name="outbound_commands")
    epoch_digest = models.BinaryField(max_length=32)
    gate_fence = models.BigIntegerField()
    profile_id = models.CharField(max_length=255)
    pack_generation = models.ForeignKey("connector.PackGeneration", on_delete=models.PROTECT, related_name="+")
    pack_payload_digest = models.BinaryField(max_length=32)
    effect_definition = models.CharField(max_length=255)
    effect_version = models.PositiveIntegerField()
    callout = models.CharField(max_length=255)
    route_policy_digest = models.BinaryField(max_length=32)
    configuration = models.ForeignKey("connector.ServiceConfigurationGeneration", on_delete=models.PROTECT,
                                      related_name="+")
    credential_generation = models.ForeignKey("connector.CredentialGeneration", on_delete=models.PROTECT,
                                              related_name="outbound_commands")
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=1024)
    request_body = models.BinaryField()
    request_digest = models.BinaryField(max_length=32)
    provider_idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    max_attempts = models.PositiveIntegerField()
    # The retry schedule of attempts that never reached the receiver (connection refused, DNS, TLS handshake, connect
    # or pool timeout: no request byte left), frozen from the callout definition's `retry` (D-420): the n-th such
    # attempt is followed by a new one after about `retry_schedule[n-1]` seconds (with jitter); once the schedule is
    # spent the effect is terminal `no_effect` with RECEIVER_UNREACHABLE. The database default is the product's
    # default schedule, so commands written before the column keep the same policy.
    retry_schedule = models.JSONField(db_default=Value(list(DEFAULT_RETRY_SCHEDULE), output_field=models.JSONField()))
    # The destination's declared rate and concurrency limit, frozen from the callout definition's `rate_limit`
    # (all null: none declared, no limiter is ever locked). Part of the route policy digest (D-222).
    rate_requests_per_second = models.PositiveIntegerField(null=True, blank=True)
    rate_max_in_flight = models.PositiveIntegerField(null=True, blank=True)
    rate_burst = models.PositiveIntegerField(null=True, blank=True)
    limiter = models.ForeignKey("effects.DestinationLimiter", on_delete=models.PROTECT, null=True, blank=True,
                                related_name="commands")
    predecessor = models.OneToOneField("self", on_delete=models.PROTECT, null=True, blank=True,
                                       related_name="successor")
    predecessor_digest = models.BinaryField(max_length=32, null=True, blank=True)
    binding_digest = models.BinaryField(max_length=32)
    # Remote identity (CV2-10-045): the local owner slot the effect writes, and the active RemoteLink whose remote
    # identity an update addressed when it was authored (null for a create). Chosen from the RemoteLink only,
    # never from the pushed fields (CV2-10-059).
    owner_slot = models.CharField(max_length=255, blank=True, default="")
    target_link = models.ForeignKey("effects.RemoteLink", on_delete=models.PROTECT, null=True, blank=True,
                                    related_name="addressed_by")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["account", "application_scope", "effect_root_id", "effect_slot_id",
                                            "effect_generation_id"], name="effects_command_unique_logical_effect"),
            # One chain per EffectRoot and slot: a further generation exists only as the successor of another
            # (`predecessor` is one-to-one, so the chain is linear with one tail). With successors admitted only
            # after the tail is proven no_effect (effects.services.intents, D-305), at most one effect of a root and
            # slot is ever non-terminal.
            models.UniqueConstraint(fields=["account", "application_scope", "effect_root_id", "effect_slot_id"],
                                    condition=Q(predecessor__isnull=True), name="effects_command_one_chain_head"),
            models.CheckConstraint(condition=Q(predecessor__isnull=True, predecessor_digest__isnull=True)
                                   | Q(predecessor__isnull=False, predecessor_digest__isnull=False),
                                   name="effects_command_predecessor_whole"),
            models.CheckConstraint(condition=~Q(provider_idempotency_key=""),
                                   name="effects_command_provider_key_not_blank"),
            models.CheckConstraint(condition=Q(target_link__isnull=True) | ~Q(owner_slot=""),
                                   name="effects_command_update_names_its_slot"),
            models.CheckConstraint(
                condition=Q(rate_requests_per_second__isnull=True, rate_max_in_flight__isnull=True,
                            rate_burst__isnull=True, limiter__isnull=True)
                | Q(rate_requests_per_second__gte=1, rate_max_in_flight__gte=1, rate_burst__gte=1,
                    limiter__isnull=False),
                name="effects_command_rate_limit_whole"),
        ]

    def __str__(self) -> str:
        return f"{self.effect_root_id}/{self.effect_slot_id}/{self.effect_generation_id}"


class RemoteEffect(RoutedSaveMixin, ConcurrentTransitionMixin, models.Model):
    """The sole lifecycle authority of one logical external side effect. Invariants: exactly one per
    OutboundCommand (non-null unique FK) repeating its logical-effect digest; at most one open permit."""

    command = models.OneToOneField(OutboundCommand, on_delete=models.PROTECT, related_name="effect")
    logical_effect_digest = models.BinaryField(max_length=32)
    account = models.ForeignKey("connector.ConnectorAccount", on_delete=models.PROTECT, related_name="remote_effects")
    state = FSMField(default=EffectState.PREPARED, choices=EffectState.choices, protected=True)
    lease_holder = models.CharField(max_length=255, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_fence = models.BigIntegerField(default=0)
    attempt_count = models.PositiveIntegerField(default=0)
    remote_id = models.CharField(max_length=255, blank=True, default="")
    # The closed reason code of a quarantined effect, of a remote_confirmed one held (REMOTE_LINK_CONFLICT), or of a
    # terminal no_effect the frozen policy decided (effects.choices.NoEffectReason, D-423, D-481).
    quarantine_reason = models.CharField(max_length=64, blank=True, default="")
    # A `prepared` effect is not claimed before this time: the next attempt of a retry scheduled after an attempt that
    # never reached the receiver (D-421). Null: claimable now.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    changed_at = models.DateTimeField(auto_now=True)
    # The command's owner slot, copied when it is authored (immutable like the command): the pushes of one slot are
    # sent one at a time in authored order (D-441), which the claim reads from `effects_effect_slot_open`.
    owner_slot = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["pk"]
        indexes = [models.Index(fields=["account", "state"], name="effects_effect_claimable",
                                condition=Q(state="prepared")),
                   # The open (non-terminal) effects of each owner slot, in authored order (D-441): the claim's
                   # "no earlier open effect of this slot" probe. Terminal effects leave it.
                   models.Index(fields=["account", "owner_slot", "id"], name="effects_effect_slot_open",
                                condition=Q(state__in=["prepared", "dispatching", "uncertain", "remote_confirmed"])
                                & ~Q(owner_slot="")),
                   # /metrics (issue 21): effects in flight or waiting for a person, without scanning the finalized
                   # history.
                   models.Index(fields=["state", "changed_at"], name="effects_effect_unsettled",
                                condition=Q(state__in=["dispatching", "uncertain", "quarantined", "remote_confirmed"])),
                   # The overview's "effects finalized" of the last hour (issue 21): finalized effects by time, written
                   # once per effect when it finalizes.
                   models.Index(fields=["changed_at"], name="effects_effect_finalized_time",
                                condition=Q(state="finalized")),
                   # The operator screens' effect list (issue 38, D-473): effects in a state other than `finalized`
                   # (the history's state) and effects with a reason code, newest first, without reading the
                   # finalized history.
                   models.Index(fields=["state", "id"], name="effects_effect_live_newest",
                                condition=~Q(state="finalized")),
                   models.Index(fields=["quarantine_reason", "id"], name="effects_effect_coded",
                                condition=~Q(quarantine_reason=""))]
        permissions = [("reconcile_effect", "Can reconcile an uncertain remote effect with evidence")]

    def __str__(self) -> str:
        return f"effect #{self.pk} ({self.state})"

    @transition(field=state, source=EffectState.PREPARED, target=EffectState.DISPATCHING)
    def dispatch(self) -> None:
        pass

    @transition(field=state, source=[EffectState.PREPARED, EffectState.UNCERTAIN], target=EffectState.QUARANTINED)
    def quarantine(self, *, reason: str) -> None:
        self.quarantine_reason = reason
        self.lease_holder, self.lease_expires_at = "", None

    @transition(field=state, source=[EffectState.DISPATCHING, EffectState.UNCERTAIN],
                target=EffectState.REMOTE_CONFIRMED)
    def confirm(self, *, remote_id: str) -> None:
        self.remote_id = remote_id
        self._lift_uncertain_hold()

    @transition(field=state, source=EffectState.DISPATCHING, target=EffectState.UNCERTAIN)
    def become_uncertain(self) -> None:
        self.lease_holder, self.lease_expires_at = "", None

    @transition(field=state, source=[EffectState.DISPATCHING, EffectState.UNCERTAIN], target=EffectState.NO_EFFECT)
    def no_effect(self, *, reason: str) -> None:
        # No default: every path that ends an effect without its remote change names its closed reason (D-482).
        self.lease_holder, self.lease_expires_at = "", None
        self._lift_uncertain_hold()
        self.quarantine_reason, self.next_attempt_at = reason, None

    @transition(field=state, source=[EffectState.DISPATCHING, EffectState.UNCERTAIN], target=EffectState.PREPARED)
    def retry(self, *, not_before=None) -> None:
        self.lease_holder, self.lease_expires_at = "", None
        self._lift_uncertain_hold()
        self.next_attempt_at = not_before

    @transition(field=state, source=EffectState.REMOTE_CONFIRMED, target=EffectState.FINALIZED)
    def finalize(self) -> None:
        self.lease_holder, self.lease_expires_at = "", None

    def _lift_uncertain_hold(self) -> None:
        """Leaving `uncertain` ends a stopped automatic recovery's hold (UNCERTAIN_HOLDS, D-433); other holds stay."""
        if self.quarantine_reason in UNCERTAIN_HOLDS:
            self.quarantine_reason = ""


class RemoteEffectAttempt(models.Model):
    """Append-only evidence of one attempt: the frozen request and credential references, then (once) its
    outcome. Invariants: one per (effect, ordinal); the outcome columns are written at most once."""

    effect = models.ForeignKey(RemoteEffect, on_delete=models.PROTECT, related_name="attempts")
    ordinal = models.PositiveIntegerField()
    holder = models.ForeignKey(ProcessGeneration, on_delete=models.PROTECT, related_name="attempts")
    lease_fence = models.BigIntegerField()
    epoch = models.ForeignKey("connector.ServingEpoch", on_delete=models.PROTECT, related_name="+")
    credential_generation = models.ForeignKey("connector.CredentialGeneration", on_delete=models.PROTECT,
                                              related_name="+")
    request_digest = models.BinaryField(max_length=32)
    provider_idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    claimed_at = models.DateTimeField(auto_now_add=True)
    lease_expires_at = models.DateTimeField()
    outcome = models.CharField(max_length=32, choices=AttemptOutcome.choices, blank=True, default="")
    response_status = models.PositiveIntegerField(null=True, blank=True)
    response_digest = models.BinaryField(max_length=32, null=True, blank=True)
    evidence = models.TextField(blank=True, default="")
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["effect", "ordinal"]
        constraints = [models.UniqueConstraint(fields=["effect", "ordinal"], name="effects_attempt_ordinal")]

    def __str__(self) -> str:
        return f"attempt {self.ordinal} of effect #{self.effect_id} ({self.outcome or 'open'})"


class DispatchPermit(RoutedSaveMixin, ConcurrentTransitionMixin, models.Model):
    """One-shot authorization for the sole egress adapter to cross the provider-I/O boundary for one attempt.
    Invariants: at most one per attempt and one open per effect; open permits (granted, sending) form the gate's
    open-permit set; a permit never closes because time passed."""

    ROUTE_FIELDS = ("effect_id",)  # a permit's shard is its effect's (filled from it on Citus, D-244)

    attempt = models.OneToOneField(RemoteEffectAttempt, on_delete=models.PROTECT, related_name="permit")
    effect = models.ForeignKey(RemoteEffect, on_delete=models.PROTECT, related_name="permits")
    gate = models.ForeignKey("connector.AccountServingGate", on_delete=models.PROTECT, related_name="permits")
    gate_fence = models.BigIntegerField()
    credential_gate = models.ForeignKey("connector.CredentialGenerationDispatchGate", on_delete=models.PROTECT,
                                        related_name="permits")
    credential_gate_fence = models.BigIntegerField()
    holder = models.ForeignKey(ProcessGeneration, on_delete=models.PROTECT, related_name="permits")
    holder_fence = models.BigIntegerField()
    # The destination limiter that admitted this permit (null: the destination declares no limit).
    limiter = models.ForeignKey("effects.DestinationLimiter", on_delete=models.PROTECT, null=True, blank=True,
                                related_name="permits")
    state = FSMField(default=PermitState.GRANTED, choices=PermitState.choices, protected=True)
    io_may_have_started = models.BooleanField(default=False)
    granted_at = models.DateTimeField(auto_now_add=True)
    sending_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    abandonment_proof = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["effect"], condition=Q(state__in=["granted", "sending"]),
                                    name="effects_permit_one_open_per_effect",
                                    violation_error_code="permit_already_open"),
            models.CheckConstraint(condition=~Q(state="sending") | Q(io_may_have_started=True),
                                   name="effects_permit_sending_marks_io"),
        ]
        indexes = [models.Index(fields=["gate"], name="effects_permit_open_set",
                                condition=Q(state__in=["granted", "sending"])),
                   # A destination's in-flight count, taken under its limiter's row lock at every acquisition.
                   models.Index(fields=["limiter"], name="effects_permit_limiter_open",
                                condition=Q(state__in=["granted", "sending"], limiter__isnull=False)),
                   # The operator overview's current rate: a destination's permits of the last seconds.
                   models.Index(fields=["limiter", "granted_at"], name="effects_permit_limiter_rate",
                                condition=Q(limiter__isnull=False))]

    def __str__(self) -> str:
        return f"permit #{self.pk} ({self.state})"

    @transition(field=state, source=PermitState.GRANTED, target=PermitState.SENDING)
    def start_sending(self, *, at) -> None:
        self.io_may_have_started, self.sending_at = True, at

    @transition(field=state, source=PermitState.SENDING, target=PermitState.RETURNED)
    def settle(self, *, at) -> None:
        self.closed_at = at

    @transition(field=state, source=[PermitState.GRANTED, PermitState.SENDING], target=PermitState.ABANDONED)
    def abandon(self, *, at, proof: str) -> None:
        self.closed_at, self.abandonment_proof = at, proof


class RemoteLink(ConcurrentTransitionMixin, models.Model):
    """Links a local owner slot to a proven remote identity, scoped to the account. Invariants: one active link per
    (account, remote identity) and per (account, owner slot); conflicts fail closed."""

    account = models.ForeignKey("connector.ConnectorAccount", on_delete=models.PROTECT, related_name="remote_links")
    owner_slot = models.CharField(max_length=255)
    remote_identity = models.CharField(max_length=255)
    effect = models.ForeignKey(RemoteEffect, on_delete=models.PROTECT, related_name="links")
    state = FSMField(default=LinkState.ACTIVE, choices=LinkState.choices, protected=True)
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["account", "remote_identity"], condition=Q(state="active"),
                                    name="effects_link_one_active_per_remote"),
            models.UniqueConstraint(fields=["account", "owner_slot"], condition=Q(state="active"),
                                    name="effects_link_one_active_per_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.owner_slot} -> {self.remote_identity} ({self.state})"

    @transition(field=state, source=LinkState.ACTIVE, target=LinkState.RETIRED)
    def retire(self, *, at) -> None:
        self.retired_at = at


class RemoteLinkResolution(models.Model):
    """Append-only: an operator's resolution of a RemoteLink conflict (an effect `remote_confirmed` with
    REMOTE_LINK_CONFLICT), with the authoritative evidence it rests on (CV2-13-002). `keep_link`: the existing link
    stays the identity authority and the effect finalizes without a new link. `relink`: the remote identity
    changed at the provider; the conflicting links are retired and the slot is linked to the proven identity,
    only with an approved dual approval of exactly that change. Invariants: one per effect; `relink` names its
    approval and the new link; never updated."""

    effect = models.OneToOneField(RemoteEffect, on_delete=models.PROTECT, related_name="link_resolution")
    decision = models.CharField(max_length=16, choices=[("keep_link", "keep_link"), ("relink", "relink")])
    owner_slot = models.CharField(max_length=255)
    proven_identity = models.CharField(max_length=255)
    kept_link = models.ForeignKey(RemoteLink, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    new_link = models.ForeignKey(RemoteLink, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    retired_links = models.JSONField(default=list)
    approval = models.ForeignKey("connector.DualApprovalRequest", on_delete=models.PROTECT, null=True, blank=True,
                                 related_name="+")
    evidence = models.TextField()
    decided_by = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.CheckConstraint(condition=Q(decision__in=["keep_link", "relink"]),
                                   name="effects_linkresolution_decision"),
            models.CheckConstraint(condition=Q(decision="keep_link") | Q(approval__isnull=False,
                                                                        new_link__isnull=False),
                                   name="effects_linkresolution_relink_is_approved"),
            models.CheckConstraint(condition=~Q(evidence=""), name="effects_linkresolution_has_evidence"),
        ]

    def __str__(self) -> str:
        return f"{self.decision} for effect #{self.effect_id}"
