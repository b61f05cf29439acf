"""The shared operator-admin kernel (D-258): the read-only fact admin, its inline, the transition form and the
column renderers every app's Django admin builds on. Any app may import it (the shared kernel, ARCHITECTURE.md);
it holds no app's models. `connector.admin` (the connector's own admin registrations) stays private to the
connector app, as `effects.admin` and `cutover.admin` stay private to theirs.

Every model shown through it is a fact some service owns, so nothing is added, edited or deleted from the admin:
each change view opens read-only, and an operator transition calls the owning app's service with
`Actor.for_user(request.user)`, reporting domain errors as `"<code>: <detail>"`. A transition always carries the
fence the operator saw, so a decision taken on a stale page is refused with FENCE_STALE by the service.

Binary columns are shown as lowercase hex: digests in full everywhere, receipts and preimages truncated in lists
and in full (plus their decoded canonical tree) on the detail page. Badge tones are registered by each app for its
own closed state vocabularies (`register_tones`); an unregistered value shows as `idle`.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from connector.actors import Actor
from connector.canonical.decoding import decode
from connector.canonical.encoding import CanonicalEncodingError, Record
from connector.errors import ConnectorError, FenceStale, PermissionRefused
from connector.selectors.poison import step_failures_of
from connector.services.poison import STEP_FAILURE_REASONS

EMPTY = "-"  # the admin's own empty_value_display

_TONES: dict[str, str] = {}


def register_tones(tones: Mapping[str, str]) -> None:
    """Badge tones (`ok`, `info`, `warn`, `bad`, `idle`) of one app's state values; called at admin import."""
    _TONES.update({str(value): tone for value, tone in tones.items()})


# -- rendering ------------------------------------------------------------------------------------------------

def as_bytes(value: Any) -> bytes | None:
    """A bytea column as bytes (None stays None): the admin compares digests this way."""
    return None if value is None else bytes(value)


def badge(value: str | None) -> SafeString | str:
    if not value:
        return EMPTY
    return format_html('<span class="cv2-badge cv2-tone-{}">{}</span>', _TONES.get(value, "idle"), value)


def hex_digest(value: Any) -> SafeString | str:
    """A digest in full, lowercase hex."""
    data = as_bytes(value)
    return EMPTY if data is None else format_html('<code class="cv2-hex">{}</code>', data.hex())


def hex_short(value: Any, nbytes: int = 6) -> SafeString | str:
    data = as_bytes(value)
    return EMPTY if data is None else format_html('<code class="cv2-hex" title="{}">{}</code>',
                                                   data.hex(), data[:nbytes].hex())


def hex_preview(value: Any, nbytes: int = 16) -> SafeString | str:
    """A receipt or preimage truncated for lists."""
    data = as_bytes(value)
    if data is None:
        return EMPTY
    more = "…" if len(data) > nbytes else ""
    return format_html('<code class="cv2-hex">{}{}</code> <span class="cv2-muted">({} bytes)</span>',
                       data[:nbytes].hex(), more, len(data))


def hex_block(value: Any) -> SafeString | str:
    """Full hex in a monospace block (detail pages)."""
    data = as_bytes(value)
    if data is None:
        return EMPTY
    return format_html('<pre class="cv2-hex">{}</pre><div class="cv2-muted">{} bytes</div>', data.hex(), len(data))


def hex_expandable(value: Any) -> SafeString | str:
    """Truncated, expandable to the full hex (receipts inside inline rows)."""
    data = as_bytes(value)
    if data is None:
        return EMPTY
    return format_html('<details class="cv2-details"><summary>{}</summary><pre class="cv2-hex">{}</pre></details>',
                       hex_preview(data), data.hex())


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, bytes):
        return f"bytes[{len(value)}] {value.hex()}" if value else "bytes[0]"
    return json.dumps(value, ensure_ascii=False)


def tree_lines(value: Any, indent: int = 0, label: str | None = None) -> list[str]:
    """An indented rendering of a decoded canonical value: records, lists, scalars; bytes as hex."""
    head = "  " * indent + (f"{label}: " if label is not None else "")
    if isinstance(value, Record):
        lines = [f"{head}record ({len(value)} fields)"]
        for name, item in value:
            lines += tree_lines(item, indent + 1, name)
        return lines
    if isinstance(value, tuple):
        lines = [f"{head}list ({len(value)})" if value else f"{head}[]"]
        for index, item in enumerate(value):
            lines += tree_lines(item, indent + 1, f"[{index}]")
        return lines
    return [head + _scalar(value)]


