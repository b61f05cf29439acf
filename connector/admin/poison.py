"""Poison-item evidence in the admin (decision D-168): the StepFailure list, and the panel every held or
quarantined item's page shows — each failure (step, time, closed reason, exception class and message) with its
reason's owner, alert deadline and remediation (CV2-13-001)."""
from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from connector.admin.base import FactAdmin, badge
from connector.models import StepFailure
from connector.services.poison import STEP_FAILURE_REASONS

PANEL_LIMIT = 20


def step_failures(entity) -> SafeString:
    """The StepFailure rows of one item, newest first, then what each of their reasons asks the operator to do."""
    rows = list(StepFailure.objects.filter(entity_type=type(entity)._meta.label, entity_id=str(entity.pk))
                .order_by("-at", "-pk")[:PANEL_LIMIT])
    if not rows:
        return format_html('<span class="cv2-muted">{}</span>', "no step failures")
    body = format_html_join("", "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td><code>{}</code></td>"
                                "<td>{}</td></tr>",
                            ((r.at.isoformat(sep=" ", timespec="seconds"), r.step, badge(r.reason_code),
                              r.exception_class, r.message) for r in rows))
    codes = sorted({r.reason_code for r in rows})
    remediation = format_html_join("", "<p><strong>{}</strong> — {} · owner: {} · alert after {} min<br>{}</p>",
                                   ((code, *STEP_FAILURE_REASONS[code]) for code in codes))
    return format_html('<table class="cv2-table"><thead><tr><th>at</th><th>step</th><th>reason</th>'
                       '<th>exception</th><th>message</th></tr></thead><tbody>{}</tbody></table>{}',
                       body, remediation)


step_failures_col = admin.display(description="step failures")(lambda self, obj: step_failures(obj))


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
