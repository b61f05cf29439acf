"""Registrations of the serving facts with operator transitions: serving epochs, account serving gates and
credential generation dispatch gates (each transition through its service, fenced)."""
from __future__ import annotations

from django.contrib import admin, messages
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from connector import hooks
from connector.actors import Actor
from connector.choices import (
    CREDENTIAL_GATE_TRANSITIONS,
    EPOCH_TRANSITIONS,
    GATE_TRANSITIONS,
    EpochState,
    GateMode,
)
from connector.errors import TransitionRefused
from connector.kernel.admin import as_bytes, transition_message
from connector.models import AccountServingGate, CredentialGenerationDispatchGate, ServingEpoch
from connector.services import gates as gate_services
from connector.services import serving as serving_services
from connector.admin.base import *  # noqa: F401,F403


@admin.register(ServingEpoch)
class ServingEpochAdmin(TransitionViewMixin, FactAdmin):
    fact_description = ("One exact serving generation, prepared from fresh owner reads and verified, activated or "
                        "rejected, and retired, only by connector.services.serving. Its preimage and digest and every "
                        "proof row "
                        "are immutable; only the state columns change.")
    list_display = ("epoch_id", "state_badge", "short_digest", "profile_id", "configuration", "catalog_view",
                    "rejection_code", "state_changed_at")
    list_filter = ("state", "profile_id", "rejection_code")
    search_fields = ("epoch_id", "rejection_code", "configuration__generation_id", "catalog_view__view_key")
    list_select_related = ("configuration", "catalog_view")
    date_hierarchy = "created_at"
    inlines = (ServingEpochBindingProofInline, ServingEpochCredentialProofInline)
    actions = ("verify_epochs", "activate_epochs", "reject_epochs", "retire_epochs")
    fieldsets = (
        (None, {"fields": ("epoch_id", "profile_id", "state_badge", "state_changed_at", "created_at")}),
        ("Rejection", {"fields": ("rejection_code", "rejection_detail")}),
        ("Transitions", {"fields": ("available_transitions", "diagram")}),
        ("Digests", {"fields": ("digest_hex", "serving_scope_hex")}),
        ("Owners", {"fields": ("catalog_view", "configuration", "configuration_receipt_digest_hex",
                               "configuration_receipt_tree")}),
        ("Gates naming this epoch", {"fields": ("gates",)}),
        ("Audit trail", {"fields": ("audit",)}),
        ("Preimage", {"fields": ("preimage_tree", "preimage_hex")}),
    )

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        return badge(obj.state)

    @admin.display(description="digest")
    def short_digest(self, obj):
        return hex_short(obj.digest)

    @admin.display(description="allowed next transitions")
    def available_transitions(self, obj):
        names = [f"{t.name} → {t.target}" + ("" if t.name in EPOCH_OPERATOR_TRANSITIONS else " (coordinator only)")
                 for t in obj.get_available_state_transitions()]
        return ", ".join(names) or "none"

    @admin.display(description="state machine")
    def diagram(self, obj):
        return state_diagram(obj.state, EPOCH_TRANSITIONS)

    @admin.display(description="gates")
    def gates(self, obj):
        rows = obj.gates.select_related("account").order_by("account_id")
        return format_html_join(mark_safe("<br>"), "{} {} fence {}",
                                ((admin_link(g, g.account.account_key), badge(g.mode), g.fence) for g in rows)) or EMPTY

    @admin.display(description="audit trail (newest first)")
    def audit(self, obj):
        return audit_trail(ServingEpoch._meta.label, obj.pk)

    digest_hex = digest_col("digest")
    serving_scope_hex = digest_col("serving_scope_digest", "serving scope digest")
    configuration_receipt_digest_hex = digest_col("configuration_receipt_digest", "configuration receipt digest")
    configuration_receipt_tree = tree_col("configuration_receipt", "configuration receipt (decoded)")
    preimage_tree = tree_col("preimage", "preimage (decoded)")
    preimage_hex = block_col("preimage")

    # -- operations -------------------------------------------------------------------------------------------

    def _verify(self, request, epoch):
        after = serving_services.epoch_verify(epoch_pk=epoch.pk, actor=self.require(request, PERM_EPOCH_VERIFY))
        return self._outcome(epoch.state, after, "verify")

    def _activate(self, request, epoch):
        after = serving_services.epoch_activate_first(epoch_pk=epoch.pk,
                                                      actor=self.require(request, PERM_EPOCH_ACTIVATE))
        return self._outcome(epoch.state, after, "activate_first")

    def _reject(self, request, epoch, reason):
        after = serving_services.epoch_reject(epoch_pk=epoch.pk, reason=reason,
                                              actor=self.require(request, PERM_EPOCH_REJECT))
        return self._outcome(epoch.state, after, "reject")

    def _retire(self, request, epoch, reason):
        after = serving_services.epoch_retire(epoch_pk=epoch.pk, reason=reason, expected_digest=bytes(epoch.digest),
                                              actor=self.require(request, PERM_EPOCH_RETIRE))
        return self._outcome(epoch.state, after, "retire")

    @staticmethod
    def _outcome(before: str, after: ServingEpoch, action: str):
        """A verification or activation that ends in `rejected` succeeded as a call but is reported as a warning
        with the reason code the service recorded."""
        message = transition_message(f"epoch {after.epoch_id}", action, before, after, state_attr="state")
        if after.state == EpochState.REJECTED and action != "reject":
            return f"{message} ({after.rejection_code}: {after.rejection_detail})", messages.WARNING
        return message

    @admin.action(description="Verify (fresh owner reads)")
    def verify_epochs(self, request, queryset):
        for epoch in queryset.order_by("pk"):
            self.report(request, lambda e=epoch: self._verify(request, e), about=epoch.epoch_id)

    @admin.action(description="Activate (first activation)")
    def activate_epochs(self, request, queryset):
        for epoch in queryset.order_by("pk"):
            self.report(request, lambda e=epoch: self._activate(request, e), about=epoch.epoch_id)

    @admin.action(description="Reject (operator decision)")
    def reject_epochs(self, request, queryset):
        return self.confirm_or_apply(
            request, queryset, action="reject_epochs", title="Reject serving epochs", state_attr="state",
            label=lambda epoch: f"epoch {epoch.epoch_id}",
            reason_required=True, warning="A rejected epoch never serves; prepare a new candidate to retry.",
            apply=lambda req, epoch, fence, reason: self._reject(req, epoch, reason))

    @admin.action(description="Retire (every fact terminal; reason required)")
    def retire_epochs(self, request, queryset):
        return self.confirm_or_apply(
            request, queryset, action="retire_epochs", title="Retire draining serving epochs", state_attr="state",
            label=lambda epoch: f"epoch {epoch.epoch_id}", reason_required=True,
            warning="Refused (EPOCH_RETENTION_UNMET, naming the open work) until every fact naming the epoch is "
                    "terminal; retiring deletes nothing.",
            apply=lambda req, epoch, fence, reason: self._retire(req, epoch, reason))

    def transition_panel(self, request, obj):
        buttons = [
            {"name": "verify", "label": "Verify (fresh owner reads)", "enabled": obj.state == EpochState.PREPARED},
            {"name": "activate_first", "label": "Activate (first activation)",
             "enabled": obj.state == EpochState.VERIFIED},
            {"name": "reject", "label": "Reject (operator decision; reason required)",
             "enabled": obj.state in (EpochState.PREPARED, EpochState.VERIFIED), "danger": True},
            {"name": "retire", "label": "Retire (every fact terminal; reason required)",
             "enabled": obj.state == EpochState.DRAINING},
        ]
        return self.panel(obj, buttons=buttons, fence=None, reason_hint="required to reject or retire",
                          notes=[f"Current state: {obj.state}."])

    def perform_transition(self, request, obj, name, data, reason):
        if name == "verify":
            return self._verify(request, obj)
        if name == "activate_first":
            return self._activate(request, obj)
        if name == "reject":
            return self._reject(request, obj, reason)
        if name == "retire":
            return self._retire(request, obj, reason)
        raise TransitionRefused(f"{name!r} is not an epoch operation")


