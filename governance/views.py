"""Operator screens: overview, approval queue with decision pages, dual-approval attestations, the quarantine and
halt board, and the cutover console. Server-rendered; login required on every page; CSRF on every form. A decision
calls the owning service with the revision (or change time) the page showed, so a page that went stale is refused
with an explanation, never applied to the new state. A user without the permission sees no action, and a forged
POST is answered 403."""
from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.selectors import browse
from connector.selectors.rows import Receipt
from effects.delivery.contract import contract
from effects.selectors import DeliveryOperation, ReceiverCertification, RemoteEffect
from effects.services.delivery import reconciliation as delivery_reconciliation
from effects.services.delivery import setup as delivery_setup
from effects.services.dispatch import effect_reconcile

from . import bulk, selectors
from .access import audit_trail, screen
from .chain import EFFECT_FIELDS, effect_page, execution_or_404, execution_page
from .forms import ApprovalRefusalForm, DeliveryDecisionForm, DigestApprovalForm, EffectDecisionForm, FormRefused, parse
from .kept import Kept
from .reasons import REASONS
from .approval_context import certification_context, filed_requests
from .words import word


def _decide(request, call, *, success: str) -> bool:
    try:
        call()
    except ConnectorError as error:
        messages.error(request, f"{error.code}: {error.detail}")
        return False
    messages.success(request, success)
    return True


# The overview's geometry (D-485): a plot of 600 x 100 units with a left margin for the y axis's ticks and title
# and a bottom margin for the x axis's; every chart has both axes with their units and a caption.
LEFT, TOP, WIDTH, HEIGHT = 64, 10, 600, 100
BOTTOM = TOP + HEIGHT
# One colour per series on the page (D-485): a series drawn in two charts (admitted, completed) keeps its one colour,
# and no two series share one. Each colour has at least 3:1 contrast against white (WCAG 1.4.11).
PALETTE = ("#0b5cad", "#8a4baf", "#1e6b2f", "#b35900", "#b3261e", "#00737a", "#6b6b00", "#5c5c5c", "#a3367d",
           "#2f4b8f", "#7a4a1e", "#3d7a00", "#c2185b", "#005f9e", "#8c6d00", "#4e3a8f", "#1a6f5a", "#9e2a5e")
THROUGHPUT = ("admitted", "materialized", "completed", "effects finalized")


def series_colours(names) -> dict[str, str]:
    """Each distinct series name its own colour, in order of first appearance; more names than colours is a bug."""
    colours: dict[str, str] = {}
    for name in names:
        if name not in colours:
            if len(colours) == len(PALETTE):
                raise ValueError(f"more series than the overview's {len(PALETTE)} colours")
            colours[name] = PALETTE[len(colours)]
    return colours


def _chart(series, colours: dict[str, str]) -> dict:
    """Bar geometry for the last hour (two 4-unit bars per minute, 100 units high at the peak)."""
    peak = max([max(a, c) for _, a, c in series] + [1])
    bars = []
    for i, (minute, admitted, completed) in enumerate(series):
        ah, ch = round(HEIGHT * admitted / peak), round(HEIGHT * completed / peak)
        bars.append({"x": LEFT + 10 * i - 4, "x2": LEFT + 10 * i, "ah": ah, "ay": BOTTOM - ah, "ch": ch,
                     "cy": BOTTOM - ch, "label": f"{minute:%H:%M}: {admitted} admitted, {completed} completed"})
    return {"bars": bars, "peak": peak, "admitted": colours["admitted"], "completed": colours["completed"],
            "active": [(m, a, c) for m, a, c in series if a or c]}


def _lines(series: dict[str, list[tuple[float, float]]], colours: dict[str, str], machine: str) -> dict:
    """Polyline geometry for several series over the same hour: x is the minute (0..60), y scaled to the peak; each
    line with its colour and its words (governance.words: label and explanation of the stage or series)."""
    peak = max([v for points in series.values() for _, v in points] + [1])
    lines = []
    for name, points in series.items():
        coords = " ".join(f"{LEFT + round(x * WIDTH / 60)},{BOTTOM - round(HEIGHT * v / peak)}" for x, v in points)
        last = points[-1][1] if points else 0
        lines.append({"name": name, "points": coords, "colour": colours[name], "last": last,
                      "word": word(machine, name)})
    return {"lines": lines, "peak": peak}


