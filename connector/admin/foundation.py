"""Registrations of the foundation facts: owners, epochs, gates, credential gates, audit."""
from __future__ import annotations


from django.apps import apps
from django.contrib import admin, messages
from django.db.models import Count, OuterRef, Subquery
from django.urls import NoReverseMatch, reverse
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
from connector.models import (
    AccountServingGate,
    AuditRecord,
    BindingDefinition,
    ConnectorAccount,
    CredentialGeneration,
    CredentialGenerationDispatchGate,
    IntegrationBindingView,
    PackGeneration,
    ServiceConfigurationGeneration,
    ServingEpoch,
)
from connector.services import gates as gate_services
from connector.services import serving as serving_services

from connector.admin.base import *  # noqa: F401,F403
from connector.admin.base import _bytes, _transition_message  # noqa: F401

@admin.register(ConnectorAccount)
class ConnectorAccountAdmin(FactAdmin):
    fact_description = ("A connector account (tenant-side integration account). Created with its serving gate "
                        "by connector.services.owners.account_create; the account key is canonical and unique.")
    list_display = ("account_key", "display_name", "provider_scope", "gate_mode", "gate_fence", "gate_epoch",
                    "created_at")
    list_filter = ("provider_scope", "serving_gate__mode")
    search_fields = ("account_key", "display_name", "provider_scope")
    list_select_related = ("serving_gate", "serving_gate__epoch")
    fieldsets = (
        (None, {"fields": ("account_key", "display_name", "provider_scope", "created_at")}),
        ("Serving gate", {"fields": ("gate_link", "gate_mode", "gate_fence", "gate_epoch")}),
        ("Credential generations", {"fields": ("credential_generations",)}),
    )

    @admin.display(description="gate mode", ordering="serving_gate__mode")
    def gate_mode(self, obj):
        gate = getattr(obj, "serving_gate", None)
        return badge(gate.mode) if gate else EMPTY

    @admin.display(description="fence", ordering="serving_gate__fence")
    def gate_fence(self, obj):
        gate = getattr(obj, "serving_gate", None)
        return gate.fence if gate else EMPTY

    @admin.display(description="epoch")
    def gate_epoch(self, obj):
        gate = getattr(obj, "serving_gate", None)
        return epoch_ref(gate.epoch, gate.epoch_digest) if gate else EMPTY

    @admin.display(description="gate")
    def gate_link(self, obj):
        return admin_link(getattr(obj, "serving_gate", None))

    @admin.display(description="generations (dispatch gate mode)")
    def credential_generations(self, obj):
        rows = obj.credential_generations.select_related("dispatch_gate").order_by("generation_id")
        return format_html_join(mark_safe("<br>"), "{} {}", (
            (admin_link(g, g.generation_id), badge(getattr(getattr(g, "dispatch_gate", None), "mode", None)))
            for g in rows)) or EMPTY


@admin.register(PackGeneration)
class PackGenerationAdmin(FactAdmin):
    fact_description = ("One immutable installed generation of an L1 pack, owned by the binding-definition owner "
                        "(connector.services.owners.pack_generation_install). Never updated; the payload digest is "
                        "over the exact stored payload bytes.")
    list_display = ("generation_id", "owner_pack", "pack_installation_id", "definition_envelope_version",
                    "definition_receipt_version", "definition_count", "payload_digest_hex", "receipt_preview",
                    "installed_at")
    list_filter = ("owner_pack", "definition_envelope_version", "definition_receipt_version")
    search_fields = ("generation_id", "owner_pack", "pack_installation_id")
    date_hierarchy = "installed_at"
    inlines = (BindingDefinitionInline,)
    fieldsets = (
        (None, {"fields": ("generation_id", "owner_pack", "pack_installation_id", "definition_envelope_version",
                           "definition_receipt_version", "installed_at")}),
        ("Digests", {"fields": ("payload_digest_hex", "receipt_digest_hex")}),
        ("Receipt", {"fields": ("receipt_tree", "receipt_hex")}),
        ("Payload", {"fields": ("payload_json", "payload_hex"), "classes": ("collapse",)}),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_definitions=Count("definitions"))

    @admin.display(description="definitions", ordering="_definitions")
    def definition_count(self, obj):
        return obj._definitions

    payload_digest_hex = digest_col("payload_digest")
    receipt_digest_hex = digest_col("receipt_digest")
    receipt_preview = preview_col("receipt")
    receipt_tree = tree_col("receipt")
    receipt_hex = block_col("receipt")
    payload_json = json_col("payload")
    payload_hex = block_col("payload")