def _gate_action(name: str):
    def action(modeladmin, request, queryset):
        return modeladmin.confirm_or_apply(
            request, queryset.select_related("account"), action=f"gate_{name}", title=f"Gate transition: {name}",
            fenced=True, label=lambda gate: f"gate {gate.account}",
            apply=lambda req, gate, fence, reason: modeladmin._transition(req, gate, name, fence, reason))
    action.__name__ = f"gate_{name}"
    return admin.action(description=f"Gate: {name}")(action)


@admin.register(AccountServingGate)
class AccountServingGateAdmin(TransitionViewMixin, FactAdmin):
    fact_description = ("The one fenced per-account serving gate. Its mode changes only through "
                        "connector.services.gates.gate_transition (and the activation transactions), and every "
                        "transition advances the fence by exactly one (CV2-03-013). An action taken on a page that "
                        "shows an older fence is refused with FENCE_STALE.")
    list_display = ("account", "mode_badge", "fence", "epoch_col", "changed_at")
    list_filter = ("mode",)
    search_fields = ("account__account_key", "account__display_name", "epoch__epoch_id")
    list_select_related = ("account", "epoch")
    actions = tuple(_gate_action(name) for name in gate_services.GATE_ACTIONS)
    fieldsets = (
        (None, {"fields": ("account", "mode_badge", "fence", "changed_at")}),
        ("Epoch", {"fields": ("epoch_col", "epoch_digest_hex", "epoch_digest_check")}),
        ("Transitions", {"fields": ("available_transitions", "blockers", "diagram")}),
        ("Audit trail", {"fields": ("audit",)}),
    )

    @admin.display(description="mode", ordering="mode")
    def mode_badge(self, obj):
        return badge(obj.mode)

    @admin.display(description="epoch")
    def epoch_col(self, obj):
        return epoch_ref(obj.epoch, obj.epoch_digest)

    epoch_digest_hex = digest_col("epoch_digest", "epoch digest (as the gate names it)")

    @admin.display(description="matches the epoch's digest")
    def epoch_digest_check(self, obj):
        if obj.epoch is None:
            return EMPTY
        same = bytes(obj.epoch.digest) == as_bytes(obj.epoch_digest)
        return format_html('<span class="cv2-badge cv2-tone-{}">{}</span>', "ok" if same else "bad",
                           "yes" if same else "MISMATCH")

    @admin.display(description="allowed next transitions")
    def available_transitions(self, obj):
        names = [t.name for t in obj.get_available_mode_transitions()]
        return format_html_join(", ", "<code>{}</code>{}", (
            (n, "" if n in gate_services.GATE_ACTIONS else " (coordinator only)") for n in names)) or "none"

    @admin.display(description="blockers")
    def blockers(self, obj):
        found = self._blockers(obj)
        if not found:
            return format_html('<span class="cv2-muted">{}</span>', "none")
        return format_html("<ul>{}</ul>", format_html_join("", "<li><code>{}</code>: {}</li>", found))

    @staticmethod
    def _blockers(gate) -> list[tuple[str, str]]:
        found = []
        if gate.mode == GateMode.HALTING_V2:
            found += [("confirm_halted", reason) for reason in hooks.halt_blockers(gate)]
        if gate.mode == GateMode.V2_HALTED:
            found += [("resume_predecessor", reason) for reason in hooks.resume_blockers(gate)]
        return found

    @admin.display(description="state machine")
    def diagram(self, obj):
        return state_diagram(obj.mode, GATE_TRANSITIONS)

    @admin.display(description="audit trail (newest first)")
    def audit(self, obj):
        return audit_trail(AccountServingGate._meta.label, obj.pk)

    # -- operations -------------------------------------------------------------------------------------------

    def _transition(self, request, gate, action: str, fence: int, reason: str):
        actor = self.require(request, PERM_GATE_OPERATE)
        before = gate.mode
        after = gate_services.gate_transition(account_id=gate.account_id, action=action, expected_fence=fence,
                                              actor=actor, reason=reason)
        return transition_message(f"gate {gate.account}", action, before, after)

    def transition_panel(self, request, obj):
        available = {t.name for t in obj.get_available_mode_transitions()}
        blocked = dict(self._blockers(obj))
        order = [target for source, target in GATE_TRANSITIONS if source == obj.mode]
        outgoing = sorted((t for t in obj.get_all_mode_transitions() if t.source == obj.mode),
                          key=lambda t: (order.index(t.target) if t.target in order else len(order),
                                         t.name not in gate_services.GATE_ACTIONS, t.name))
        buttons = []
        for t in outgoing:
            operable = t.name in gate_services.GATE_ACTIONS
            note = ("coordinator only: the activation transaction binds the epoch" if not operable
                    else f"blocked: {blocked[t.name]}" if t.name in blocked
                    else "" if t.name in available else "guard not met")
            buttons.append({"name": t.name, "label": f"{t.name} → {t.target}",
                            "enabled": operable and t.name in available, "note": note})
        return self.panel(obj, buttons=buttons, fence=obj.fence, reason_hint="recorded in the audit trail",
                          notes=[f"This page shows fence {obj.fence}; the service refuses the transition if the "
                                 "gate has moved since (FENCE_STALE)."])

    def perform_transition(self, request, obj, name, data, reason):
        return self._transition(request, obj, name, posted_fence(data.get("expected_fence")), reason)