def _pipeline_pictures(pipe: dict, colours: dict[str, str]) -> dict:
    since = pipe["since"]

    def minute_of(taken_at) -> float:
        return max(0.0, min(60.0, (taken_at - since).total_seconds() / 60))

    backlog = {stage: [(minute_of(t), count) for t, count, _ in rows] for stage, rows in pipe["history"].items()}
    age = {stage: [(minute_of(t), seconds) for t, _, seconds in rows] for stage, rows in pipe["history"].items()}
    throughput = {name: [(i, n) for i, n in enumerate(counts)] for name, counts in pipe["throughput"].items()}
    return {"backlog": _lines(backlog, colours, "stage"), "age": _lines(age, colours, "stage"),
            "throughput": _lines(throughput, colours, "throughput")}


@screen
def overview(request):
    data = selectors.overview()
    pipe = selectors.pipeline()
    colours = series_colours([*THROUGHPUT, *pipe["throughput"], *pipe["history"]])
    geometry = {"left": LEFT, "top": TOP, "bottom": BOTTOM, "right": LEFT + WIDTH, "mid": LEFT + WIDTH // 2}
    return render(request, "governance/overview.html", {
        "data": data, "chart": _chart(data["series"], colours), "pipe": pipe,
        "pictures": _pipeline_pictures(pipe, colours), "geometry": geometry, "nav": "overview"})


@screen
def receipt(request, pk: int):
    """One receipt: what was admitted, under which epoch and fence, and why it has (not yet) materialized."""
    receipt_ = get_object_or_404(Receipt.objects.select_related("account", "epoch").defer("epoch__preimage",
                                                                                          "payload"), pk=pk)
    return render(request, "governance/receipt.html", {
        "receipt": receipt_, "status": selectors.receipt_status(receipt_),
        "components": list(receipt_.components.order_by("ordinal").values("ordinal", "disposition", "reason_code",
                                                                          "event_id")[:100]),
        "chain": browse.receipt_chain(pk), "nav": "receipts"})


@screen
def queue(request):
    items = selectors.queue()
    counts: dict[str, int] = {}
    for item in items:
        counts[item.code] = counts.get(item.code, 0) + 1
    offers = bulk.offers(counts)
    return render(request, "governance/queue.html", {
        "items": items, "bulk": [(code, remedy, counts[code]) for code, remedy in offers.items()],
        "bulk_codes": set(offers), "nav": "queue"})


@screen
def board(request):
    groups = selectors.board()
    offers = bulk.offers(groups)
    return render(request, "governance/board.html", {
        "groups": groups, "grouped": [(code, items, offers.get(code)) for code, items in groups.items()],
        "reasons": REASONS, "nav": "board"})


# -- an uncertain remote effect -----------------------------------------------------------------------------------

@screen
@require_http_methods(["GET", "POST"])
def effect(request, pk: int):
    effect_ = get_object_or_404(RemoteEffect.objects.select_related("command", "account"), pk=pk)
    may_decide = request.user.has_perm("effects.reconcile_effect")
    if request.method == "POST":
        if not may_decide:
            raise PermissionDenied("reconciling an effect needs effects.reconcile_effect")
        kept = Kept.of(request, "decide", EFFECT_FIELDS["decide"])
        try:
            form = parse(request, EffectDecisionForm)
        except FormRefused as refused:  # the page again, as typed (issue 38 item 3)
            return effect_page(request, effect_, kept.form_refused(refused))
        decision = form["decision"]
        try:
            effect_reconcile(effect_pk=pk, decision=decision,
                             evidence=f"{form['reason']} [evidence: {form['evidence_ref']}]",
                             actor=Actor.for_user(request.user), remote_id=form["remote_id"],
                             expected_changed_at=form["changed_at"])
        except ConnectorError as error:
            return effect_page(request, effect_, kept.refused("decision", error))
        messages.success(request, f"Effect #{pk}: {decision} recorded.")
        return redirect("governance:queue")
    return effect_page(request, effect_)


# -- a quarantined execution ---------------------------------------------------------------------------------------

@screen
def execution(request, pk: int):
    """Evidence and the owner's remediation for a quarantined execution. There is no transition to take here: a
    quarantined execution stays immutable; remediation is a replay (offered here, with whether it would run), a
    successor or a corrected generation made by its owner (the seed's "Operational liveness")."""
    return execution_page(request, execution_or_404(pk))


# -- a delivery operation waiting for reconciliation ------------------------------------------------------------

@screen
@require_http_methods(["GET", "POST"])
def delivery(request, pk: int):
    op = get_object_or_404(DeliveryOperation.objects.select_related("parent", "binding", "profile"), pk=pk)
    may_decide = request.user.has_perm("effects.reconcile_delivery")
    if request.method == "POST":
        if not may_decide:
            raise PermissionDenied("reconciling a delivery needs effects.reconcile_delivery")
        actor = Actor.for_user(request.user)
        form = parse(request, DeliveryDecisionForm)
        target, reconciliation_id, note = form["target"], form["reconciliation_id"], form["reason"]
        if target.startswith("reconciling_"):
            call = lambda: delivery_reconciliation.reconcile_open(  # noqa: E731
                actor=actor, operation_pk=pk, reconciliation_id=reconciliation_id, note=note,
                expected_revision=form["revision"])
        else:
            call = lambda: delivery_reconciliation.reconcile_resolve(  # noqa: E731
                actor=actor, operation_pk=pk, reconciliation_id=reconciliation_id, target=target,
                proof=form["proof"], note=note, expected_revision=form["revision"])
        if _decide(request, call, success=f"Delivery #{pk}: moved to {target}."):
            op.refresh_from_db()
            return redirect("governance:delivery" if op.state.startswith("reconciling_") else "governance:queue",
                            **({"pk": pk} if op.state.startswith("reconciling_") else {}))
        return redirect("governance:delivery", pk=pk)
    c = contract()
    moves = [t for t in c.transitions if t.source == op.state and t.operator_only]
    return render(request, "governance/delivery.html", {
        "op": op, "axes": [(name, "axis_" + name.replace(" ", "_"), value) for name, value in zip(
            ("execution", "remote effect", "acknowledgement", "verification", "checkpoint"), c.tuples[op.state])],
        "attempts": list(op.attempts.order_by("ordinal")), "observations": list(op.observations.order_by("ordinal")),
        "reconciliations": list(op.reconciliations.select_related("approved_by")), "moves": moves,
        "error": c.errors.get(op.last_code), "may_decide": may_decide, "audit": audit_trail(op), "nav": "queue"})


# -- dual-approval attestations -----------------------------------------------------------------------------------

@screen
def attestations(request):
    return render(request, "governance/attestations.html", {
        "pending": selectors.attestations(), "due": selectors.recertification_due(),
        "filed": filed_requests(), "nav": "attestations"})


@screen
@require_http_methods(["GET", "POST"])
def attestation(request, pk: int):
    cert = get_object_or_404(ReceiverCertification.objects.select_related("binding", "requested_by", "refused_by"),
                             pk=pk)
    may_approve = request.user.has_perm("effects.approve_certification")
    if request.method == "POST":
        if not may_approve:
            raise PermissionDenied("deciding a certification needs effects.approve_certification")
        if request.POST.get("action") == "refuse":  # D-464
            form = parse(request, ApprovalRefusalForm)
            try:
                delivery_setup.certification_refuse(actor=Actor.for_user(request.user), certification=cert,
                                                    digest_seen=form["digest"], reason=form["reason"])
            except ConnectorError as error:
                return _attestation_page(request, cert, status=error.http_status, refusal={
                    "error": f"{error.code}: {error.detail}", "reason": form["reason"]})
            messages.success(request, f"Refused: certification #{pk} is ended and can no longer be approved.")
            return redirect("governance:attestation", pk=pk)
        seen = parse(request, DigestApprovalForm)["digest"]
        if _decide(request, lambda: delivery_setup.certification_approve(
                actor=Actor.for_user(request.user), certification=cert, digest_seen=seen),
                success=f"Approval of certification #{pk} recorded."):
            return redirect("governance:attestations")
        return redirect("governance:attestation", pk=pk)
    return _attestation_page(request, cert)


def _attestation_page(request, cert, *, refusal: dict | None = None, status: int = 200):
    may_approve = request.user.has_perm("effects.approve_certification")
    digest = delivery_setup.certification_subject_digest(cert)
    approvals = list(cert.approvals.select_related("approver").order_by("pk"))
    already = any(a.approver_id == request.user.pk for a in approvals)
    pending, is_requester = cert.state == "pending_approval", cert.requested_by_id == request.user.pk
    return render(request, "governance/attestation.html", {
        "cert": cert, "digest": digest.hex(), "context": certification_context(cert),
        "approvals": [(a, bytes(a.digest_seen) == digest) for a in approvals], "refusal": refusal or {},
        "may_approve": may_approve and pending and not already and not is_requester,
        "may_refuse": may_approve and pending and not is_requester, "already": already,
        "is_requester": is_requester, "nav": "attestations"}, status=status)


def method_not_allowed(request):  # pragma: no cover - routing helper
    return HttpResponseNotAllowed(["GET"])
