"""Lists of receipts, lanes, executions and remote effects outside the Django admin (issue 38 item 2, D-470):
filtered by account, state, reason code and age, newest first, one keyset page at a time (`before` = the last pk
shown), each row a link into the chain. The reads are the owners' selectors (connector.selectors.browse,
effects.selectors); a malformed filter value narrows nothing and is named on the page, never a 500."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django import forms
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode

from connector.choices import ExecutionState, LaneState
from connector.selectors import browse
from connector.selectors.rows import ConnectorAccount
from effects.choices import EffectState
from effects.selectors import effect_list

from .access import screen
from .words import word

AGES = [("", "any age"), ("5", "older than 5 minutes"), ("60", "older than 1 hour"),
        ("1440", "older than 1 day"), ("10080", "older than 7 days")]


class ListFilterForm(forms.Form):
    """The query string of a list page; every field optional."""

    account = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    state = forms.ChoiceField(required=False)
    reason = forms.RegexField(required=False, regex=r"^[A-Z0-9_]{1,64}$", strip=True)
    older_than = forms.TypedChoiceField(required=False, choices=AGES, coerce=int, empty_value=None)
    lane = forms.IntegerField(required=False, min_value=1)
    before = forms.IntegerField(required=False, min_value=1)

    def __init__(self, data, *, states, machine: str):
        super().__init__(data)
        self.fields["account"].choices = [("", "every account")] + [
            (str(pk), key) for pk, key in ConnectorAccount.objects.order_by("account_key").values_list("pk",
                                                                                                     "account_key")]
        self.fields["state"].choices = [("", "every state")] + [  # in words (governance.words, D-483)
            (s, f"{word(machine, s).label} ({s})") for s in states]

    def filters(self) -> browse.Filters:
        self.is_valid()  # an invalid field is left out of cleaned_data: it narrows nothing
        data = self.cleaned_data
        return browse.Filters(account=data.get("account"), state=data.get("state") or "",
                              reason=data.get("reason") or "", older_than=data.get("older_than"),
                              lane=data.get("lane"), before=data.get("before"))


def _effect_page(filters: browse.Filters) -> browse.Page:
    rows = effect_list(account=filters.account, state=filters.state, reason=filters.reason, cutoff=filters.cutoff(),
                       before=filters.before, size=browse.PAGE_SIZE + 1)
    return browse.Page(rows[:browse.PAGE_SIZE],
                       rows[browse.PAGE_SIZE - 1].pk if len(rows) > browse.PAGE_SIZE else None)


@dataclass(frozen=True)
class ListPage:
    """One list screen: its title, the states its filter offers and the selector that reads one page."""

    title: str
    states: tuple[str, ...]
    machine: str  # the state machine whose glossary labels the state filter shows
    read: Callable[[browse.Filters], browse.Page]


LISTS = {
    "receipts": ListPage("Receipts", tuple(browse.RECEIPT_STATES), "receipt", browse.receipt_list),
    "executions": ListPage("Executions", tuple(ExecutionState.values), "execution", browse.execution_list),
    "lanes": ListPage("Ordering lanes", tuple(LaneState.values), "lane", browse.lane_list),
    "effects": ListPage("Remote effects", tuple(EffectState.values), "effect", _effect_page),
}


@screen
def list_page(request, name: str):
    """Any of the four lists: the filter form, one keyset page, and the links to the next and first page."""
    spec = LISTS[name]
    form = ListFilterForm(request.GET, states=spec.states, machine=spec.machine)
    page = spec.read(form.filters())
    kept = {k: v for k, v in request.GET.items() if k != "before" and v}
    next_url = (f"{request.path}?{urlencode({**kept, 'before': page.next_before})}"
                if page.next_before is not None else "")
    first_url = f"{request.path}?{urlencode(kept)}" if request.GET.get("before") else ""
    return render(request, f"governance/list_{name}.html",
                  {"title": spec.title, "nav": name, "page": page, "form": form, "states": spec.states,
                   "ages": AGES, "values": kept, "next_url": next_url, "first_url": first_url,
                   "invalid": form.errors})


def list_url(name: str, **filters) -> str:
    """The URL of a list narrowed by `filters` (e.g. a lane's executions)."""
    return reverse(f"governance:{name}") + (f"?{urlencode(filters)}" if filters else "")
