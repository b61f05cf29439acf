"""Bulk remedies (issue 38 item 5, D-490..D-493): an operator selects many board or queue items of one reason — by
checkbox, or "all N of this reason in this account" — and applies the remedy that reason allows in one action.

One action is a loop over the per-item service the single-item screens and `manage.py poison_release` call, each
item in its own transaction with its own guard, state token (fence or change time, as the page showed it) and
audit row: a bulk action is N single decisions, never a set-based write beside them (STYLE R33), and it promises
nothing weaker. An item another operator decided meanwhile is refused by that item's own guard and reported with
its code; the others go on. The result page lists what became of each item (done, or refused with its code).

The remedies: `release` (a poison hold, D-168: `effects.services.poison.poison_release_item`), `replay` (a
quarantined execution: `connector.services.replay.execution_replay`), `resume` (a lane halted at a gap past its
deadline: `connector.services.lanes.lane_resume`) and `remote_call` (a terminal no_effect the policy decided: a
new remote call, `effects.services.intents.remote_call_for_effect`).

A relink (`REMOTE_LINK_CONFLICT`) needs two approvers (D-191), so its bulk remedy is `relink_set` (D-494, which
supersedes D-493): the action on the selected set is ONE dual-approval request for the set
(`effects.services.identity.effect_relink_set_request`), and the result is that request's page, which shows the
set. Once two approvers approved it, the page's apply action (`apply_relink_set`) is again a loop of single
decisions: each member by `effect_relink_apply` under the set's approval, in its own transaction, with its own
state token and audit row, refused alone (APPROVAL_MEMBER_CHANGED) if it changed since it was approved.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from django.contrib import messages
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from connector import statetokens
from connector.actors import Actor
from connector.errors import ConnectorError, FormInvalid, TransitionRefused
from connector.selectors.lanes import execution_remedy
from connector.selectors.rows import Execution, OrderingLane, Receipt
from connector.services import lanes, replay
from effects.selectors import RELEASABLE_KINDS, DeliveryOperation, RemoteEffect, poison_held
from effects.services import identity, intents
from effects.services.poison import poison_release_item

from .access import screen
from .kept import Kept, kept_context
from .reasons import reason as reason_of

RELEASE_PERMISSION = "governance.release_held_item"
LIMIT = 500  # items per action: one page, one request (D-491); "all N" beyond it is taken in turns, oldest first
REPLAY_CODES = ("RESULT_FAILED", "RESULT_REJECTED", "DEPENDENCY_EXPIRED", "DEPENDENCY_REJECTED",
                "EXECUTION_STEP_FAILED")
REMOTE_CALL_CODES = ("RECEIVER_UNREACHABLE", "NO_EFFECT_ATTEMPTS_SPENT")
FIELDS = {"reason": "reason", "evidence_ref": "evidence_ref", "mode": "mode", "item": "items"}


@dataclass(frozen=True)
class Candidate:
    pk: int
    title: str
    account: str  # the account key ("" for an item of no account: a delivery operation)
    token: str  # the state token the page shows and the form carries back ("" where the service takes none)
    url: str


@dataclass(frozen=True)
class Outcome:
    pk: int
    done: bool
    code: str  # "" when done; the refusal's catalog code otherwise (docs/errors.md)
    detail: str


@dataclass(frozen=True)
class BulkRemedy:
    verb: str  # release | replay | resume | remote_call | relink_set
    label: str  # the button's words
    permission: str
    token: str  # "" | "changed_at" | "fence"
    candidates: Callable[[str, str | None], list[Candidate]]
    apply: Callable[..., str]  # (pk, token, code, actor, reason, evidence_ref, mode) -> what was done, or raises


# -- the items each remedy applies to --------------------------------------------------------------------------

def _admin(model: str, pk: int) -> str:
    return reverse(f"admin:{model}_change", args=[pk])


def _held(code: str, account_key: str | None) -> list[Candidate]:
    pks = poison_held(code=code, account_key=account_key)
    kind = RELEASABLE_KINDS[code]
    if kind == "receipt":
        rows = {r.pk: r for r in Receipt.objects.filter(pk__in=pks).select_related("account")
                .only("pk", "channel", "account__account_key")}
        return [Candidate(pk, f"Receipt #{pk} ({rows[pk].channel})", rows[pk].account.account_key, "",
                          reverse("governance:receipt", args=[pk])) for pk in pks if pk in rows]
    if kind == "lane":
        rows = {r.pk: r for r in OrderingLane.objects.filter(pk__in=pks).select_related("account")}
        return [Candidate(pk, f"Lane #{pk} {rows[pk].route}/{rows[pk].partition}", rows[pk].account.account_key, "",
                          reverse("governance:lane", args=[pk])) for pk in pks if pk in rows]
    if kind == "effect":
        rows = {r.pk: r for r in RemoteEffect.objects.filter(pk__in=pks).select_related("account")}
        return [Candidate(pk, f"Effect #{pk} ({rows[pk].state})", rows[pk].account.account_key, "",
                          reverse("governance:effect", args=[pk])) for pk in pks if pk in rows]
    rows = {r.pk: r for r in DeliveryOperation.objects.filter(pk__in=pks).select_related("parent")}
    return [Candidate(pk, f"Delivery #{pk} {rows[pk].parent.parent_key}/{rows[pk].ordinal}", "", "",
                      reverse("governance:delivery", args=[pk])) for pk in pks if pk in rows]


def _quarantined_executions(code: str, account_key: str | None) -> list[Candidate]:
    rows = Execution.objects.filter(state="quarantined", quarantine_reason=code).select_related(
        "projection", "account").order_by("pk")
    if account_key is not None:
        rows = rows.filter(account__account_key=account_key)
    return [Candidate(x.pk, f"Execution #{x.pk} (generation {x.generation})", x.account.account_key,
                      x.changed_at.isoformat(), reverse("governance:execution", args=[x.pk]))
            for x in rows if not execution_remedy(x)]


def _gap_lanes(code: str, account_key: str | None) -> list[Candidate]:
    rows = OrderingLane.objects.filter(state="halted", halt_reason=code).select_related("account").order_by("pk")
    if account_key is not None:
        rows = rows.filter(account__account_key=account_key)
    return [Candidate(x.pk, f"Lane #{x.pk} {x.route}/{x.partition}", x.account.account_key, str(x.fence),
                      reverse("governance:lane", args=[x.pk])) for x in rows]


def _ended_effects(code: str, account_key: str | None) -> list[Candidate]:
    rows = (RemoteEffect.objects.filter(state="no_effect", quarantine_reason=code, successor_intents__isnull=True)
            .select_related("account").order_by("pk"))
    if account_key is not None:
        rows = rows.filter(account__account_key=account_key)
    return [Candidate(x.pk, f"Effect #{x.pk} ({x.state})", x.account.account_key, x.changed_at.isoformat(),
                      reverse("governance:effect", args=[x.pk])) for x in rows]


def _conflicts(code: str, account_key: str | None) -> list[Candidate]:
    rows = (RemoteEffect.objects.filter(state="remote_confirmed", quarantine_reason=code)
            .select_related("account").order_by("pk"))
    if account_key is not None:
        rows = rows.filter(account__account_key=account_key)
    return [Candidate(x.pk, f"Effect #{x.pk} ({x.state}, proven identity {x.remote_id})", x.account.account_key,
                      x.changed_at.isoformat(), reverse("governance:effect", args=[x.pk])) for x in rows]


# -- the per-item services ----------------------------------------------------------------------------------------

def _evidence(reason: str, evidence_ref: str) -> str:
    return f"{reason} [evidence: {evidence_ref}]"


def _release(pk, token, *, code, actor, reason, evidence_ref, mode) -> str:
    if not poison_release_item(code=code, pk=pk, actor=actor, reason=_evidence(reason, evidence_ref)):
        raise TransitionRefused(f"{RELEASABLE_KINDS[code]} {pk} is not held any more (another release came first); "
                                "nothing was released")
    return "released; the next sweep takes it again"


def _replay(pk, token, *, code, actor, reason, evidence_ref, mode) -> str:
    admission = replay.execution_replay(execution_pk=pk, reason=_evidence(reason, evidence_ref), actor=actor,
                                        expected_changed_at=statetokens.timestamp(token))
    return f"replay {admission.request.request_id} ({admission.outcome})"


def _resume(pk, token, *, code, actor, reason, evidence_ref, mode) -> str:
    lanes.lane_resume(lane_pk=pk, mode=mode, evidence=_evidence(reason, evidence_ref), actor=actor,
                      expected_fence=statetokens.integer(token, what="fence"))
    return f"resumed ({mode}) under a new fence"


def _remote_call(pk, token, *, code, actor, reason, evidence_ref, mode) -> str:
    intent = intents.remote_call_for_effect(effect_pk=pk, reason=_evidence(reason, evidence_ref), actor=actor,
                                            expected_changed_at=statetokens.timestamp(token))
    return f"intent {intent.intent_id} ({intent.disposition})"


def _relink_member(pk, token, *, code, actor, reason, evidence_ref, mode, approval_pk: int) -> str:
    effect = identity.effect_relink_apply(effect_pk=pk, evidence=_evidence(reason, evidence_ref), actor=actor,
                                          expected_changed_at=statetokens.timestamp(token), approval_pk=approval_pk)
    return f"relinked under request #{approval_pk}; the effect is {effect.state}"


def _relink_set(pk, token, **_) -> str:  # never looped: a set is requested as one (bulk view, D-494)
    raise TransitionRefused("a set of relinks is requested as one; apply it on its approval page")


def remedy_for(code: str) -> BulkRemedy | None:
    """The bulk remedy the reason allows, or None (a terminal reason, or a person's reconciliation of one item's
    evidence, D-493). A relink's is one dual-approval request for the set (D-494)."""
    if code in RELEASABLE_KINDS:
        return BulkRemedy("release", "Release", RELEASE_PERMISSION, "", _held, _release)
    if code in REPLAY_CODES:
        return BulkRemedy("replay", "Replay", replay.REMEDIATION_PERMISSION, "changed_at", _quarantined_executions,
                      _replay)
    if code == lanes.GAP_DEADLINE:
        return BulkRemedy("resume", "Resume", lanes.PERMISSION, "fence", _gap_lanes, _resume)
    if code in REMOTE_CALL_CODES:
        return BulkRemedy("remote_call", "Authorize a new remote call for", intents.PERMISSION, "changed_at",
                      _ended_effects, _remote_call)
    if code == identity.CONFLICT:
        return BulkRemedy("relink_set", "Request one dual approval to relink", identity.PERMISSION, "changed_at",
                          _conflicts, _relink_set)
    return None


