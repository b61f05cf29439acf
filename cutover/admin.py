"""Operator admin of the cutover app: read-only inspection of CutoverDecision and of the succession facts
(ServingPublicationBarrierSet, OrderingHandoff).

CutoverDecision lives in the `journal` database; the admin needs nothing special for it because its default
manager reads through `config.routers.JournalRouter` (and the change view's transaction opens on the router's
write database). The decision changes only through the cutover coordinators, so nothing is added, edited or
deleted here (STYLE R15). Every page is the shared kernel's read-only `FactAdmin` (connector.kernel.admin, D-258):
the connector's own admin stays private to it, and this module no longer re-implements the base.
"""
from __future__ import annotations

from django.contrib import admin

from connector.kernel.admin import FactAdmin, badge, hex_digest, register_tones, state_diagram
from cutover.choices import (
    BARRIER_SET_TRANSITIONS, DECISION_TRANSITIONS, RESTORE_ATTEMPT_TRANSITIONS, BarrierSetState, DecisionState,
)
from cutover.models import (
    ActivationInventory, BarrierOwnerReceipt, CutoverReadinessCertificate, MaintenanceBarrierReceipt, OrderingBaseline,
    SuccessionDrain, V1GenerationReceipt,
    V1Reconciliation,
    CutoverDecision, OrderingHandoff, RestoreAttempt, RestorePointRehearsal, ServiceCutoverAttempt,
    ServingPublicationBarrierSet, V1RestorePoint, V1ShutdownCertificate, V1TableRemoval,
)

register_tones({
    DecisionState.ROLLBACK_OPEN: "info", DecisionState.ACTIVATING_V2: "warn", DecisionState.V2_COMMITTED: "ok",
    DecisionState.RESTORING_V1: "warn", DecisionState.V1_RESTORED: "idle",
    BarrierSetState.ACQUIRING: "info", BarrierSetState.HELD: "warn", BarrierSetState.ACTIVATION_COMMITTED: "ok",
    BarrierSetState.RELEASED: "idle",
})


@admin.register(CutoverDecision)
class CutoverDecisionAdmin(FactAdmin):
    fact_description = ("The sole activation-versus-restore decision of one service cutover attempt, kept in the "
                        "journal database so it survives the restore it arbitrates. Owned by the cutover "
                        "coordinators; the branch never changes because time passed (CV2-12-062) and the fence "
                        "advances on every transition.")
    list_display = ("attempt_key", "state_badge", "fence", "changed_at", "created_at")
    list_filter = ("state",)
    search_fields = ("attempt_key",)
    date_hierarchy = "created_at"
    fieldsets = (
        (None, {"fields": ("attempt_key", "state_badge", "fence", "changed_at", "created_at")}),
        ("Transitions", {"fields": ("available_transitions", "diagram")}),
    )

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        return badge(obj.state)

    @admin.display(description="next transitions (coordinators only)")
    def available_transitions(self, obj):
        return ", ".join(f"{t.name} → {t.target}" for t in obj.get_available_state_transitions()) or "none (final)"

    @admin.display(description="state machine")
    def diagram(self, obj):
        return state_diagram(obj.state, DECISION_TRANSITIONS)


@admin.register(ServingPublicationBarrierSet)
class ServingPublicationBarrierSetAdmin(FactAdmin):
    fact_description = ("Activation evidence of one V2 -> V2 successor attempt (requires_drain): the exact "
                        "predecessor and successor epochs and the successor's owner receipts, frozen while held. "
                        "Owned by `manage.py succession`; released only explicitly, by the holder's fence, never "
                        "because time passed (CV2-11-036).")
    list_display = ("pk", "successor_key", "state_badge", "fence", "holder", "changed_at")
    list_filter = ("state",)
    search_fields = ("successor_key", "holder")
    list_select_related = ("predecessor_epoch", "successor_epoch")
    fields = ("predecessor_epoch", "successor_epoch", "successor_key", "successor_class", "holder", "state_badge",
              "fence", "successor_digest_hex", "owner_receipts_hex", "release_reason", "created_at", "changed_at",
              "diagram")

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        return badge(obj.state)

    @admin.display(description="successor digest")
    def successor_digest_hex(self, obj):
        return hex_digest(obj.successor_digest)

    @admin.display(description="owner receipts digest")
    def owner_receipts_hex(self, obj):
        return hex_digest(obj.owner_receipts_digest)

    @admin.display(description="state machine")
    def diagram(self, obj):
        return state_diagram(obj.state, BARRIER_SET_TRANSITIONS)


