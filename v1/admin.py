"""Read-only admin pages of the V1 authority tables (browse what the cutover drains, tombstones and restores)."""
from __future__ import annotations

from django.contrib import admin

from v1.models import V1Barrier, V1HighWater, V1OutboundEffect, V1ProcessGeneration, V1SourceCursor, V1WorkItem


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(V1ProcessGeneration)
class GenerationAdmin(ReadOnly):
    list_display = ("generation_id", "release_id", "state", "egress_isolated", "created_at", "terminated_at")


@admin.register(V1Barrier)
class BarrierAdmin(ReadOnly):
    list_display = ("kind", "closed", "attempt_key", "fence", "changed_at")


@admin.register(V1SourceCursor)
class CursorAdmin(ReadOnly):
    list_display = ("source_key", "cursor", "checkpointed", "changed_at")


@admin.register(V1WorkItem)
class WorkItemAdmin(ReadOnly):
    list_display = ("id", "account_key", "transport_key", "partition", "position", "state", "lease_generation")
    list_filter = ("state",)
    exclude = ("payload",)


@admin.register(V1OutboundEffect)
class EffectAdmin(ReadOnly):
    list_display = ("id", "account_key", "request_key", "state", "dispatch_generation", "remote_id")
    list_filter = ("state",)
    exclude = ("request_body",)


@admin.register(V1HighWater)
class HighWaterAdmin(ReadOnly):
    list_display = ("account_key", "route_key", "partition", "high_water", "comparator")
