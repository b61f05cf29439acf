"""Read-only admin of REST bulk delivery facts. Reconciliation approvals, certification approvals and the gate
are operated through the services (`manage.py delivery`, the governance screens); the admin explains state."""
from __future__ import annotations

from django.contrib import admin

import json

from django.utils.html import format_html

from connector.kernel.admin import FactAdmin, FactInline, admin_link, badge, digest_col, step_failures_col
from effects.delivery.contract import contract
from effects.models import (
    DeliveryAttempt,
    DeliveryObservation,
    DeliveryOperation,
    DeliveryParent,
    DeliveryProfile,
    DeliveryReconciliation,
    DeliveryWatermark,
    MayAttemptMarker,
    MutationGate,
    ReceiverBinding,
    ReceiverCertification,
)


def json_col(attr: str):
    """A JSONField shown as indented JSON."""
    return admin.display(description=attr.replace("_", " "))(
        lambda self, o: format_html("<pre>{}</pre>", json.dumps(getattr(o, attr), indent=2, sort_keys=True)))


class AttemptInline(FactInline):
    model = DeliveryAttempt
    fields = ("ordinal", "attempt_id", "capacity_state", "capacity_released_reason", "io_may_have_started",
              "outcome", "response_status", "evidence", "created_at", "settled_at")


class ObservationInline(FactInline):
    model = DeliveryObservation
    fields = ("ordinal", "kind", "acknowledgement", "http_status", "applied_count", "detail", "created_at")


class ChildInline(FactInline):
    model = DeliveryOperation
    fields = ("ordinal", "state", "execution", "remote_effect", "acknowledgement", "verification", "checkpoint",
              "record_count", "last_code")


@admin.register(DeliveryParent)
class DeliveryParentAdmin(FactAdmin):
    fact_description = ("An immutable parent: frozen records, closed source snapshot, and the complete plan admitted "
                        "in one transaction (PLANNING -> ADMITTED). An existing parent never re-plans.")
    list_display = ("parent_key", "state_badge", "profile", "record_count", "contiguous_checkpoint_frontier",
                    "admitted_at")
    list_filter = ("state", "profile")
    search_fields = ("parent_key",)
    inlines = [ChildInline]
    fieldsets = ((None, {"fields": ("parent_key", "state_badge", "binding", "profile", "domain", "scope_ts",
                                    "scope_date", "generation_end", "correction_revision", "record_count",
                                    "snapshot_closed_at", "admitted_at", "planner_algorithm_version",
                                    "plan_digest", "frozen_digest", "coverage", "contiguous_checkpoint_frontier")}),)
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))
    plan_digest = digest_col("parent_plan_digest")
    frozen_digest = digest_col("frozen_parent_digest")
    coverage = json_col("coverage_proof")


@admin.register(DeliveryOperation)
class DeliveryOperationAdmin(FactAdmin):
    fact_description = ("One child mutation and its five-axis state (execution, remote effect, acknowledgement, "
                        "verification, checkpoint) from the delivery contract. Unknown, partial and unverified "
                        "outcomes wait for an operator's reconciliation with evidence.")
    list_display = ("pk", "parent_link", "ordinal", "state_badge", "execution", "remote_effect", "acknowledgement",
                    "verification", "checkpoint", "attempt_ordinal", "last_code")
    list_filter = ("execution", "remote_effect", "acknowledgement", "checkpoint", "last_code")
    inlines = [AttemptInline, ObservationInline]
    fieldsets = ((None, {"fields": ("parent_link", "ordinal", "state_badge", "execution", "remote_effect",
                                    "acknowledgement", "verification", "checkpoint", "revision", "attempt_ordinal",
                                    "observation_ordinal", "next_attempt_after", "remote_receipt_id",
                                    "applied_count", "record_count", "last_code", "last_detail",
                                    "reconciliation_id", "held_reason", "held_at", "next_steps",
                                    "step_failures_col")}),
                 ("Identity", {"fields": ("target_effect_scope", "explicit_generation", "key", "mutation_key",
                                          "intent", "payload_digest_hex")}))
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))
    step_failures_col = step_failures_col
    parent_link = admin.display(description="parent")(lambda self, o: admin_link(o.parent, o.parent.parent_key))
    key = digest_col("delivery_key")
    mutation_key = digest_col("receiver_mutation_key")
    intent = digest_col("mutation_intent_digest")
    payload_digest_hex = digest_col("payload_digest")

    @admin.display(description="allowed next transitions")
    def next_steps(self, obj):
        steps = [f"{'operator: ' if t.operator_only else ''}{t.target} ({t.cas})"
                 for t in contract().transitions if t.source == obj.state]
        return "; ".join(steps) or "terminal"


