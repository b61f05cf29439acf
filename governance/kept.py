"""A refused form comes back as the operator typed it (issue 38 item 3, D-472): the page is rendered again, not
redirected, with every posted value kept, each problem beside its field and a summary of all problems at the top
of the page (the GOV.UK design system's error summary and error message pattern). Nothing was applied.

A view that refuses builds one `Kept` for the form that was posted and renders its page with `kept_context(...)`.
The templates read `kept.<form>.values.<field>` for each input and include `governance/field_error.html` beside it;
`governance/error_summary.html` (included by base.html) lists the problems, each a link to its field. A password
is never kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from connector.errors import ConnectorError

NEVER_KEPT = frozenset({"csrfmiddlewaretoken", "password"})


@dataclass
class Kept:
    """What one posted form said and why it was refused: `errors` maps a field name to its messages; `anchors`
    maps a field name to the id of its input on the page (the summary links there)."""

    form: str
    values: dict[str, str]
    errors: dict[str, list[str]] = field(default_factory=dict)
    anchors: dict[str, str] = field(default_factory=dict)
    status: int = 400

    @classmethod
    def of(cls, request, form: str, anchors: dict[str, str]) -> Kept:
        values = {k: request.POST.get(k, "") for k in request.POST if k not in NEVER_KEPT}
        return cls(form, values, anchors=anchors)

    def add(self, name: str, message: str) -> Kept:
        self.errors.setdefault(name, []).append(message)
        return self

    def refused(self, name: str, error: ConnectorError) -> Kept:
        """A service refusal, shown beside the field it is about (its code first: docs/errors.md lists it)."""
        self.status = error.http_status
        return self.add(name, f"{error.code}: {error.detail}")

    def form_refused(self, refusal) -> Kept:
        """A form that did not validate (governance.forms.FormRefused): each problem beside its field, the
        catalog code and what to do in the summary."""
        self.status = refusal.error.http_status
        for name, problems in refusal.fields.items():
            self.add(name, f"{refusal.error.code}: {' '.join(problems)} {refusal.error.operator_action}")
        return self

    def require(self, **labels: str) -> bool:
        """True when every named field was filled; otherwise an error beside each empty one."""
        for name, label in labels.items():
            if not self.values.get(name, "").strip():
                self.add(name, f"Enter {label}.")
        return not self.errors

    @property
    def summary(self) -> list[tuple[str, str]]:
        return [(self.anchors.get(name, name), message) for name, messages in self.errors.items()
                for message in messages]


def kept_context(kept: Kept | None) -> dict:
    """The template context of a page that may carry one refused form."""
    if kept is None:
        return {"kept": {}, "error_summary": []}
    return {"kept": {kept.form: {"values": kept.values, "errors": kept.errors}}, "error_summary": kept.summary}