@admin.register(OrderingHandoff)
class OrderingHandoffAdmin(FactAdmin):
    fact_description = ("The frozen end of one predecessor ordering lane and the baseline of its successor lane "
                        "(immutable). After the first handoff the predecessor can no longer be resumed (CV2-11-020).")
    list_display = ("pk", "route", "partition", "high_water", "predecessor_epoch", "successor_epoch", "created_at")
    search_fields = ("route", "partition")
    list_select_related = ("predecessor_epoch", "successor_epoch")
    fields = [f.name for f in OrderingHandoff._meta.fields]


# -- V1 restore point, rehearsal and restore attempt (journal database) ------------------------------------------

class _JournalFactAdmin(FactAdmin):
    """A journal-database fact: every binary field is shown as lowercase hex."""

    hex_fields: tuple[str, ...] = ()

    def get_readonly_fields(self, request, obj=None):
        plain = [f.name for f in self.model._meta.fields if f.name not in self.hex_fields and f.name != "payload"
                 and f.name != "recovery_payload"]
        return [*plain, *(f"{name}_hex" for name in self.hex_fields)]

    def get_fields(self, request, obj=None):
        return self.get_readonly_fields(request, obj)


def _with_hex(cls):
    """Give the admin one `<field>_hex` display per binary field it names."""
    for name in cls.hex_fields:
        def show(self, obj, _field=name):
            return hex_digest(getattr(obj, _field))
        setattr(cls, f"{name}_hex", admin.display(description=name.replace("_", " "))(show))
    return cls


@admin.register(V1RestorePoint)
@_with_hex
class V1RestorePointAdmin(_JournalFactAdmin):
    fact_description = ("The transactionally consistent snapshot of the default database taken at v1_drained before "
                        "any V2 mutation (seed step 6), with the exact V1 release tuple and every digest a restore "
                        "is verified against; the dump file is named by path, sha256 and size. Kept in the journal "
                        "database, immutable. Owned by `manage.py restore_point capture` (CV2-12-050/093).")
    list_display = ("attempt_key", "v1_release_id", "dump_bytes", "captured_by", "created_at")
    search_fields = ("attempt_key", "v1_release_id")
    hex_fields = ("v1_binary_digest", "v1_schema_digest", "v1_configuration_digest", "configuration_digest",
                  "schema_digest", "content_digest", "cursors_digest", "account_gate_digest",
                  "shutdown_certificate_digest", "identity_coverage_digest", "ordering_coverage_digest",
                  "effect_evidence_digest", "dump_sha256", "digest")


@admin.register(RestorePointRehearsal)
@_with_hex
class RestorePointRehearsalAdmin(_JournalFactAdmin):
    fact_description = ("One isolated rehearsal of a restore point: the dump restored into a scratch database "
                        "(dropped afterwards), its digests recomputed and equal, the exact V1 release booted against "
                        "it. Immutable; owned by `manage.py restore_point rehearse` (CV2-12-052).")
    list_display = ("pk", "attempt_key", "scratch_database", "rehearsed_by", "created_at")
    search_fields = ("attempt_key",)
    hex_fields = ("schema_digest", "content_digest", "dump_sha256", "boot_receipt_digest", "digest")


@admin.register(RestoreAttempt)
@_with_hex
class RestoreAttemptAdmin(_JournalFactAdmin):
    fact_description = ("The one full V1 restore of a cutover attempt (seed step 10b): decision restoring_v1, the "
                        "default database replaced from the restore point and verified, the recovery receipt, then a "
                        "new V1 generation. Resumed after a crash, never replaced; no state changes on a timeout. "
                        "Owned by `manage.py restore_point restore` (CV2-12-073..075).")
    list_display = ("attempt_key", "state_badge", "fence", "v1_generation_id", "changed_at")
    list_filter = ("state",)
    search_fields = ("attempt_key",)
    hex_fields = ("restored_content_digest", "recovery_digest")

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "state_badge", "diagram"]

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        return badge(obj.state)

    @admin.display(description="state machine")
    def diagram(self, obj):
        return state_diagram(obj.state, RESTORE_ATTEMPT_TRANSITIONS)


# -- the cutover spine (registered here so every cutover fact has a page; the integrator keeps one copy) --------