@admin.register(BindingDefinition)
class BindingDefinitionAdmin(FactAdmin):
    fact_description = ("The exact definition payload of one binding kind inside one pack generation, read only "
                        "through the kind-specific owner reader. Immutable; written with its pack generation.")
    list_display = ("__str__", "kind_code", "business_key", "definition_version", "pack_generation", "digest",
                    "receipt_preview")
    list_filter = ("kind", "pack_generation__owner_pack")
    search_fields = ("business_key", "pack_generation__generation_id", "pack_generation__owner_pack")
    list_select_related = ("pack_generation",)
    fieldsets = (
        (None, {"fields": ("pack_generation", "kind_code", "business_key", "definition_version")}),
        ("Digests", {"fields": ("digest", "receipt_digest_hex")}),
        ("Definition", {"fields": ("definition_json", "definition_hex")}),
        ("Receipt", {"fields": ("receipt_tree", "receipt_hex")}),
    )

    kind_code = code_col("kind", ordering="kind")
    digest = digest_col("canonical_definition_digest", "canonical definition digest")
    receipt_digest_hex = digest_col("receipt_digest")
    receipt_preview = preview_col("receipt")
    receipt_tree = tree_col("receipt")
    receipt_hex = block_col("receipt")
    definition_json = json_col("definition")
    definition_hex = block_col("definition")


@admin.register(IntegrationBindingView)
class IntegrationBindingViewAdmin(FactAdmin):
    fact_description = ("One immutable revision of a Catalog IntegrationBindingView, published by the Catalog owner "
                        "(connector.services.owners.catalog_view_publish). Its bindings are authorization and "
                        "identity only, never definition proof (CV2-02-009). The current view of a lineage is its "
                        "highest revision.")
    list_display = ("view_key", "revision", "is_current", "organization", "application_installation",
                    "security_epoch", "binding_count", "view_digest_hex", "receipt_preview", "published_at")
    list_filter = ("organization", "receipt_protocol", "capability_version")
    search_fields = ("view_key", "organization", "application_installation", "authorized_workload",
                     "lineage_revision")
    inlines = (CatalogBindingInline,)
    fieldsets = (
        (None, {"fields": ("view_key", "revision", "is_current", "organization", "application_installation",
                           "authorized_workload", "lineage_revision", "receipt_protocol", "security_epoch",
                           "capability_version", "published_at")}),
        ("Digests", {"fields": ("view_digest_hex", "source_snapshot_hex", "receipt_digest_hex")}),
        ("Receipt", {"fields": ("receipt_tree", "receipt_hex")}),
    )

    def get_queryset(self, request):
        latest = (IntegrationBindingView.objects.filter(view_key=OuterRef("view_key"))
                  .order_by("-revision").values("revision")[:1])
        return super().get_queryset(request).annotate(_bindings=Count("bindings"), _latest=Subquery(latest))

    @admin.display(description="current", boolean=True)
    def is_current(self, obj):
        return obj.revision == obj._latest

    @admin.display(description="bindings", ordering="_bindings")
    def binding_count(self, obj):
        return obj._bindings

    view_digest_hex = digest_col("view_digest")
    source_snapshot_hex = digest_col("source_snapshot_digest")
    receipt_digest_hex = digest_col("receipt_digest")
    receipt_preview = preview_col("receipt")
    receipt_tree = tree_col("receipt")
    receipt_hex = block_col("receipt")


