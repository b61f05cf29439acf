"""The cutover console: every phase of a successor activation in order, with its receipts, what blocks the next
phase, and the actions an operator may take there (the same services `manage.py succession` calls).

A form carries the barrier-set state and fence the page showed. A page that went stale (another coordinator or
the command moved the set meanwhile) is refused with an explanation; nothing is applied to the new state. The
actions need `cutover.coordinate_succession`; a user without it sees none, and a forged POST is answered 403.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from connector import hooks
from connector.actors import Actor
from connector.choices import EpochState, GateMode
from connector.errors import ConnectorError
from connector.selectors.rows import (AccountServingGate, ApprovalKind, DualApprovalRequest, OrderingLane,
                              ServingEpoch)
from connector.selectors.rows import APPROVAL_LIVE
from connector.services import approvals
from cutover.choices import BARRIER_SET_OPEN, BarrierSetState
from cutover.selectors import (CutoverDecision, OrderingHandoff, ServiceCutoverAttempt, ServingPublicationBarrierSet,
                               SuccessionDrain)
from cutover.services import fencing, succession, succession_phases

from .forms import SuccessionActionForm, parse
from .access import screen

COORDINATE = "cutover.coordinate_succession"
PHASES = ("barriers", "drain", "halt", "handoffs", "activate", "release")


@dataclass
class Phase:
    key: str
    title: str
    status: str = "pending"  # done | current | blocked | pending
    receipts: list[tuple[str, str]] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)
    actions: list[tuple[str, str]] = field(default_factory=list)  # (action, button label)


def _hex(value) -> str:
    return bytes(value).hex() if value is not None else "—"


def _gates(epoch: ServingEpoch) -> list[AccountServingGate]:
    accounts = epoch.configuration.accounts.values_list("account_id", flat=True)
    return list(AccountServingGate.objects.filter(account_id__in=list(accounts)).select_related("account")
                .order_by("account_id"))


def succession_phases_of(row: ServingPublicationBarrierSet) -> list[Phase]:
    """The six phases of one successor activation, read from the durable facts only."""
    successor, predecessor = row.successor_epoch, row.predecessor_epoch
    committed = row.state == BarrierSetState.ACTIVATION_COMMITTED or successor.state == EpochState.ACTIVE
    gates = _gates(predecessor)
    lanes = OrderingLane.objects.filter(epoch=predecessor).count()
    handoffs = list(OrderingHandoff.objects.filter(barrier_set=row).select_related("account").order_by("pk"))
    is_open = row.state in BARRIER_SET_OPEN

    barriers = Phase("barriers", "Publication barriers", receipts=[
        ("barrier set", f"#{row.pk} {row.state}, fence {row.fence}, holder {row.holder}"),
        ("predecessor", f"{predecessor.epoch_id} ({predecessor.state}) {_hex(row.predecessor_digest)[:16]}…"),
        ("successor", f"{successor.epoch_id} ({successor.state}) {_hex(row.successor_digest)[:16]}…"),
        ("owner receipts digest", _hex(row.owner_receipts_digest))])
    if row.state == BarrierSetState.ACQUIRING:
        barriers.status, barriers.actions = "current", [("hold", "Reread the owners and hold the barriers")]
    elif row.state == BarrierSetState.RELEASED and not committed:
        barriers.status, barriers.blockers = "blocked", [f"released without activation: {row.release_reason}"]
    else:
        barriers.status = "done"
    if is_open:  # a crashed coordinator's set is taken over, never waited out (D-133)
        barriers.actions.append(("takeover", f"Take over the barrier set from {row.holder}"))

    modes: dict[str, int] = {}
    for gate in gates:
        modes[gate.mode] = modes.get(gate.mode, 0) + 1
    drain_row = SuccessionDrain.objects.filter(barrier_set=row).first()
    drain = Phase("drain", "Drain continuation work under v2_serving (the predecessor's new roots refused)",
                  receipts=[("drain", f"#{drain_row.pk} {drain_row.state}, fence {drain_row.fence}"
                             if drain_row else "not open")]
                  + ([("drained inventory", str(drain_row.drained_inventory))]
                     if drain_row and drain_row.drained_inventory is not None else []))
    if committed or (drain_row is not None and drain_row.state == "drained"):
        drain.status = "done"
    elif barriers.status == "done" and is_open and row.state == BarrierSetState.HELD:
        drain.status = "current"
        drain.actions = [("drain", "Close new roots and drain (rerun until the inventory is empty)")]
    halt = Phase("halt", "Halt the predecessor's gates (v2_serving → halting_v2 → v2_halted)",
                 receipts=[("gate modes", ", ".join(f"{m}: {n}" for m, n in sorted(modes.items())))])
    if committed or set(modes) == {GateMode.V2_HALTED}:
        halt.status = "done"
    else:
        halt.blockers = [f"account {g.account}: {reason}" for g in gates if g.mode == GateMode.HALTING_V2
                         for reason in hooks.halt_blockers(g)]
        halt.status = "blocked" if halt.blockers else ("current" if drain.status == "done" else "pending")
        if is_open and drain.status == "done":
            halt.actions = [("halt", "Halt every gate (rerun after open permits settle)")]

    handoff = Phase("handoffs", "Ordering handoffs (one per predecessor lane; the first is the forward-only cutoff)",
                    receipts=[("handed off", f"{len(handoffs)} of {lanes} lanes")]
                    + [(f"{h.account} {h.route}/{h.partition}", f"high-water {h.high_water}") for h in handoffs[:20]])
    if committed or (lanes == len(handoffs) and halt.status == "done"):
        handoff.status = "done"
    elif halt.status == "done":
        handoff.status = "current"
        handoff.blockers = [f"{lanes - len(handoffs)} lane(s) not handed off yet"]
        if is_open:
            handoff.actions = [("handoffs", "Freeze the remaining lanes")]

    activate = Phase("activate", "Successor activation (predecessor active → draining, successor verified → active, "
                                 "every gate v2_halted → v2_serving, one transaction)",
                     receipts=[("successor", f"{successor.epoch_id}: {successor.state}")])
    if committed:
        activate.status = "done"
    elif handoff.status == "done" and row.state == BarrierSetState.HELD:
        activate.status, activate.actions = "current", [("activate", "Activate the successor")]

    release = Phase("release", "Release the publication barriers",
                    receipts=[("barrier set", row.state)] + ([("reason", row.release_reason)]
                                                             if row.release_reason else []))
    if row.state == BarrierSetState.RELEASED:
        release.status = "done" if committed else "blocked"
    elif committed:
        release.status, release.actions = "current", [("release", "Release after readback")]
    elif is_open:
        release.actions = [("release", "Abort: release the barriers" if not handoffs
                            else "Release to replace the candidate (after the cutoff)")]
    return [barriers, drain, halt, handoff, activate, release]


@screen
def cutover(request):
    return cutover_page(request)


def cutover_page(request, *, refused: dict | None = None, status: int = 200):
    """The console; `refused`: a dual-approval request the service refused (subject key, what was typed, the
    error), shown beside that epoch's form with the typed reason and evidence kept."""
    gates = AccountServingGate.objects.select_related("account", "epoch").order_by("account_id")
    modes: dict[str, int] = {}
    for gate in gates:
        modes[gate.mode] = modes.get(gate.mode, 0) + 1
    return render(request, "governance/cutover.html", {
        "gates": gates, "modes": modes, "epochs": ServingEpoch.objects.order_by("-pk")[:10],
        "decisions": CutoverDecision.objects.order_by("-pk")[:10],
        "attempts": ServiceCutoverAttempt.objects.select_related("candidate_epoch").order_by("-pk")[:10],
        "successions": ServingPublicationBarrierSet.objects.select_related("predecessor_epoch", "successor_epoch")
        .filter(predecessor_epoch__isnull=False).order_by("-pk")[:20], "activation_subjects": _activation_subjects(),
        "may_request": request.user.has_perm(approvals.PERMISSION), "refused": refused or {},
        "approvers": _holders(approvals.PERMISSION),
        "nav": "cutover"}, status=status)


