"""Operator admin of the connector: inspect every owner generation, epoch, gate and credential gate, and trigger
transitions only through `connector.services` (STYLE R15).

Every model here is a fact some service owns, so nothing is added, edited or deleted from the admin: each change
view opens read-only. Epoch and gate actions call the services with `Actor.for_user(request.user)` and report
domain errors as `"<code>: <detail>"`. A gate transition always carries the fence the operator saw (the detail
page's form, or the confirmation page of a changelist action), so a decision taken on a stale page is refused
with FENCE_STALE by the service instead of being applied to a newer state.

Binary columns are shown as lowercase hex: digests in full everywhere, receipts and preimages truncated in lists
and in full (plus their decoded canonical tree) on the detail page. No secret is stored in the database, so
none can appear here; credential rows carry only `secret_version_ref`.

The generic part (FactAdmin, FactInline, the transition form, the column renderers) is the shared admin kernel,
`connector.kernel.admin` (D-258), re-exported here for the connector's own admin modules; what stays here is the
connector's: its badge tones, permissions, epoch and audit panels and the owner-generation inlines.
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from connector.choices import (
    CredentialGateMode,
    EpochState,
    GateMode,
)
from connector.kernel.admin import (  # noqa: F401  (re-exported for connector.admin.*)
    EMPTY,
    FactAdmin,
    FactInline,
    TransitionViewMixin,
    admin_link,
    badge,
    block_col,
    code,
    code_col,
    decoded_tree,
    digest_col,
    expandable_col,
    hex_block,
    hex_digest,
    hex_expandable,
    hex_preview,
    hex_short,
    json_block,
    json_col,
    posted_fence,
    preview_col,
    register_tones,
    state_diagram,
    tree_col,
    tree_lines,
)
from connector.models import (
    AuditRecord,
    BindingDefinition,
    CatalogBinding,
    ServiceConfigurationAccount,
    ServiceConfigurationCredentialMapping,
    ServingEpoch,
    ServingEpochBindingProof,
    ServingEpochCredentialProof,
)

AUDIT_TRAIL_LIMIT = 200

# Permissions the admin requires before it calls a service that does not check one itself. The credential gate's
# revoke/reenable permissions are checked by the service (django-fsm `permission=`), not here.
PERM_GATE_OPERATE = "connector.operate_accountservinggate"
PERM_EPOCH_VERIFY = "connector.verify_servingepoch"
PERM_EPOCH_REJECT = "connector.reject_servingepoch"
PERM_EPOCH_ACTIVATE = "connector.activate_servingepoch"
PERM_EPOCH_RETIRE = "connector.retire_servingepoch"
# ServingEpoch transitions an operator can trigger here (activate through epoch_activate_first); drain and retire
# belong to successor activation and epoch_retire.
EPOCH_OPERATOR_TRANSITIONS = ("verify", "activate", "reject", "retire")

register_tones({
    GateMode.V1_SERVING: "info", GateMode.HALTING_V1: "warn", GateMode.V1_STOPPED: "warn",
    GateMode.V1_DRAINED: "idle", GateMode.V2_VALIDATING: "idle", GateMode.V2_SERVING: "ok",
    GateMode.HALTING_V2: "warn", GateMode.V2_HALTED: "bad",
    EpochState.PREPARED: "idle", EpochState.VERIFIED: "info", EpochState.REJECTED: "bad",
    EpochState.ACTIVE: "ok", EpochState.DRAINING: "warn", EpochState.RETIRED: "idle",
    CredentialGateMode.ENABLED: "ok", CredentialGateMode.REVOKED: "bad",
})


def epoch_ref(epoch: ServingEpoch | None, digest: Any = None) -> SafeString | str:
    """An epoch as `<id> <short digest>` linking to it; `digest` is the referencing row's copy."""
    if epoch is None:
        return EMPTY
    return format_html("{} {}", admin_link(epoch, epoch.epoch_id), hex_short(digest if digest is not None
                                                                               else epoch.digest))