@admin.register(CredentialGeneration)
class CredentialGenerationAdmin(FactAdmin):
    fact_description = ("An immutable credential generation minted on rotation "
                        "(connector.services.owners.credential_generation_create). The secret lives in the secret "
                        "backend, never here: the row keeps only its immutable version reference. Dispatch "
                        "eligibility is a separate fact, the credential dispatch gate.")
    list_display = ("generation_id", "credential_identity", "account", "provider_scope", "dispatch_mode",
                    "dispatch_fence", "secret_version_ref", "receipt_digest_hex", "created_at")
    list_filter = ("dispatch_gate__mode", "credential_identity", "provider_scope")
    search_fields = ("generation_id", "credential_identity", "account__account_key", "secret_version_ref")
    list_select_related = ("account", "dispatch_gate")
    fieldsets = (
        (None, {"fields": ("generation_id", "credential_identity", "account", "provider_scope",
                           "secret_version_ref", "receipt_protocol", "created_at")}),
        ("Dispatch gate", {"fields": ("dispatch_gate_link", "dispatch_mode", "dispatch_fence")}),
        ("Digests", {"fields": ("transport_config_hex", "receipt_digest_hex")}),
        ("Receipt", {"fields": ("receipt_tree", "receipt_hex")}),
    )

    @admin.display(description="dispatch", ordering="dispatch_gate__mode")
    def dispatch_mode(self, obj):
        return badge(getattr(getattr(obj, "dispatch_gate", None), "mode", None))

    @admin.display(description="gate fence", ordering="dispatch_gate__fence")
    def dispatch_fence(self, obj):
        return getattr(getattr(obj, "dispatch_gate", None), "fence", EMPTY)

    @admin.display(description="dispatch gate")
    def dispatch_gate_link(self, obj):
        return admin_link(getattr(obj, "dispatch_gate", None))

    transport_config_hex = digest_col("transport_config_digest", "transport config digest")
    receipt_digest_hex = digest_col("receipt_digest")
    receipt_tree = tree_col("receipt")
    receipt_hex = block_col("receipt")


@admin.register(ServiceConfigurationGeneration)
class ServiceConfigurationGenerationAdmin(FactAdmin):
    fact_description = ("One immutable L2 service configuration generation: the exhaustive ordered account set, "
                        "routes, mapping selections, policy values and the exhaustive credential relation, frozen "
                        "as canonical payload bytes with the owner's receipt "
                        "(connector.services.owners.service_configuration_create).")
    list_display = ("generation_id", "catalog_view", "account_count", "generation_protocol",
                    "generation_digest_hex", "receipt_preview", "created_at")
    list_filter = ("generation_protocol", "receipt_protocol")
    search_fields = ("generation_id", "catalog_view__view_key")
    list_select_related = ("catalog_view",)
    inlines = (ServiceConfigurationAccountInline, ServiceConfigurationCredentialMappingInline)
    fieldsets = (
        (None, {"fields": ("generation_id", "catalog_view", "generation_protocol", "receipt_protocol",
                           "created_at")}),
        ("Digests", {"fields": ("generation_digest_hex", "receipt_digest_hex")}),
        ("Receipt", {"fields": ("receipt_tree", "receipt_hex")}),
        ("Payload", {"fields": ("payload_tree", "payload_hex"), "classes": ("collapse",)}),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_accounts=Count("accounts"))

    @admin.display(description="accounts", ordering="_accounts")
    def account_count(self, obj):
        return obj._accounts

    generation_digest_hex = digest_col("generation_digest")
    receipt_digest_hex = digest_col("receipt_digest")
    receipt_preview = preview_col("receipt")
    receipt_tree = tree_col("receipt")
    receipt_hex = block_col("receipt")
    payload_tree = tree_col("payload")
    payload_hex = block_col("payload")


# -- serving --------------------------------------------------------------------------------------------------