def decoded_tree(value: Any) -> SafeString | str:
    """The canonical preimage decoded as (domain, value) and rendered as a tree; a value that does not decode
    says why instead."""
    data = as_bytes(value)
    if data is None:
        return EMPTY
    try:
        domain, decoded = decode(data)
    except CanonicalEncodingError as exc:
        return format_html('<span class="cv2-muted">not a canonical preimage ({})</span>', exc.code)
    text = "\n".join([f"domain: {json.dumps(domain, ensure_ascii=False)}", *tree_lines(decoded)])
    return format_html('<pre class="cv2-tree">{}</pre>', text)


def json_block(value: Any) -> SafeString | str:
    """Canonical JSON bytes pretty-printed (pack payloads, definitions)."""
    data = as_bytes(value)
    if data is None:
        return EMPTY
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return format_html('<span class="cv2-muted">{}</span>', "not UTF-8 JSON")
    return format_html('<pre class="cv2-tree">{}</pre>', json.dumps(document, indent=2, ensure_ascii=False))


def admin_link(obj: Any, label: Any = None) -> SafeString | str:
    if obj is None:
        return EMPTY
    try:
        url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    except NoReverseMatch:
        return str(label if label is not None else obj)
    return format_html('<a href="{}">{}</a>', url, label if label is not None else obj)



def state_diagram(current: str, edges: tuple[tuple[str, str], ...]) -> SafeString:
    """The model's transition table with the current state's outgoing edges highlighted."""
    return format_html('<table class="cv2-table"><tbody>{}</tbody></table>', format_html_join(
        "", '<tr class="{}"><td>{}</td><td>→</td><td>{}</td></tr>',
        (("cv2-current" if source == current else "", badge(source), badge(target)) for source, target in edges)))


def code(value: Any) -> SafeString | str:
    """A canonical code value (kinds, states) as stored, not its human label."""
    return EMPTY if value in (None, "") else format_html("<code>{}</code>", value)


def _display(description: str, render: Callable[[Any], Any], attr: str) -> Callable[[Any, Any], Any]:
    def display(self, obj):
        return render(getattr(obj, attr))
    display.__name__ = f"{attr}_{render.__name__}"
    return admin.display(description=description)(display)


def digest_col(attr: str, description: str | None = None):
    return _display(description or attr.replace("_", " "), hex_digest, attr)


def preview_col(attr: str, description: str | None = None):
    return _display(description or f"{attr.replace('_', ' ')}", hex_preview, attr)


def block_col(attr: str, description: str | None = None):
    return _display(description or f"{attr.replace('_', ' ')} (hex)", hex_block, attr)


def tree_col(attr: str, description: str | None = None):
    return _display(description or f"{attr.replace('_', ' ')} (decoded)", decoded_tree, attr)


def json_col(attr: str, description: str | None = None):
    return _display(description or f"{attr.replace('_', ' ')} (JSON)", json_block, attr)


def expandable_col(attr: str, description: str | None = None):
    return _display(description or attr.replace("_", " "), hex_expandable, attr)


def code_col(attr: str, description: str | None = None, ordering: str | None = None):
    display = _display(description or attr.replace("_", " "), code, attr)
    display.admin_order_field = ordering
    return display


# -- base classes ---------------------------------------------------------------------------------------------

