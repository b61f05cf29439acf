"""The cutover console for a V1 -> V2 service cutover attempt: every phase in order with its receipts and
certificates, what blocks the next phase, and the actions allowed there (the same dispatch `manage.py cutover`
uses, cutover.services.cutover_phases). In `v1_stopped`, the V1 effects whose provider call may have started are
listed with a fenced reconciliation form (reason and evidence required).

Every form carries the page's state token (a digest of the attempt outcome, gate modes and fences, decision and
barrier set); a page that went stale is refused with an explanation and nothing is applied. Actions need
`cutover.coordinate_cutover`: a user without it sees none, and a forged POST is answered 403.
"""
from __future__ import annotations

import hashlib

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.selectors.rows import AccountServingGate
from cutover.selectors import ServiceCutoverAttempt
from cutover.ports import v1_owner
from cutover.services import cutover_phases
from cutover.services import decision as decisions
from cutover.services import first_activation, v1_shutdown
from cutover.services.preflight import attempt_account_keys

from .forms import AttemptActionForm, parse
from .access import screen

COORDINATE = cutover_phases.PERMISSION


def state_token(attempt: ServiceCutoverAttempt) -> str:
    ids = sorted(attempt.configuration.accounts.values_list("account_id", flat=True))
    gates = list(AccountServingGate.objects.filter(account_id__in=ids).order_by("account_id")
                 .values_list("account_id", "mode", "fence"))
    decision = decisions.decision_read(attempt.attempt_key)
    row = first_activation.barrier_set_of(attempt)
    text = repr((attempt.outcome, gates, decision and (decision.state, decision.fence),
                 row and (row.state, row.fence)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def in_flight(attempt: ServiceCutoverAttempt) -> list:
    """The V1 effect rows whose provider call may have started (reconcilable in v1_stopped)."""
    if attempt.outcome != "open":
        return []
    return [b for b in v1_owner().inventory(attempt_account_keys(attempt)).blocking
            if b.kind == "io_may_have_started" and b.table == "v1_v1outboundeffect"]


@screen
@require_http_methods(["GET", "POST"])
def attempt_view(request, key: str):
    attempt = get_object_or_404(ServiceCutoverAttempt.objects.select_related("configuration", "candidate_epoch"),
                                attempt_key=key)
    may_act = request.user.has_perm(COORDINATE)
    if request.method == "POST":
        if not may_act:
            raise PermissionDenied(f"coordinating a service cutover needs {COORDINATE}")
        form = parse(request, AttemptActionForm)
        action = form["action"]
        if form["token"] != bytes.fromhex(state_token(attempt)):
            messages.error(request, "Refused: the attempt changed since this page was shown (gates, decision or "
                                    "barrier set moved). Nothing was applied; review the current phases and decide "
                                    "again.")
            return redirect("governance:attempt", key=key)
        actor = Actor.for_user(request.user)
        try:
            if action == "reconcile":
                reason, evidence = form["reason"], form["evidence"]
                if not reason or not evidence:
                    raise ValueError("A reconciliation needs a reason and the provider evidence.")
                row = v1_shutdown.v1_reconcile(
                    attempt_key=key, effect_row_id=form["effect"],
                    outcome=form["outcome"], evidence=evidence.encode(), reason=reason,
                    expected_fences_digest=None, actor=actor)
                messages.success(request, f"V1 effect {row.effect_row_id} reconciled: {row.outcome}.")
            else:
                allowed = {a for phase in cutover_phases.attempt_phases(attempt) for a, _ in phase.actions}
                if action not in allowed:
                    raise ValueError(f"Refused: {action or 'no action'} is not allowed in the current phase.")
                result = cutover_phases.run_action(attempt_key=key, action=action, actor=actor,
                                                   reason=form["reason"])
                messages.success(request, f"{action}: done ({result}).")
        except ConnectorError as error:
            messages.error(request, f"{error.code}: {error.detail}")
        except ValueError as error:
            messages.error(request, str(error))
        return redirect("governance:attempt", key=key)
    phases = cutover_phases.attempt_phases(attempt)
    return render(request, "governance/attempt.html", {
        "attempt": attempt, "phases": phases, "may_act": may_act, "token": state_token(attempt),
        "in_flight": in_flight(attempt), "modes": cutover_phases.gate_modes(attempt),
        "next": next((p for p in phases if p.status in ("current", "blocked")), None), "nav": "cutover"})
