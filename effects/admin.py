"""Outbound chain admin: command → effect → attempts → permits → links, read-only; operator actions (terminate a
holder generation, abandon a permit with proof, reconcile an uncertain effect) go through the services."""
from __future__ import annotations

from django.contrib import admin

from connector import statetokens
from connector.kernel.admin import (EMPTY, FactAdmin, FactInline, admin_link, badge, digest_col, json_col,
                                    step_failures_col)
from effects.models import (
    DestinationLimiter,
    CommandTrace,
    DispatchPermit,
    OutboundCommand,
    ProcessGeneration,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteLink,
    RemoteLinkResolution,
    RemoteCallIntent,
    ReplayEffectCorrelation,
)
from effects import selectors
from effects.services import dispatch


class AttemptInline(FactInline):
    model = RemoteEffectAttempt
    fields = ("ordinal", "holder", "lease_fence", "outcome", "response_status", "evidence", "claimed_at",
              "settled_at")


class PermitInline(FactInline):
    model = DispatchPermit
    fields = ("permit_link", "state_badge", "io_may_have_started", "holder", "credential_gate_fence", "granted_at",
              "sending_at", "closed_at")
    permit_link = admin.display(description="permit")(lambda self, o: admin_link(o, f"#{o.pk}"))
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))


class CommandTraceInline(FactInline):
    """The W3C trace context of the Runtime span that authored the command (issue 21, D-225)."""

    model = CommandTrace
    fields = ("traceparent", "tracestate")
    verbose_name = verbose_name_plural = "trace context"


@admin.register(OutboundCommand)
class OutboundCommandAdmin(FactAdmin):
    fact_description = ("Runtime's immutable outbox intent with its complete FrozenDispatchBinding; one per logical "
                        "effect (scope, EffectRoot, EffectSlot, EffectGeneration). No secret bytes: only the exact "
                        "credential generation.")
    list_display = ("id", "account", "effect_root_id", "effect_slot_id", "effect_generation_id", "method", "path",
                    "source_execution", "created_at")
    search_fields = ("effect_root_id", "path")
    list_select_related = ("account", "source_execution")
    inlines = [CommandTraceInline]
    fieldsets = ((None, {"fields": ("account", "application_scope", "effect_root_id", "effect_slot_id",
                                    "effect_generation_id", "key", "effect_link", "source_execution_link")}),
                 ("Frozen dispatch binding", {"fields": (
                     "epoch", "epoch_digest_hex", "gate_fence", "profile_id", "pack_generation", "effect_definition",
                     "effect_version", "policy", "configuration", "credential_generation", "method", "path",
                     "body_json", "request", "provider_idempotency_key", "max_attempts", "predecessor",
                     "binding")}))
    key = digest_col("idempotency_key", "idempotency key")
    epoch_digest_hex = digest_col("epoch_digest", "epoch digest")
    policy = digest_col("route_policy_digest", "route/policy digest")
    request = digest_col("request_digest", "request digest")
    binding = digest_col("binding_digest", "binding digest")
    body_json = json_col("request_body", "request body")
    effect_link = admin.display(description="remote effect")(lambda self, o: admin_link(getattr(o, "effect", None)))

    @admin.display(description="source execution")
    def source_execution_link(self, obj):
        """The Execution whose Runtime transaction authored this command."""
        execution = obj.source_execution
        return admin_link(execution, f"Execution #{execution.pk} ({execution.command_id})" if execution else None)


