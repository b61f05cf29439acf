"""Registrations of the owner facts: accounts, pack generations, binding definitions, catalog views, credential
generations and service configuration generations (all immutable; read-only here)."""
from __future__ import annotations

from django.contrib import admin
from django.db.models import Count, OuterRef, Subquery
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe

from connector.models import (
    BindingDefinition,
    ConnectorAccount,
    CredentialGeneration,
    IntegrationBindingView,
    PackGeneration,
    ServiceConfigurationGeneration,
)
from connector.admin.base import *  # noqa: F401,F403


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
