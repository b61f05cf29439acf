"""The operator screens' words (issue 38 item 4, D-483, D-484): `{% state code "machine" %}` renders a state or
mode code with its label and one-line explanation (governance.words, from docs/glossary.md); `{% digest value %}`
shortens a 64-hex digest to its first 12 characters, the full value in the title attribute and a copy button (the
skeleton's small inline script copies it)."""
from __future__ import annotations

from django import template
from django.utils.html import format_html

from governance.words import word

register = template.Library()
SHORT = 12


@register.simple_tag
def state(code, machine: str, long: bool = False, text: bool = False):
    """The code as a badge, its label beside it, its explanation in the title (and visible with `long=True`);
    `text=True`: plain "label (code)" where no markup may go (an <option>)."""
    w = word(machine, code)
    shown = w.code or "—"
    if text:
        return f"{w.label} ({shown})"
    if long:
        return format_html('<span class="state" title="{}"><span class="badge">{}</span> {} '
                           '<span class="explain">{}</span></span>', w.explanation, shown, w.label, w.explanation)
    return format_html('<span class="state" title="{}"><span class="badge">{}</span> {}</span>',
                       w.explanation, shown, w.label)


def _hex(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value)


@register.simple_tag
def digest(value):
    """A digest (bytes or hex) in short form with the full value on hover and a copy button; — when absent."""
    full = _hex(value)
    if not full:
        return "—"
    if len(full) <= SHORT:
        return format_html('<code class="mono">{}</code>', full)
    return format_html('<span class="digest"><code class="mono" title="{}">{}…</code> <button type="button" '
                       'class="copy" data-copy="{}" aria-label="Copy the full digest {}">Copy</button></span>',
                       full, full[:SHORT], full, full[:SHORT])


@register.simple_tag
def role_of(user) -> str:
    """The header's role: the user's groups; a superuser without one holds every permission (the demo's
    `operator` login), never "no role"."""
    groups = ", ".join(g.name for g in user.groups.all())
    if user.is_superuser:
        return f"{groups}; superuser: every permission" if groups else "superuser: every permission"
    return groups or "no role"