class NoWrites:
    """Facts are written only by services: the admin (and its inlines) never adds, changes or deletes a row."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class FactAdmin(NoWrites, admin.ModelAdmin):
    """A service-owned fact: viewable, never added, changed or deleted here. Every field shown is read-only
    (`fieldsets` lists model fields and display methods; all of them are `readonly_fields`)."""

    fact_description = ""
    change_list_template = "admin/cv2/fact_change_list.html"
    change_form_template = "admin/cv2/fact_change_form.html"
    show_full_result_count = False

    def get_readonly_fields(self, request, obj=None):
        return flatten_fieldsets(self.get_fieldsets(request, obj))

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {"fact_description": self.fact_description, **(extra_context or {})})

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context = {**context, "fact_description": self.fact_description,
                   "transition_panel": self.transition_panel(request, obj) if obj is not None else None}
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    def transition_panel(self, request, obj) -> dict[str, Any] | None:
        """Context of the detail page's transition form, or None when the fact has no operator transitions."""
        return None

    # -- service calls ----------------------------------------------------------------------------------------

    def report(self, request, call: Callable[[], str | tuple[str, int]], *, about: str = "") -> bool:
        """Run one service call; report its domain error as `<code>: <detail>` or its outcome message."""
        try:
            outcome = call()
        except ConnectorError as exc:
            suffix = f" ({about})" if about else ""
            self.message_user(request, f"{exc.code}: {exc.detail}{suffix}", messages.ERROR)
            return False
        message, level = outcome if isinstance(outcome, tuple) else (outcome, messages.SUCCESS)
        self.message_user(request, message, level)
        return level == messages.SUCCESS

    @staticmethod
    def require(request, permission: str) -> Actor:
        actor = Actor.for_user(request.user)
        if not request.user.has_perm(permission):
            raise PermissionRefused(f"{actor} lacks the {permission} permission")
        return actor

    def confirm_or_apply(self, request, queryset, *, action: str, title: str, apply: Callable[..., str],
                         reason_required: bool = False, fenced: bool = False, state_attr: str = "mode",
                         warning: str = "", label: Callable[[Any], str] = str,
                         token: tuple[Callable[[Any], str], Callable[[Any], Any]] | None = None):
        """Changelist action in two steps: a confirmation page listing the rows (with the fence each shows) and
        a reason field, then one service call per row with that fence and reason.

        `token=(render, parse)` makes every row carry a state token (connector.statetokens): the confirmation
        page renders `render(row)` as it is when the page opens, and the apply step receives `parse(posted)` as
        `token=` for the service to compare under its lock. A missing or malformed token is refused with
        STATE_TOKEN_INVALID for that row, never applied unchecked."""
        objects = list(queryset.order_by("pk"))
        if request.POST.get("post") != "yes":
            rows = [{"pk": o.pk, "label": label(o), "state": badge(getattr(o, state_attr)),
                     "fence": getattr(o, "fence", None), "token": token[0](o) if token else None}
                    for o in objects]
            context = {**self.admin_site.each_context(request), "title": title, "opts": self.opts,
                       "rows": rows, "action": action, "fenced": fenced, "reason_required": reason_required,
                       "tokened": token is not None,
                       "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME, "warning": warning,
                       "fact_description": self.fact_description, "media": self.media}
            request.current_app = self.admin_site.name
            return TemplateResponse(request, "admin/cv2/confirm_action.html", context)
        reason = request.POST.get("reason", "")
        for obj in objects:
            def call(obj=obj):
                fence = posted_fence(request.POST.get(f"fence_{obj.pk}")) if fenced else None
                if token is None:
                    return apply(request, obj, fence=fence, reason=reason)
                return apply(request, obj, fence=fence, reason=reason,
                             token=token[1](request.POST.get(f"token_{obj.pk}")))
            self.report(request, call, about=label(obj))
        return None


def posted_fence(raw: str | None) -> int:
    """The fence a form carried. A missing or malformed fence is refused, never treated as "no fence check"."""
    try:
        return int(raw or "")
    except ValueError:
        raise FenceStale("the request carried no valid fence; reload the page and decide again") from None


class TransitionViewMixin:
    """A per-object POST endpoint `<pk>/transition/` behind the admin's login and CSRF protection. The form on
    the detail page posts the transition, the fence the page showed and a reason."""

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [path("<path:object_id>/transition/", self.admin_site.admin_view(self.transition_view),
                     name="%s_%s_transition" % info), *super().get_urls()]

    def transition_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404
        if not self.has_view_permission(request, obj):
            raise PermissionDenied
        name = request.POST.get("transition", "")
        reason = request.POST.get("reason", "")
        self.report(request, lambda: self.perform_transition(request, obj, name, request.POST, reason))
        return HttpResponseRedirect(reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change",
                                            args=[obj.pk], current_app=self.admin_site.name))

    def perform_transition(self, request, obj, name: str, data, reason: str):
        """Each admin with a transition panel applies the named transition through its service."""
        raise TypeError(f"{type(self).__name__} offers a transition panel but does not apply transitions")

    def panel(self, obj, *, buttons: list[dict[str, Any]], fence: int | None, reason_hint: str,
              notes: list[str] = ()) -> dict[str, Any]:
        return {"url": reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_transition", args=[obj.pk]),
                "buttons": buttons, "fence": fence, "reason_hint": reason_hint, "notes": list(notes)}


def transition_message(label: str, action: str, before: str, row, state_attr: str = "mode") -> str:
    fence = getattr(row, "fence", None)
    after = getattr(row, state_attr)
    return f"{label}: {action} applied, {before} → {after}" + (f", fence now {fence}" if fence is not None else "")


# -- inlines --------------------------------------------------------------------------------------------------

class FactInline(NoWrites, admin.TabularInline):
    extra = 0
    can_delete = False

    def get_readonly_fields(self, request, obj=None):
        return self.fields


# -- poison evidence (D-168) ------------------------------------------------------------------------------------

def step_failures(entity) -> SafeString:
    """The StepFailure rows of one item, newest first, then what each of their reasons asks the operator to do
    (CV2-13-001). Every app's held or quarantined item shows this panel; the rows come through the connector's
    poison selector."""
    rows = step_failures_of(entity, limit=STEP_FAILURES_PANEL_LIMIT)
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


STEP_FAILURES_PANEL_LIMIT = 20
step_failures_col = admin.display(description="step failures")(lambda self, obj: step_failures(obj))