@admin.register(RemoteEffect)
class RemoteEffectAdmin(FactAdmin):
    fact_description = ("The sole lifecycle authority of one logical external side effect. Uncertain effects are "
                        "repeated by the product only under their callout's frozen idempotency contract (D-430); "
                        "the others wait for an operator's reconciliation with evidence; nothing is retried "
                        "blindly.")
    list_display = ("id", "account", "state_badge", "attempt_count", "lease_holder", "remote_id",
                    "quarantine_reason", "changed_at")
    list_filter = ("state", "account")
    search_fields = ("remote_id", "command__effect_root_id")
    list_select_related = ("account",)
    inlines = [AttemptInline, PermitInline]
    actions = ["reconcile_no_effect", "reconcile_idempotent_repeat", "reconcile_quarantine"]
    fieldsets = ((None, {"fields": ("account", "command_link", "state_badge", "attempt_count", "lease_holder",
                                    "lease_fence", "lease_expires_at", "remote_id", "quarantine_reason",
                                    "digest", "links", "step_failures_col")}),)
    step_failures_col = step_failures_col
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))
    digest = digest_col("logical_effect_digest", "logical effect digest")
    command_link = admin.display(description="command")(lambda self, o: admin_link(o.command))
    links = admin.display(description="remote links")(
        lambda self, o: ", ".join(f"{x.owner_slot} -> {x.remote_identity} ({x.state})" for x in o.links.all()) or EMPTY)

    def _reconcile(self, request, queryset, decision: str, title: str):
        """The governance screen's decision, through the same service and the same state token (the effect's
        `changed_at` as the confirmation page showed it): an effect that moved since is refused."""
        def apply(request, obj, fence, reason, token):
            actor = self.require(request, "effects.change_remoteeffect")
            effect = dispatch.effect_reconcile(effect_pk=obj.pk, decision=decision, evidence=reason, actor=actor,
                                               expected_changed_at=token)
            return f"effect #{obj.pk}: {decision} -> {effect.state}"
        return self.confirm_or_apply(request, queryset, action=f"reconcile_{decision}", title=title, apply=apply,
                                     reason_required=True, state_attr="state",
                                     token=(lambda effect: effect.changed_at.isoformat(), statetokens.timestamp))

    @admin.action(description="Reconcile uncertain: proven no effect (evidence required)")
    def reconcile_no_effect(self, request, queryset):
        return self._reconcile(request, queryset, "no_effect", "Record proof of no remote effect")

    @admin.action(description="Reconcile uncertain: exact idempotent repeat (same request and provider key)")
    def reconcile_idempotent_repeat(self, request, queryset):
        return self._reconcile(request, queryset, "idempotent_repeat", "Allow an exact idempotent repeat")

    @admin.action(description="Reconcile uncertain: quarantine")
    def reconcile_quarantine(self, request, queryset):
        return self._reconcile(request, queryset, "quarantine", "Quarantine the effect")


@admin.register(DispatchPermit)
class DispatchPermitAdmin(FactAdmin):
    fact_description = ("One-shot authorization to cross the provider boundary once. Open permits (granted, sending) "
                        "keep the account gate out of v2_halted; a permit never closes because time passed.")
    list_display = ("id", "effect", "state_badge", "io_may_have_started", "holder", "gate", "credential_gate_fence",
                    "granted_at", "closed_at")
    list_filter = ("state",)
    list_select_related = ("effect", "holder", "gate")
    actions = ["abandon_with_proof"]
    fieldsets = ((None, {"fields": ("effect", "attempt", "state_badge", "io_may_have_started", "holder",
                                    "holder_fence", "gate", "gate_fence", "credential_gate", "credential_gate_fence",
                                    "granted_at", "sending_at", "closed_at", "abandonment_proof")}),)
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))

    @admin.action(description="Abandon (needs a terminated holder, or a revocation that fenced the permit out)")
    def abandon_with_proof(self, request, queryset):
        def apply(request, obj, fence, reason):
            actor = self.require(request, "effects.change_dispatchpermit")
            effect = dispatch.permit_abandon(permit_pk=obj.pk, actor=actor)
            return f"permit #{obj.pk} abandoned; effect #{effect.pk} is {effect.state}"
        return self.confirm_or_apply(request, queryset, action="abandon_with_proof", title="Abandon permits",
                                     apply=apply, state_attr="state")


@admin.register(ProcessGeneration)
class ProcessGenerationAdmin(FactAdmin):
    fact_description = ("Worker process generations that may hold permits. Terminating one is durable proof that "
                        "its egress is revoked: the adapter refuses its sends, and only then may its permits close.")
    list_display = ("holder_id", "state_badge", "started_at", "heartbeat_at", "terminated_at", "terminated_by")
    list_filter = ("state",)
    search_fields = ("holder_id",)
    actions = ["terminate"]
    fieldsets = ((None, {"fields": ("holder_id", "state_badge", "started_at", "heartbeat_at", "terminated_at",
                                    "terminated_by", "termination_evidence")}),)
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))

    @admin.action(description="Mark terminated and egress revoked (evidence required)")
    def terminate(self, request, queryset):
        def apply(request, obj, fence, reason):
            actor = self.require(request, "effects.change_processgeneration")
            dispatch.holder_terminate(holder_id=obj.holder_id, evidence=reason, actor=actor)
            return f"{obj.holder_id} terminated"
        return self.confirm_or_apply(request, queryset, action="terminate", title="Terminate holder generations",
                                     apply=apply, reason_required=True, state_attr="state")


