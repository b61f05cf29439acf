"""Poison-item evidence in the admin (decision D-168): the StepFailure list, and the panel every held or
quarantined item's page shows — each failure (step, time, closed reason, exception class and message) with its
reason's owner, alert deadline and remediation (CV2-13-001)."""
from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from connector.admin.base import FactAdmin
from connector.kernel.admin import step_failures, step_failures_col  # noqa: F401  (the shared panel)
from connector.models import StepFailure
from connector.services.poison import STEP_FAILURE_REASONS


@admin.register(StepFailure)
class StepFailureAdmin(FactAdmin):
    fact_description = ("Append-only evidence of one deterministic failure of a sweeper or worker step on one item: "
                        "the item was quarantined or held with the closed reason, and the sweep moved on "
                        "(decision D-168). The database refuses UPDATE and DELETE.")
    list_display = ("at", "reason_code", "step", "entity_type", "entity_id", "exception_class")
    list_filter = ("reason_code", "step", "entity_type")
    search_fields = ("entity_id", "exception_class", "message")
    date_hierarchy = "at"
    fieldsets = ((None, {"fields": ("at", "reason_code", "step", "entity_type", "entity_id", "exception_class",
                                    "message", "remediation")}),)

    @admin.display(description="remediation")
    def remediation(self, obj):
        title, owner, minutes, text = STEP_FAILURE_REASONS[obj.reason_code]
        return format_html("{} · owner: {} · alert after {} min<br>{}", title, owner, minutes, text)