@admin.register(ServiceCutoverAttempt)
class ServiceCutoverAttemptAdmin(FactAdmin):
    fact_description = ("One planned whole-service V1 -> V2 maintenance: the configuration generation, candidate "
                        "epoch, frozen V1 release and generation and account set it binds; only its outcome is "
                        "written, once (cold_aborted, v1_restored, v2_committed, aborted).")
    list_display = ("attempt_key", "outcome", "v1_release_id", "account_count", "created_at", "closed_at")
    list_filter = ("outcome",)
    search_fields = ("attempt_key",)
    list_select_related = ("configuration", "candidate_epoch")
    fields = [f.name for f in ServiceCutoverAttempt._meta.fields]


@admin.register(V1ShutdownCertificate)
class V1ShutdownCertificateAdmin(FactAdmin):
    fact_description = ("The durable proof that V1 is stopped and drained for one attempt (seed step 5); "
                        "immutable, one per attempt; a restore point freezes its digest.")
    list_display = ("attempt", "v1_release_id", "created_at")
    search_fields = ("attempt__attempt_key",)
    list_select_related = ("attempt",)
    fields = [f.name for f in V1ShutdownCertificate._meta.fields]


# -- V1 shutdown evidence (default database) ---------------------------------------------------------------------

def _evidence_admin(model, description: str, columns: tuple[str, ...]):
    """A read-only page of one append-only cutover evidence model; binary columns shown as hex."""
    binary = [f.name for f in model._meta.fields if f.get_internal_type() == "BinaryField"]
    attrs = {"fact_description": description, "list_display": columns,
             "fields": [f.name for f in model._meta.fields if f.name not in binary]
             + [f"{name}_hex" for name in binary]}
    for name in binary:
        attrs[f"{name}_hex"] = admin.display(description=name.replace("_", " "))(
            lambda self, obj, _field=name: bytes(getattr(obj, _field) or b"").hex()[:128])
    admin.site.register(model, type(f"{model.__name__}Admin", (FactAdmin,), attrs))


_evidence_admin(CutoverReadinessCertificate, "The immutable readiness certificate of one service cutover attempt: "
                "candidate epoch and configuration, route ordering dispositions, budgets, measurements, projections "
                "and the closed reason map (manage.py cutover certify; CV2-12-013).",
                ("attempt", "epoch_id", "configuration_generation_id", "v1_release_id", "created_at"))
_evidence_admin(MaintenanceBarrierReceipt, "One V1 owner barrier receipt (closed, or reopened by an abort), verified "
                "against the exact attempt and barrier (CV2-12-028).",
                ("attempt", "barrier", "action", "owner_kind", "created_at"))
_evidence_admin(V1GenerationReceipt, "The termination or egress-isolation receipt of the exact V1 process "
                "generation (CV2-12-037/038).", ("attempt", "kind", "generation_id", "created_at"))
_evidence_admin(V1Reconciliation, "One fenced v1_stopped reconciliation of a V1 effect row, with the evidence "
                "digest and the gate fences it was taken under (CV2-12-042).",
                ("attempt", "effect_row_id", "outcome", "actor", "created_at"))
_evidence_admin(OrderingBaseline, "The drained V1 high-water of one order-dependent route and partition: the "
                "candidate epoch's lane starts from it (CV2-12-055).",
                ("attempt", "account", "route_key", "partition", "high_water", "origin"))
_evidence_admin(ActivationInventory, "The closed activation inventory frozen when the first activation's barrier "
                "set was held: the path registry's and the inventory's digests and the count per path kind; "
                "rechecked before the activation (CV2-12-010, D-320).",
                ("attempt", "barrier_set", "counts", "created_at"))
_evidence_admin(V1TableRemoval, "The record of the retired V1 tables' removal: each table's row count and content "
                "digest taken in the dropping transaction and the dependency checks that were all empty "
                "(manage.py v1_tables remove; CV2-12-078).", ("attempt", "removed_by", "reason", "created_at"))
_evidence_admin(BarrierOwnerReceipt, "One owner's fenced receipt in a publication barrier set: the Catalog, a "
                "binding-definition owner, the L2 configuration owner or credential authority, with the digest, holder "
                "and fence it was taken under; append-only (CV2-15-009, D-300).",
                ("barrier_set", "owner_kind", "owner_id", "holder", "fence", "created_at"))
_evidence_admin(SuccessionDrain, "The drain phase of one successor attempt: while `draining`, the predecessor's new "
                "roots are refused and its admitted work drains under v2_serving gates; `drained` once the inventory "
                "measured empty (kept here); `released` with the barrier set. Moved only by manage.py succession drain "
                "and the cutover console (CV2-11-005, D-315..D-317).",
                ("barrier_set", "predecessor_epoch", "state", "fence", "changed_at"))