@admin.register(ReceiverBinding)
class ReceiverBindingAdmin(FactAdmin):
    fact_description = "A receiver's stable non-secret identity. Secret rotations add versions; a principal swap is a new binding."
    list_display = ("name", "remote_principal_id", "remote_account_id", "authentication_mode", "base_url")
    fieldsets = ((None, {"fields": ("name", "base_url", "authority_origin", "remote_principal_id",
                                    "remote_account_id", "remote_resource_namespace", "authentication_mode",
                                    "authentication_semantics", "tls_policy_identity", "network_policy_identity",
                                    "semantics")}),)
    semantics = digest_col("semantics_digest")


@admin.register(ReceiverCertification)
class ReceiverCertificationAdmin(FactAdmin):
    fact_description = "Certification from the connection handshake; platform attestation needs two distinct approvers."
    list_display = ("binding", "assurance_mode", "state_badge", "verified_at", "valid_until")
    fieldsets = ((None, {"fields": ("binding", "assurance_mode", "state_badge", "principal_id", "account_id",
                                    "evidence_ref", "verified_at", "valid_until", "certified_at", "requested_by")}),)
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))


@admin.register(DeliveryProfile)
class DeliveryProfileAdmin(FactAdmin):
    list_display = ("name", "receiver_kind", "mutation_policy", "scope_kind", "profile_version")
    fieldsets = ((None, {"fields": ("name", "receiver_kind", "mutation_policy", "scope_kind", "profile_schema_id",
                                    "profile_version", "max_records_per_child", "semantics", "policy")}),)
    semantics = json_col("operation_semantics")
    policy = json_col("execution_policy")


@admin.register(MutationGate)
class MutationGateAdmin(FactAdmin):
    fact_description = "Submits require ENABLED and the journal epoch attested in the journal database."
    list_display = ("state_badge", "journal_epoch", "blocked_reason", "changed_at")
    fieldsets = ((None, {"fields": ("state_badge", "journal_epoch", "blocked_reason", "blocked_detail",
                                    "changed_at")}),)
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))


@admin.register(DeliveryWatermark)
class DeliveryWatermarkAdmin(FactAdmin):
    list_display = ("domain", "scope_ts", "scope_date", "generation_end", "correction_revision")
    fieldsets = ((None, {"fields": ("domain", "scope_ts", "scope_date", "generation_end", "correction_revision")}),)


@admin.register(MayAttemptMarker)
class MayAttemptMarkerAdmin(FactAdmin):
    list_display = ("attempt_id", "operation", "attempt_ordinal", "journal_epoch", "created_at")
    fieldsets = ((None, {"fields": ("kind", "attempt_id", "operation", "attempt_ordinal", "generation",
                                    "expected_journal_revision", "journal_epoch", "parent_and_child_identity",
                                    "created_at")}),)


@admin.register(DeliveryReconciliation)
class DeliveryReconciliationAdmin(FactAdmin):
    list_display = ("reconciliation_id", "operation", "from_state", "to_state", "proof_kind", "approved_by",
                    "created_at")
    fieldsets = ((None, {"fields": ("reconciliation_id", "operation", "from_state", "to_state", "revision",
                                    "proof_kind", "proof", "approved_by", "note", "created_at")}),)