def audit_trail(entity_type: str, entity_id: Any) -> SafeString:
    """AuditRecord rows of one entity, newest first."""
    rows = list(AuditRecord.objects.filter(entity_type=entity_type, entity_id=str(entity_id))
                .order_by("-at", "-pk")[:AUDIT_TRAIL_LIMIT])
    if not rows:
        return format_html('<span class="cv2-muted">{}</span>', "no audit records")
    body = format_html_join("", (
        "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{} → {}</td><td>{}</td><td>{}</td><td>{}</td></tr>"),
        ((admin_link(r, r.at.isoformat(sep=" ", timespec="microseconds")), r.actor, r.action, badge(r.from_state),
          badge(r.to_state), EMPTY if r.fence is None else r.fence, hex_digest(r.evidence_digest), r.reason or "")
         for r in rows))
    link = (reverse("admin:connector_auditrecord_changelist") + "?"
            + urlencode({"entity_type": entity_type, "entity_id": str(entity_id)}))
    return format_html(
        '<table class="cv2-table"><thead><tr><th>at</th><th>actor</th><th>action</th><th>from → to</th>'
        '<th>fence</th><th>evidence digest</th><th>reason</th></tr></thead><tbody>{}</tbody></table>'
        '<p class="cv2-muted">{} record(s), newest first. <a href="{}">Open in the audit list</a></p>',
        body, len(rows), link)

# -- inlines --------------------------------------------------------------------------------------------------

class BindingDefinitionInline(FactInline):
    model = BindingDefinition
    fields = ("definition_link", "kind_code", "business_key", "definition_version", "digest", "receipt_digest_hex")
    kind_code = code_col("kind")

    @admin.display(description="definition")
    def definition_link(self, obj):
        return admin_link(obj, f"#{obj.pk}")

    digest = digest_col("canonical_definition_digest", "canonical definition digest")
    receipt_digest_hex = digest_col("receipt_digest")


class CatalogBindingInline(FactInline):
    model = CatalogBinding
    fk_name = "view"
    fields = ("ordinal", "kind_code", "business_key", "definition_version", "owner_pack", "pack_generation",
              "credential_refs", "runtime", "row_id", "identity", "pack_payload")
    kind_code = code_col("kind")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("pack_generation")

    @admin.display(description="runtime command")
    def runtime(self, obj):
        if obj.runtime_command_definition_id is None:
            return EMPTY
        return f"{obj.runtime_command_definition_id} v{obj.runtime_command_version}"

    identity = digest_col("identity_digest", "identity digest")
    pack_payload = digest_col("pack_payload_digest", "pack payload digest")


class ServiceConfigurationAccountInline(FactInline):
    model = ServiceConfigurationAccount
    fields = ("ordinal", "account", "enabled_routes", "mapping_selections", "policy_values")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("account")


class ServiceConfigurationCredentialMappingInline(FactInline):
    model = ServiceConfigurationCredentialMapping
    fields = ("account", "credential_ref", "credential_generation")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("account", "credential_generation")


class ServingEpochBindingProofInline(FactInline):
    model = ServingEpochBindingProof
    fields = ("ordinal", "binding", "pack_generation", "definition_digest", "receipt_digest_hex", "receipt")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("binding", "pack_generation")

    definition_digest = digest_col("canonical_definition_digest", "canonical definition digest")
    receipt_digest_hex = digest_col("owner_receipt_digest", "owner receipt digest")
    receipt = expandable_col("owner_receipt", "owner receipt")


class ServingEpochCredentialProofInline(FactInline):
    model = ServingEpochCredentialProof
    fields = ("ordinal", "credential_generation", "receipt_digest_hex", "receipt")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("credential_generation")

    receipt_digest_hex = digest_col("owner_receipt_digest", "owner receipt digest")
    receipt = expandable_col("owner_receipt", "owner receipt")


# -- owner generations ----------------------------------------------------------------------------------------