def _holders(permission: str) -> list[str]:
    """The active users who hold `permission` (through a group, directly, or as superusers), by name."""
    from django.contrib.auth import get_user_model
    from django.db.models import Q

    app, codename = permission.split(".")
    held = Q(content_type__app_label=app, codename=codename)
    users = get_user_model().objects.filter(
        Q(groups__permissions__in=_permissions(held)) | Q(user_permissions__in=_permissions(held))
        | Q(is_superuser=True), is_active=True).distinct().order_by("username")
    return [u.get_username() for u in users[:20]]


def _permissions(held):
    from django.contrib.auth.models import Permission

    return Permission.objects.filter(held)


def _activation_subjects() -> list[tuple[ServingEpoch, DualApprovalRequest | None]]:
    """Every verified epoch with the live dual-approval request of its activation decision, if any."""
    live = {r.subject_key: r for r in DualApprovalRequest.objects.filter(
        kind=ApprovalKind.ACTIVATION_DECISION, state__in=APPROVAL_LIVE)}
    return [(epoch, live.get(epoch.epoch_id))
            for epoch in ServingEpoch.objects.filter(state=EpochState.VERIFIED).order_by("pk")]


def _act(request, row: ServingPublicationBarrierSet, action: str, reason: str = "") -> str:
    actor = Actor.for_user(request.user)
    if action == "hold":
        row = succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=actor)
        return f"Barrier set #{row.pk} is {row.state}."
    if action == "takeover":
        holder = f"console:{request.user.get_username()}"
        row = fencing.barrier_set_takeover(barrier_set_pk=row.pk, holder=holder, expected_fence=row.fence,
                                           actor=actor)
        return f"Barrier set #{row.pk} ({row.state}) is held by {row.holder} at fence {row.fence}."
    if action == "drain":
        drain, inventory = succession_phases.drain_all(barrier_set=row, actor=actor)
        return (f"Drain #{drain.pk} is {drain.state}"
                + (f"; still open: {inventory.describe()}." if drain.state != "drained" else "."))
    if action == "halt":
        outcome = succession_phases.halt_drained(barrier_set=row, actor=actor)
        return (f"{outcome.done} of {outcome.total} gates v2_halted"
                + (f"; still halting: {'; '.join(outcome.refused)}" if outcome.refused else "."))
    if action == "handoffs":
        outcome = succession_phases.handoff_all(barrier_set=row, actor=actor)
        return (f"{outcome.done} of {outcome.total} lanes handed off"
                + (f"; refused: {'; '.join(outcome.refused)}" if outcome.refused else "."))
    if action == "activate":
        successor, row = succession_phases.activate_and_release(barrier_set=row, expected_fence=row.fence,
                                                                actor=actor)
        return f"{successor.epoch_id} is {successor.state}; barrier set #{row.pk} {row.state}."
    if action == "release":
        reason = reason.strip()
        if not reason:
            raise ValueError("A release needs a reason.")
        replacement = OrderingHandoff.objects.filter(barrier_set=row).exists() and row.state != "activation_committed"
        row = succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence, reason=reason,
                                             replacement=replacement, actor=actor)
        return f"Barrier set #{row.pk} is {row.state}."
    raise ValueError(f"{action!r} is not a console action.")


