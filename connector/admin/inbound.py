"""Inbound chain admin: every fact from the admission key to the Runtime result, read-only, navigable by links
(receipt → components → events → projection → executions → attempts/dependencies → result)."""
from __future__ import annotations

from django.contrib import admin
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from connector.admin.base import (
    EMPTY,
    FactAdmin,
    FactInline,
    admin_link,
    badge,
    digest_col,
    epoch_ref,
    expandable_col,
    json_col,
)
from connector.admin.poison import step_failures_col
from connector.models import (
    ApplicationResult,
    CrmRecord,
    Event,
    Execution,
    ExecutionAttempt,
    ExecutionDependency,
    ExecutionTrace,
    GapDecision,
    LaneResumption,
    MaterializationDue,
    OrderingLane,
    Projection,
    ProjectionTrace,
    ProjectionWindow,
    Receipt,
    ReceiptAdmissionKey,
    ReceiptComponent,
    ReceiptTrace,
    ReplayRequest,
    SupersededDecision,
    V1AcceptanceTombstone,
    V1PredecessorRef,
    WindowMember,
)


def _links(rows, label=str) -> str:
    return format_html_join(mark_safe("<br>"), "{}", ((admin_link(r, label(r)),) for r in rows)) or EMPTY


class ComponentInline(FactInline):
    model = ReceiptComponent
    fields = ("ordinal", "disposition_badge", "event_link", "reason_code", "digest")
    disposition_badge = admin.display(description="disposition")(lambda self, o: badge(o.disposition))
    event_link = admin.display(description="event")(lambda self, o: admin_link(o.event))
    digest = digest_col("payload_digest", "payload digest")


class _TraceInline(FactInline):
    """The W3C trace context stored beside the row while tracing was on (issue 21, D-225): search the tracing
    backend with its trace id."""

    fields = ("traceparent", "tracestate")
    verbose_name = verbose_name_plural = "trace context"


class ReceiptTraceInline(_TraceInline):
    model = ReceiptTrace


class ProjectionTraceInline(_TraceInline):
    model = ProjectionTrace


class ExecutionTraceInline(_TraceInline):
    model = ExecutionTrace


@admin.register(Receipt)
class ReceiptAdmin(FactAdmin):
    fact_description = ("Immutable evidence of one accepted V2 admission: the exact bytes, the admitting epoch and "
                        "gate fence. Written by connector.services.admission.receipt_admit (transport) or "
                        "replay_request_admit (replay); its children by receipt_materialize.")
    list_display = ("id", "account", "kind", "channel", "epoch_col", "gate_fence", "component_count",
                    "materialized", "created_at")
    list_filter = ("kind", "channel", "account")
    search_fields = ("admission_key__transport_key", "account__account_key")
    list_select_related = ("account", "epoch")
    inlines = [ComponentInline, ReceiptTraceInline]
    fieldsets = ((None, {"fields": ("account", "kind", "channel", "key_link", "replay_link", "epoch_col",
                                    "gate_fence", "component_count", "materialized", "created_at")}),
                 ("Materialization", {"fields": ("materialization_col", "step_failures_col")}),
                 ("Bytes", {"fields": ("digest", "payload_col")}),
                 ("Descendants", {"fields": ("events_col",)}))
    digest = digest_col("payload_digest", "payload digest")
    payload_col = expandable_col("payload", "payload")

    @admin.display(description="epoch")
    def epoch_col(self, obj):
        return epoch_ref(obj.epoch, obj.epoch_digest)

    step_failures_col = step_failures_col

    @admin.display(description="materialized components")
    def materialized(self, obj):
        return f"{obj.components.count()} / {obj.component_count}"

    @admin.display(description="materialization")
    def materialization_col(self, obj):
        """Done, due (the sweeper works it), or held with its closed reason (decision D-168)."""
        due = MaterializationDue.objects.filter(receipt=obj).first()
        if due is None:
            done = obj.components.count() == obj.component_count
            return "complete" if done else format_html('{} {}', badge("incomplete"), "no queue row")
        if not due.held_reason:
            return format_html("{} since {}", badge("due"), due.due_at.isoformat(sep=" ", timespec="seconds"))
        return format_html("{} <code>{}</code> since {} (the sweeper skips it; see the step failures below)",
                           badge("held"), due.held_reason, due.held_at.isoformat(sep=" ", timespec="seconds"))

    @admin.display(description="admission key")
    def key_link(self, obj):
        return admin_link(getattr(obj, "admission_key", None))

    @admin.display(description="replay request")
    def replay_link(self, obj):
        return admin_link(obj.replay_request)

    @admin.display(description="events")
    def events_col(self, obj):
        return _links(obj.events.order_by("pk"), lambda e: f"{e.source_event_key} (#{e.pk})")


