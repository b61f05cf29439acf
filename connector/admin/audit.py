"""Registration of the append-only audit record."""
from __future__ import annotations

from django.apps import apps
from django.contrib import admin
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from connector.models import AuditRecord
from connector.admin.base import *  # noqa: F401,F403


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