@screen
@require_http_methods(["GET", "POST"])
def succession_view(request, pk: int):
    row = get_object_or_404(ServingPublicationBarrierSet.objects.select_related(
        "predecessor_epoch__configuration", "successor_epoch").filter(predecessor_epoch__isnull=False), pk=pk)
    may_act = request.user.has_perm(COORDINATE)
    if request.method == "POST":
        if not may_act:
            raise PermissionDenied(f"coordinating a successor activation needs {COORDINATE}")
        form = parse(request, SuccessionActionForm)
        action = form["action"]
        shown = (form["state"], form["fence"])
        if shown != (row.state, row.fence):
            messages.error(request, f"Refused: the page showed barrier set #{row.pk} {shown[0]} at fence {shown[1]}, "
                                    f"but it is now {row.state} at fence {row.fence}. Nothing was applied; review "
                                    "the current phases below and decide again.")
            return redirect("governance:succession", pk=pk)
        allowed = {a for phase in succession_phases_of(row) for a, _ in phase.actions}
        if action not in allowed:
            messages.error(request, f"Refused: {action or 'no action'} is not allowed in the current phase.")
            return redirect("governance:succession", pk=pk)
        try:
            messages.success(request, _act(request, row, action, form["reason"]))
        except ConnectorError as error:
            messages.error(request, f"{error.code}: {error.detail}")
        except ValueError as error:
            messages.error(request, str(error))
        return redirect("governance:succession", pk=pk)
    phases = succession_phases_of(row)
    return render(request, "governance/succession.html", {
        "row": row, "phases": phases, "may_act": may_act,
        "next": next((p for p in phases if p.status in ("current", "blocked")), None), "nav": "cutover"})