def apply_all(*, code: str, remedy: BulkRemedy, items: list[tuple[int, str]], actor: Actor, reason: str,
              evidence_ref: str, mode: str = "") -> list[Outcome]:
    """Decide each (pk, token) by the remedy's per-item service, in its own transaction, in the order given; a
    refusal of one item is that item's outcome and the loop goes on. Returns one Outcome per item."""
    # A release takes no state token: an item is released only if it was held with this reason when the action
    # began (one read), and its service re-checks the hold under the item's lock.
    held = frozenset(poison_held(code=code)) if remedy.verb == "release" else None
    outcomes = []
    for pk, token in items:
        try:
            if held is not None and pk not in held:
                raise TransitionRefused(f"{RELEASABLE_KINDS[code]} {pk} is not held with {code} (released "
                                        "meanwhile, or never held); nothing was released")
            done = remedy.apply(pk, token, code=code, actor=actor, reason=reason, evidence_ref=evidence_ref,
                                mode=mode)
            outcome = Outcome(pk, True, "", done)
        except ConnectorError as error:
            outcome = Outcome(pk, False, error.code, error.detail)
        except ObjectDoesNotExist:
            outcome = Outcome(pk, False, TransitionRefused.code, f"no item #{pk} of {code}")
        outcomes.append(outcome)
    return outcomes