@admin.register(ReceiptAdmissionKey)
class ReceiptAdmissionKeyAdmin(FactAdmin):
    fact_description = "The sole transport-idempotency authority: one per (account, channel, key), bound to one V2 " \
                       "Receipt or one imported V1 acceptance tombstone."
    list_display = ("transport_key", "account", "channel", "receipt_link", "tombstone_link")
    search_fields = ("transport_key",)
    list_select_related = ("account", "receipt", "tombstone")
    fieldsets = ((None, {"fields": ("account", "channel", "transport_key", "receipt_link", "tombstone_link")}),)
    receipt_link = admin.display(description="receipt")(lambda self, o: admin_link(o.receipt))
    tombstone_link = admin.display(description="V1 tombstone")(lambda self, o: admin_link(o.tombstone))


@admin.register(V1AcceptanceTombstone)
class V1AcceptanceTombstoneAdmin(FactAdmin):
    fact_description = "A non-executable V1 transport identity (payload digest and predecessor ref only), imported " \
                       "by `manage.py import_v1_tombstones`."
    list_display = ("transport_key", "account", "channel", "predecessor_ref", "imported_at")
    search_fields = ("transport_key", "predecessor_ref")
    fieldsets = ((None, {"fields": ("account", "channel", "transport_key", "predecessor_ref", "digest",
                                    "imported_at")}),)
    digest = digest_col("payload_digest", "payload digest")


@admin.register(V1PredecessorRef)
class V1PredecessorRefAdmin(FactAdmin):
    fact_description = "The typed V1 predecessor ref of a replay: read-only evidence bound to its V1 tombstone; its " \
                       "V1 epoch is evidence only, the replay runs under its V2 target epoch (D-331)."
    list_display = ("v1_work_item_id", "v1_receipt_transport_key", "original_epoch", "created_at")
    search_fields = ("v1_work_item_id", "v1_receipt_transport_key", "original_epoch")
    fieldsets = ((None, {"fields": ("tombstone_link", "protocol_version", "v1_receipt_channel",
                                    "v1_receipt_transport_key", "v1_event_id", "v1_work_item_id", "original_epoch",
                                    "payload", "result", "created_at")}),)
    tombstone_link = admin.display(description="V1 tombstone")(lambda self, o: admin_link(o.tombstone))
    payload = digest_col("payload_digest", "payload digest")
    result = digest_col("result_digest", "result digest")


class ExecutionLinkMixin:
    @admin.display(description="executions")
    def executions_col(self, obj):
        projection = getattr(obj, "projection", None)
        if projection is None:
            return EMPTY
        return format_html_join(mark_safe("<br>"), "{} {}", (
            (admin_link(x, f"gen {x.generation}"), badge(x.state)) for x in projection.executions.order_by("generation")
        )) or EMPTY


@admin.register(Event)
class EventAdmin(ExecutionLinkMixin, FactAdmin):
    fact_description = "An immutable normalized external event with typed source-order facts; no lease, retry or " \
                       "status. One live Event per (account, SourceEventKey); replay generations are separate."
    list_display = ("id", "account", "route", "source_event_key", "partition", "position", "generation",
                    "created_at")
    list_filter = ("route", "ordering_contract", "account")
    search_fields = ("source_event_key", "source_locator", "partition")
    list_select_related = ("account", "replay_request")
    fieldsets = ((None, {"fields": ("account", "receipt_link", "route", "event_kind", "source_event_key",
                                    "source_locator", "occurred_at", "generation", "predecessor_link")}),
                 ("Ordering facts", {"fields": ("ordering_contract", "contract", "partition", "position_kind",
                                                "position", "grouping_key")}),
                 ("Payload", {"fields": ("digest", "payload_json")}),
                 ("Chain", {"fields": ("projection_link", "executions_col", "superseded_col")}))
    digest = digest_col("payload_digest", "payload digest")
    contract = digest_col("contract_digest", "contract digest")
    payload_json = json_col("payload", "payload")
    receipt_link = admin.display(description="receipt")(lambda self, o: admin_link(o.receipt))
    predecessor_link = admin.display(description="predecessor")(lambda self, o: admin_link(o.predecessor))

    @admin.display(description="generation")
    def generation(self, obj):
        return f"replay {obj.replay_request.request_id}" if obj.replay_request_id else "live"

    @admin.display(description="projection")
    def projection_link(self, obj):
        return admin_link(getattr(obj, "projection", None))

    @admin.display(description="superseded")
    def superseded_col(self, obj):
        projection = getattr(obj, "projection", None)
        decision = getattr(projection, "superseded", None) if projection else None
        return f"{decision.reason} (high-water {decision.high_water_at_decision})" if decision else EMPTY