def _credential_gate_label(gate) -> str:
    return f"credential gate {gate.credential_generation.generation_id}"


@admin.register(CredentialGenerationDispatchGate)
class CredentialGenerationDispatchGateAdmin(TransitionViewMixin, FactAdmin):
    fact_description = ("Dispatch eligibility of one exact credential generation, created with it. Revocation and "
                        "explicit re-enablement go through connector.services.gates.credential_gate_transition, "
                        "need the revoke/re-enable permission, advance the fence and never touch the generation "
                        "itself (CV2-04-004).")
    list_display = ("credential_generation", "account", "mode_badge", "fence", "changed_at")
    list_filter = ("mode", "credential_generation__credential_identity")
    search_fields = ("credential_generation__generation_id", "credential_generation__account__account_key")
    list_select_related = ("credential_generation", "credential_generation__account")
    actions = ("revoke_gates", "reenable_gates")
    fieldsets = (
        (None, {"fields": ("credential_generation", "account", "mode_badge", "fence", "changed_at")}),
        ("Transitions", {"fields": ("available_transitions", "diagram")}),
        ("Audit trail", {"fields": ("audit",)}),
    )

    @admin.display(description="account", ordering="credential_generation__account__account_key")
    def account(self, obj):
        return obj.credential_generation.account

    @admin.display(description="mode", ordering="mode")
    def mode_badge(self, obj):
        return badge(obj.mode)

    @admin.display(description="allowed next transitions")
    def available_transitions(self, obj):
        return ", ".join(f"{t.name} → {t.target}" for t in obj.get_available_mode_transitions()) or "none"

    @admin.display(description="state machine")
    def diagram(self, obj):
        return state_diagram(obj.mode, CREDENTIAL_GATE_TRANSITIONS)

    @admin.display(description="audit trail (newest first)")
    def audit(self, obj):
        return audit_trail(CredentialGenerationDispatchGate._meta.label, obj.pk)

    def _transition(self, request, gate, action: str, fence: int, reason: str):
        before = gate.mode
        after = gate_services.credential_gate_transition(
            generation_id=gate.credential_generation.generation_id, action=action, expected_fence=fence,
            actor=Actor.for_user(request.user), reason=reason)
        return transition_message(f"credential gate {gate.credential_generation.generation_id}", action, before,
                                   after)

    @admin.action(description="Revoke dispatch")
    def revoke_gates(self, request, queryset):
        return self.confirm_or_apply(
            request, queryset.select_related("credential_generation"), action="revoke_gates",
            title="Revoke credential generation dispatch", fenced=True, label=_credential_gate_label,
            warning="Revocation blocks every later permit of these generations.",
            apply=lambda req, gate, fence, reason: self._transition(req, gate, "revoke", fence, reason))

    @admin.action(description="Re-enable dispatch (reason required)")
    def reenable_gates(self, request, queryset):
        return self.confirm_or_apply(
            request, queryset.select_related("credential_generation"), action="reenable_gates",
            title="Re-enable credential generation dispatch", fenced=True, reason_required=True,
            label=_credential_gate_label,
            warning="Re-enablement is an explicit, authorized decision recorded with its reason.",
            apply=lambda req, gate, fence, reason: self._transition(req, gate, "reenable", fence, reason))

    def transition_panel(self, request, obj):
        available = {t.name for t in obj.get_available_mode_transitions()}
        buttons = [{"name": "revoke", "label": "revoke → revoked", "enabled": "revoke" in available,
                    "danger": True},
                   {"name": "reenable", "label": "reenable → enabled (reason required)",
                    "enabled": "reenable" in available}]
        return self.panel(obj, buttons=buttons, fence=obj.fence, reason_hint="required to re-enable",
                          notes=[f"This page shows fence {obj.fence}."])

    def perform_transition(self, request, obj, name, data, reason):
        return self._transition(request, obj, name, posted_fence(data.get("expected_fence")), reason)