@admin.register(ServingEpoch)
class ServingEpochAdmin(TransitionViewMixin, FactAdmin):
    fact_description = ("One exact serving generation, prepared from fresh owner reads and verified, activated or "
                        "rejected only by connector.services.serving. Its preimage and digest and every proof row "
                        "are immutable; only the state columns change.")
    list_display = ("epoch_id", "state_badge", "short_digest", "profile_id", "configuration", "catalog_view",
                    "rejection_code", "state_changed_at")
    list_filter = ("state", "profile_id", "rejection_code")
    search_fields = ("epoch_id", "rejection_code", "configuration__generation_id", "catalog_view__view_key")
    list_select_related = ("configuration", "catalog_view")
    date_hierarchy = "created_at"
    inlines = (ServingEpochBindingProofInline, ServingEpochCredentialProofInline)
    actions = ("verify_epochs", "activate_epochs", "reject_epochs")
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

    @staticmethod
    def _outcome(before: str, after: ServingEpoch, action: str):
        """A verification or activation that ends in `rejected` succeeded as a call but is reported as a warning
        with the reason code the service recorded."""
        message = _transition_message(f"epoch {after.epoch_id}", action, before, after, state_attr="state")
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

    def transition_panel(self, request, obj):
        buttons = [
            {"name": "verify", "label": "Verify (fresh owner reads)", "enabled": obj.state == EpochState.PREPARED},
            {"name": "activate_first", "label": "Activate (first activation)",
             "enabled": obj.state == EpochState.VERIFIED},
            {"name": "reject", "label": "Reject (operator decision; reason required)",
             "enabled": obj.state in (EpochState.PREPARED, EpochState.VERIFIED), "danger": True},
        ]
        return self.panel(obj, buttons=buttons, fence=None, reason_hint="required to reject",
                          notes=[f"Current state: {obj.state}."])

    def perform_transition(self, request, obj, name, data, reason):
        if name == "verify":
            return self._verify(request, obj)
        if name == "activate_first":
            return self._activate(request, obj)
        if name == "reject":
            return self._reject(request, obj, reason)
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
        same = bytes(obj.epoch.digest) == _bytes(obj.epoch_digest)
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
        return _transition_message(f"gate {gate.account}", action, before, after)

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
        return _transition_message(f"credential gate {gate.credential_generation.generation_id}", action, before,
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


# -- audit ----------------------------------------------------------------------------------------------------

@admin.register(AuditRecord)
class AuditRecordAdmin(FactAdmin):
    fact_description = ("The append-only audit of every transition and approval, written by each service in the "
                        "transaction it records (STYLE R12). The database refuses UPDATE and DELETE. Audit "
                        "observes; it never decides (CV2-02-006).")
    list_display = ("at_precise", "actor", "entity", "action", "from_badge", "to_badge", "fence", "evidence",
                    "reason")
    list_filter = ("entity_type", "action", "to_state")
    search_fields = ("actor", "entity_id", "action", "reason")
    date_hierarchy = "at"
    fieldsets = (
        (None, {"fields": ("at_precise", "actor", "entity", "entity_type", "entity_id", "action")}),
        ("Transition", {"fields": ("from_badge", "to_badge", "fence", "evidence", "reason")}),
    )

    @admin.display(description="at", ordering="at")
    def at_precise(self, obj):
        return obj.at.isoformat(sep=" ", timespec="microseconds")

    @admin.display(description="entity")
    def entity(self, obj):
        label = f"{obj.entity_type}:{obj.entity_id}"
        try:
            model = apps.get_model(obj.entity_type)
            url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[obj.entity_id])
        except (LookupError, ValueError, NoReverseMatch):
            return label
        return format_html('<a href="{}">{}</a>', url, label)

    @admin.display(description="from", ordering="from_state")
    def from_badge(self, obj):
        return badge(obj.from_state)

    @admin.display(description="to", ordering="to_state")
    def to_badge(self, obj):
        return badge(obj.to_state)

    evidence = digest_col("evidence_digest", "evidence digest")