class AttemptInline(FactInline):
    model = ExecutionAttempt
    fields = ("ordinal", "holder", "lease_fence", "claimed_at", "lease_expires_at")


class DependencyInline(FactInline):
    model = ExecutionDependency
    fields = ("requirement_key", "deadline", "state_badge", "resolved_at", "evidence")
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))


@admin.register(Execution)
class ExecutionAdmin(FactAdmin):
    fact_description = "One immutable execution generation of a Projection. Retry reuses its identity (new Attempt, " \
                       "same command); completion only from the Runtime result receipt."
    list_display = ("id", "account", "state_badge", "generation", "command_id", "attempt_count", "lease_holder",
                    "lease_expires_at", "result_outcome", "quarantine_reason")
    list_filter = ("state", "result_outcome", "account")
    search_fields = ("command_id",)
    list_select_related = ("account",)
    inlines = [AttemptInline, DependencyInline, ExecutionTraceInline]
    fieldsets = ((None, {"fields": ("account", "projection_link", "lane_link", "generation", "state_badge",
                                    "command_id", "ref_digest", "attempt_count", "lease_holder", "lease_fence",
                                    "lease_expires_at", "quarantine_reason", "step_failures_col")}),
                 ("Runtime result", {"fields": ("result_outcome", "result", "result_link", "receipt_col",
                                                "outbound_commands_col")}))
    step_failures_col = step_failures_col
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))
    ref_digest = digest_col("execution_ref_digest", "ExecutionRef digest")
    result = digest_col("result_digest", "result digest")
    receipt_col = expandable_col("runtime_receipt", "Runtime receipt")
    projection_link = admin.display(description="projection")(lambda self, o: admin_link(o.projection))
    lane_link = admin.display(description="lane")(lambda self, o: admin_link(o.lane))

    @admin.display(description="ApplicationResult")
    def result_link(self, obj):
        return admin_link(ApplicationResult.objects.filter(command_id=obj.command_id).first())

    @admin.display(description="outbound commands")
    def outbound_commands_col(self, obj):
        """The OutboundCommands its Runtime transaction authored (the reverse of OutboundCommand.source_execution;
        reached by relation name, so connector never imports effects)."""
        related = getattr(obj, "outbound_commands", None)
        if related is None:
            return EMPTY
        rows = list(related.order_by("pk")[:20])
        if not rows:
            return EMPTY
        links = _links(rows, lambda c: f"#{c.pk} {c.method} {c.path}")
        try:
            url = reverse("admin:effects_outboundcommand_changelist")
        except NoReverseMatch:
            return links
        return format_html('{}<br><a href="{}?source_execution__id__exact={}">all of this execution</a>', links,
                           url, obj.pk)


@admin.register(Projection)
class ProjectionAdmin(FactAdmin):
    fact_description = "An immutable application-input generation (one Event, or one sealed window) with the pointer " \
                       "that mints at most one active Execution generation."
    list_display = ("id", "account", "route", "position", "lane_status", "execution_generation", "created_at")
    inlines = [ProjectionTraceInline]
    list_filter = ("route", "lane_status", "account")
    list_select_related = ("account",)
    fieldsets = ((None, {"fields": ("account", "route", "route_version", "event_link", "window_link", "lane_link",
                                    "position", "lane_status", "execution_generation", "suppress_external_effects",
                                    "identity", "executions_col")}),
                 ("Input", {"fields": ("input_digest_hex", "input_json")}))
    identity = digest_col("identity_digest", "identity digest")
    input_digest_hex = digest_col("input_digest", "input digest")
    input_json = json_col("input", "input")
    event_link = admin.display(description="event")(lambda self, o: admin_link(o.event))
    window_link = admin.display(description="window")(lambda self, o: admin_link(o.window))
    lane_link = admin.display(description="lane")(lambda self, o: admin_link(o.lane))
    executions_col = admin.display(description="executions")(
        lambda self, o: _links(o.executions.order_by("generation"), lambda x: f"gen {x.generation}: {x.state}"))


class WindowMemberInline(FactInline):
    model = WindowMember
    fields = ("ordinal", "event_link", "record_key")
    event_link = admin.display(description="event")(lambda self, o: admin_link(o.event))