def apply_relink_set(*, approval_pk: int, items: list[tuple[int, str]], actor: Actor, reason: str,
                     evidence_ref: str) -> list[Outcome]:
    """Apply an approved set of relinks (D-494): each (effect pk, change time the page showed) by
    `effect_relink_apply` under the set's approval, one transaction each (`apply_all`). A member this approval
    already applied is reported as such and not decided again (re-applying is idempotent)."""
    applied = identity.relinked_under(approval_pk, [pk for pk, _ in items])
    remedy = BulkRemedy("relink_apply", "Apply", identity.PERMISSION, "changed_at", _conflicts,
                        partial(_relink_member, approval_pk=approval_pk))
    todo = [(pk, token) for pk, token in items if pk not in applied]
    decided = {o.pk: o for o in apply_all(code=identity.CONFLICT, remedy=remedy, items=todo, actor=actor,
                                          reason=reason, evidence_ref=evidence_ref)}
    return [decided.get(pk) or Outcome(pk, True, "", f"already applied under request #{approval_pk} at "
                                                     f"{applied[pk]:%Y-%m-%d %H:%M:%S}; nothing was done again")
            for pk, _ in items]


# -- the screen ----------------------------------------------------------------------------------------------------

def offers(codes) -> dict[str, BulkRemedy]:
    """The bulk remedy of each of `codes` that has one (the board and the queue link them)."""
    return {code: r for code in codes if (r := remedy_for(code)) is not None}


def _accounts(candidates: list[Candidate]) -> list[tuple[str, int]]:
    return sorted(Counter(c.account for c in candidates if c.account).items())


def _page(request, code: str, remedy: BulkRemedy, *, account: str | None, selected: set[int] | None,
          kept: Kept | None = None, outcomes: list[Outcome] | None = None, status: int = 200):
    everything = remedy.candidates(code, account)
    shown = everything[:LIMIT]
    if kept is not None:  # a refused action: the boxes as they were ticked
        ticked = {v.split("|", 1)[0] for v in request.POST.getlist("item")}
        selected = {int(v) for v in ticked if v.isdigit()}
    may = request.user.has_perm(remedy.permission)
    done = [o for o in outcomes or [] if o.done]
    return render(request, "governance/bulk.html", {
        "code": code, "reason": reason_of(code), "remedy": remedy, "account": account or "",
        "accounts": _accounts(remedy.candidates(code, None)) if account else _accounts(everything),
        "candidates": [(c, selected is None or c.pk in selected) for c in shown], "total": len(everything),
        "limit": LIMIT, "may": may, "modes": ("missing_arrived", "skip_with_evidence"),
        "outcomes": [(o, *_item(code, o.pk)) for o in outcomes or []], "done": len(done),
        "refused": len(outcomes or []) - len(done), "nav": "board", **kept_context(kept)}, status=status)