@admin.register(RemoteLink)
class RemoteLinkAdmin(FactAdmin):
    fact_description = "Links a local owner slot to a proven remote identity; one active link per identity and slot."
    list_display = ("owner_slot", "remote_identity", "account", "state_badge", "effect", "created_at")
    list_filter = ("state",)
    search_fields = ("owner_slot", "remote_identity")
    fieldsets = ((None, {"fields": ("account", "owner_slot", "remote_identity", "effect", "state_badge",
                                    "created_at", "retired_at")}),)
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))


@admin.register(RemoteLinkResolution)
class RemoteLinkResolutionAdmin(FactAdmin):
    fact_description = "Append-only resolution of a RemoteLink conflict with its evidence: keep_link, or relink " \
                       "(with its dual approval)."
    list_display = ("effect", "decision", "owner_slot", "proven_identity", "decided_by", "created_at")
    list_filter = ("decision",)
    search_fields = ("owner_slot", "proven_identity")
    fieldsets = ((None, {"fields": ("effect", "decision", "owner_slot", "proven_identity", "kept_link", "new_link",
                                    "retired_links", "approval", "evidence", "decided_by", "created_at")}),)


@admin.register(RemoteCallIntent)
class RemoteCallIntentAdmin(FactAdmin):
    fact_description = ("Append-only: an operator-authorized intentional new remote call for an EffectRoot and slot, "
                        "with every predecessor effect its admission reconciled and its disposition: resumed (an "
                        "open effect continues; nothing new) or successor (a new generation after proven no_effect). "
                        "A rejected or blocked intent is not recorded (D-305).")
    list_display = ("intent_id", "account", "effect_root_id", "effect_slot_id", "disposition", "principal",
                    "created_at")
    list_filter = ("disposition",)
    search_fields = ("intent_id", "effect_root_id")
    fieldsets = ((None, {"fields": ("account", "intent_id", "application_scope", "effect_root_id", "effect_slot_id",
                                    "principal", "reason", "epoch", "gate_fence", "disposition", "reconciled",
                                    "resumed_effect", "predecessor_effect", "successor_command", "created_at")}),)


@admin.register(ReplayEffectCorrelation)
class ReplayEffectCorrelationAdmin(FactAdmin):
    fact_description = ("Append-only: a replay's correlation with an EffectRoot its predecessor event authored. The "
                        "replay itself authored no command and minted no EffectGenerationID (D-309).")
    list_display = ("replay_request", "effect_root_id", "effect_slot_id", "predecessor_generation_id",
                    "predecessor_command", "created_at")
    search_fields = ("effect_root_id",)
    fieldsets = ((None, {"fields": ("replay_request", "predecessor_command", "application_scope", "effect_root_id",
                                    "effect_slot_id", "predecessor_generation_id", "created_at")}),)


from effects import admin_delivery  # noqa: E402,F401  (registers the delivery facts)


@admin.register(DestinationLimiter)
class DestinationLimiterAdmin(FactAdmin):
    fact_description = ("One destination (account, callout) that declares a rate and concurrency limit: the shared "
                        "state every egress process admits permits through (D-222), and the receiver's "
                        "Retry-After deferrals (D-223). The limit itself is frozen on each command.")
    list_display = ("id", "account", "callout", "declared_limit", "current_rate", "in_flight", "deferrals_total",
                    "deferred_until", "refused_total", "granted_total")
    list_select_related = ("account",)
    search_fields = ("callout",)
    fieldsets = ((None, {"fields": ("account", "callout", "declared_limit", "current_rate", "in_flight",
                                    "tokens", "refilled_at", "not_before", "deferred_until", "deferrals_total",
                                    "last_deferral_status", "refused_total", "granted_total", "updated_at")}),)

    @admin.display(description="declared limit")
    def declared_limit(self, obj):
        return selectors.destination_limiter_overview(obj)["limit"]

    @admin.display(description="current rate")
    def current_rate(self, obj):
        return selectors.destination_limiter_overview(obj)["rate"]

    @admin.display(description="in flight")
    def in_flight(self, obj):
        return selectors.destination_limiter_overview(obj)["in_flight"]