@admin.register(ProjectionWindow)
class ProjectionWindowAdmin(FactAdmin):
    fact_description = "One explicit window of a grouped route; sealing fixes its membership."
    inlines = [WindowMemberInline]
    list_display = ("id", "account", "route", "grouping_key", "state_badge", "member_count", "max_members",
                    "closes_at", "sealed_at")
    list_filter = ("state", "route")
    fieldsets = ((None, {"fields": ("account", "route", "grouping_key", "state_badge", "member_count",
                                    "max_members", "max_age_seconds", "opened_at", "closes_at", "sealed_at",
                                    "quarantine_reason", "members_col", "step_failures_col")}),)
    step_failures_col = step_failures_col
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))
    members_col = admin.display(description="members")(
        lambda self, o: _links([m.event for m in o.members.select_related("event").order_by("ordinal")],
                               lambda e: e.source_event_key))


class SupersededInline(FactInline):
    model = SupersededDecision
    fields = ("projection_link", "position", "high_water_at_decision", "selected_position", "reason", "decided_at")
    projection_link = admin.display(description="projection")(lambda self, o: admin_link(o.projection))


class GapInline(FactInline):
    model = GapDecision
    fields = ("expected_position", "next_available", "disposition", "decided_at")


class ResumptionInline(FactInline):
    model = LaneResumption
    fields = ("halt_reason", "mode", "blocking_position", "high_water_before", "high_water_after", "fence_before",
              "fence_after", "replay_request", "actor", "evidence", "resumed_at")


@admin.register(OrderingLane)
class OrderingLaneAdmin(FactAdmin):
    fact_description = "The sole mutable claim guard of one (epoch, account, route, partition): completed " \
                       "high-water, its baseline, at most one active Execution; changed only by fenced CAS."
    list_display = ("id", "account", "route", "partition", "contract", "high_water", "state_badge", "halt_reason",
                    "active_link", "fence")
    list_filter = ("contract", "state", "route")
    search_fields = ("partition",)
    inlines = [SupersededInline, GapInline, ResumptionInline]
    fieldsets = ((None, {"fields": ("epoch", "account", "route", "route_version", "partition", "contract",
                                    "baseline", "baseline_origin", "high_water", "state_badge", "halt_reason",
                                    "gap_since", "active_link", "fence", "changed_at", "step_failures_col")}),)
    step_failures_col = step_failures_col
    state_badge = admin.display(description="state")(lambda self, o: badge(o.state))
    active_link = admin.display(description="active execution")(lambda self, o: admin_link(o.active_execution))


@admin.register(ReplayRequest)
class ReplayRequestAdmin(FactAdmin):
    fact_description = "Immutable operator authorization of one replay (suppress_external_effects only)."
    list_display = ("request_id", "account", "principal", "mode", "created_at")
    search_fields = ("request_id", "principal")
    fieldsets = ((None, {"fields": ("account", "request_id", "target_epoch", "principal", "reason", "mode",
                                    "predecessor_link", "v1_predecessor_link", "gate_fence", "request",
                                    "created_at")}),)
    request = digest_col("request_digest", "request digest")
    predecessor_link = admin.display(description="predecessor event")(lambda self, o: admin_link(o.predecessor_event))
    v1_predecessor_link = admin.display(description="V1 predecessor")(lambda self, o: admin_link(o.v1_predecessor))


@admin.register(ApplicationResult)
class ApplicationResultAdmin(FactAdmin):
    fact_description = "Runtime's immutable terminal outcome of one command, committed with the CRM change."
    list_display = ("command_id", "outcome_badge", "detail", "committed_at")
    list_filter = ("outcome",)
    search_fields = ("command_id",)
    fieldsets = ((None, {"fields": ("command_id", "outcome_badge", "detail", "ref", "result", "receipt_col",
                                    "committed_at")}),)
    outcome_badge = admin.display(description="outcome")(lambda self, o: badge(o.outcome))
    ref = digest_col("execution_ref_digest", "ExecutionRef digest")
    result = digest_col("result_digest", "result digest")
    receipt_col = expandable_col("receipt", "receipt")


@admin.register(CrmRecord)
class CrmRecordAdmin(FactAdmin):
    fact_description = "Demo CRM records owned by Runtime (the application the connector applies changes to)."
    list_display = ("record_key", "account", "version", "last_command_id", "updated_at")
    search_fields = ("record_key",)
    fieldsets = ((None, {"fields": ("account", "record_key", "fields", "version", "last_command_id",
                                    "updated_at")}),)


@admin.register(MaterializationDue)
class MaterializationDueAdmin(FactAdmin):
    fact_description = ("Receipts whose children are not materialized yet; the sweeper works this queue, except the "
                        "rows held after a deterministic failure (held reason set, decision D-168).")
    list_display = ("receipt", "due_at", "held_reason", "held_at")
    list_filter = ("held_reason",)
    fieldsets = ((None, {"fields": ("receipt", "due_at", "held_reason", "held_at")}),)