KIND_PAGES = {"receipt": "governance:receipt", "lane": "governance:lane", "effect": "governance:effect",
              "delivery": "governance:delivery", "execution": "governance:execution"}


def _item(code: str, pk: int) -> tuple[str, str]:
    """(words, url) of one decided item on the result page."""
    kind = (RELEASABLE_KINDS.get(code) or ("execution" if code in REPLAY_CODES else "lane"
                                           if code == lanes.GAP_DEADLINE else "effect"))
    return f"{kind.capitalize()} #{pk}", reverse(KIND_PAGES[kind], args=[pk])


def parse_items(raw: list[str]) -> list[tuple[int, str]] | None:
    """`pk` or `pk|token` per ticked box, each once, in the order posted; None if one is not that shape."""
    items, seen = [], set()
    for value in raw:
        pk, _, token = value.partition("|")
        if not pk.isdigit():
            return None
        if int(pk) not in seen:
            seen.add(int(pk))
            items.append((int(pk), token))
    return items


@screen
@require_http_methods(["GET", "POST"])
def bulk(request):
    """GET: the items of one reason (of one account with `account`; the ticked ones with `pk`, every one without)
    and the form of its bulk remedy. POST: apply it to the ticked items, then the page lists each item's outcome.
    A refused form (no item, no reason or evidence, more than LIMIT items) comes back as typed, nothing applied."""
    source = request.POST if request.method == "POST" else request.GET
    code = source.get("code", "")
    remedy = remedy_for(code)
    if remedy is None:
        error = FormInvalid(f"refused, nothing was applied: {code or 'no reason code'!s} has no bulk remedy")
        return render(request, "governance/refused.html", {"error": error, "fields": {"code": [error.detail]}},
                      status=error.http_status)
    account = source.get("account") or None
    if request.method == "GET":
        pks = {int(p) for p in request.GET.getlist("pk") if p.isdigit()}
        return _page(request, code, remedy, account=account, selected=pks or None)
    if not request.user.has_perm(remedy.permission):
        raise PermissionDenied(f"a bulk {remedy.verb} needs {remedy.permission}")
    kept = Kept.of(request, "bulk", FIELDS)
    items = parse_items(request.POST.getlist("item"))
    if items is None:
        kept.add("item", f"{FormInvalid.code}: an item is not a number; reload the page and select again.")
    elif not items:
        kept.add("item", "Select at least one item.")
    elif len(items) > LIMIT:
        kept.add("item", f"{FormInvalid.code}: at most {LIMIT} items in one action; select fewer.")
    kept.require(reason=f"the reason for this {remedy.label.lower()}", evidence_ref="an evidence reference")
    if remedy.verb == "resume" and request.POST.get("mode") not in ("missing_arrived", "skip_with_evidence"):
        kept.add("mode", "Choose missing_arrived or skip_with_evidence.")
    if kept.errors:
        return _page(request, code, remedy, account=account, selected=None, kept=kept, status=400)
    if remedy.verb == "relink_set":
        return _request_set(request, code, remedy, account=account, items=items, kept=kept)
    outcomes = apply_all(code=code, remedy=remedy, items=items, actor=Actor.for_user(request.user),
                         reason=request.POST["reason"].strip(), evidence_ref=request.POST["evidence_ref"].strip(),
                         mode=request.POST.get("mode", ""))
    return _page(request, code, remedy, account=account, selected=set(), outcomes=outcomes)



def _request_set(request, code: str, remedy: BulkRemedy, *, account, items, kept: Kept):
    """One dual-approval request for the ticked relinks (D-494); its page shows the set. A refusal (a member
    changed since the page was shown, no longer a conflict) requests nothing and comes back as typed."""
    try:
        row = identity.effect_relink_set_request(
            items=[(pk, statetokens.timestamp(token)) for pk, token in items], reason=request.POST["reason"],
            evidence_ref=request.POST["evidence_ref"], actor=Actor.for_user(request.user))
    except ConnectorError as error:
        return _page(request, code, remedy, account=account, selected=None, kept=kept.refused("item", error),
                     status=error.http_status)
    messages.success(request, f"One dual approval requested for the set of {row.members.count()} relinks (request "
                              f"#{row.pk}): two approvers other than you approve or refuse it here, then the "
                              "relinks are applied here.")
    return redirect("governance:approval", pk=row.pk)
