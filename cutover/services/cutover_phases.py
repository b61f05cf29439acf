"""The phases of one V1 -> V2 service cutover attempt, read from the durable facts only, and the single dispatch
of their actions. `manage.py cutover` and the cutover console both use this module, so the command line and the
browser offer exactly the same steps, each a fenced, idempotent service call.

A phase is `done`, `current` (its action is the next step), `blocked` (with the reasons) or `pending`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings

from config.routers import JOURNAL_DB
from connector.actors import Actor
from connector.choices import GateMode
from connector.errors import PermissionRefused
from connector.selectors.rows import AccountServingGate, V1AcceptanceTombstone
from cutover.choices import BarrierSetState, DecisionState
from cutover.models import (
    AttemptOutcome,
    CutoverReadinessCertificate,
    MaintenanceBarrierReceipt,
    OrderingBaseline,
    RestorePointRehearsal,
    ServiceCutoverAttempt,
    V1GenerationReceipt,
    V1Reconciliation,
    V1RestorePoint,
    V1ShutdownCertificate,
)
from cutover.ports import v1_owner
from cutover.services import decision as decisions
from cutover.services import first_activation as fa
from cutover.services import first_activation_recovery as fa_recovery
from cutover.services import restore, restore_point
from cutover.services import v1_shutdown as sd
from cutover.services.preflight import attempt_account_keys

PERMISSION = sd.PERMISSION
DEFAULT_BUDGETS = {"barrier_closure": 120, "drain": 1800, "baseline_capture": 300, "recovery_point_capture": 1800,
                   "restore_rehearsal": 3600, "offline_validation": 1800, "activation_readback": 120,
                   "full_restore": 3600}
ORDER = (GateMode.V1_SERVING, GateMode.HALTING_V1, GateMode.V1_STOPPED, GateMode.V1_DRAINED,
         GateMode.V2_VALIDATING, GateMode.V2_SERVING)


@dataclass
class Phase:
    key: str
    title: str
    status: str = "pending"  # done | current | blocked | pending
    receipts: list[tuple[str, str]] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)
    actions: list[tuple[str, str]] = field(default_factory=list)  # (action, label)


def _hex(value) -> str:
    return bytes(value).hex()[:16] + "…" if value is not None else "—"


def gate_modes(attempt: ServiceCutoverAttempt) -> dict[str, int]:
    ids = list(attempt.configuration.accounts.values_list("account_id", flat=True))
    modes: dict[str, int] = {}
    for mode in AccountServingGate.objects.filter(account_id__in=ids).values_list("mode", flat=True):
        modes[mode] = modes.get(mode, 0) + 1
    return modes


def _reached(modes: dict[str, int], mode: str) -> bool:
    """Every frozen gate is at `mode` or beyond it on the cutover path."""
    rank = {m: i for i, m in enumerate(ORDER)}
    return bool(modes) and all(rank.get(m, -1) >= rank[mode] for m in modes)


def attempt_phases(attempt: ServiceCutoverAttempt) -> list[Phase]:
    modes = gate_modes(attempt)
    closed = attempt.outcome != AttemptOutcome.OPEN
    certificate = CutoverReadinessCertificate.objects.filter(attempt=attempt).first()
    barriers = list(MaintenanceBarrierReceipt.objects.filter(attempt=attempt).order_by("pk"))
    generation = list(V1GenerationReceipt.objects.filter(attempt=attempt))
    shutdown = V1ShutdownCertificate.objects.filter(attempt=attempt).first()
    point = V1RestorePoint.objects.using(JOURNAL_DB).filter(attempt_key=attempt.attempt_key).first()
    rehearsed = point is not None and RestorePointRehearsal.objects.using(JOURNAL_DB).filter(
        restore_point=point).exists()
    decision = decisions.decision_read(attempt.attempt_key)
    barrier_set = fa.barrier_set_of(attempt)
    phases: list[Phase] = []

    p = Phase("certificate", "Readiness certificate (preflight)")
    if certificate:
        p.status = "done"
        p.receipts = [("certificate", _hex(certificate.digest)),
                      ("routes", ", ".join(f"{r['route']}: {r['disposition']}" for r in certificate.routes)),
                      ("projections", ", ".join(f"{k} {v:.0f}s/{certificate.budgets[k]:.0f}s"
                                                for k, v in certificate.projections.items()))]
    else:
        p.actions = [("certify", "Run preflight and write the certificate")]
    phases.append(p)

    p = Phase("barriers", "Owner barriers closed, gates v1_serving → halting_v1",
              receipts=[(f"{r.barrier} {r.action}", _hex(r.digest)) for r in barriers])
    if _reached(modes, GateMode.HALTING_V1):
        p.status = "done"
    elif certificate:
        p.actions = [("close", "Close the owner barriers and halt every gate")]
    phases.append(p)

    p = Phase("drain", "V1 drains, then the exact V1 generation is terminated and isolated (→ v1_stopped)",
              receipts=[(f"generation {r.kind}", f"{r.generation_id} {_hex(r.digest)}") for r in generation])
    if _reached(modes, GateMode.V1_STOPPED):
        p.status = "done"
    elif _reached(modes, GateMode.HALTING_V1) and not closed:
        blocking = [b for b in v1_owner().inventory(attempt_account_keys(attempt)).blocking if b.kind != sd.IN_FLIGHT]
        p.blockers = [f"{b.kind}: {b.table}#{b.row_id} {b.detail}" for b in blocking[:20]]
        p.actions = [("remeasure", "Remeasure against the certificate"), ("stop", "Stop V1 (terminate, isolate)"),
                     ("abort", "Abort: back to v1_serving")]
    phases.append(p)

    reconciled = V1Reconciliation.objects.filter(attempt=attempt).count()
    p = Phase("reconcile", "Reconcile interrupted V1 effects, export tombstones and baselines",
              receipts=[("reconciliations", str(reconciled)),
                        ("tombstones", str(V1AcceptanceTombstone.objects.count())),
                        ("baselines", str(OrderingBaseline.objects.filter(attempt=attempt).count()))])
    if shutdown:
        p.status = "done"
    elif _reached(modes, GateMode.V1_STOPPED) and not closed:
        inventory = v1_owner().inventory(attempt_account_keys(attempt)).blocking
        p.blockers = [f"{b.kind}: {b.table}#{b.row_id} {b.detail}" for b in inventory[:20]]
        p.actions = [("export", "Export tombstones and ordering baselines")]
    phases.append(p)

    p = Phase("shutdown", "V1ShutdownCertificate, gates → v1_drained")
    if shutdown:
        p.status, p.receipts = "done", [("shutdown certificate", _hex(shutdown.digest))]
    elif _reached(modes, GateMode.V1_STOPPED) and not closed:
        p.actions = [("certify_drained", "Certify the drained shutdown")]
    phases.append(p)

    p = Phase("restore_point", "V1RestorePoint captured and rehearsed (journal database)")
    if point:
        p.receipts = [("restore point", _hex(point.digest)), ("dump bytes", str(point.dump_bytes)),
                      ("rehearsed", "yes" if rehearsed else "no")]
    if rehearsed:
        p.status = "done"
    elif shutdown and not closed:
        p.actions = [("rehearse", "Rehearse the restore point")] if point else [
            ("capture", "Capture the restore point")]
        p.actions.append(("cold_abort", "Cold abort: start a new V1 generation"))
    phases.append(p)

    p = Phase("validation", "Validation: gates → v2_validating, CutoverDecision rollback_open")
    if decision is not None:
        p.receipts = [("decision", f"{decision.state}, fence {decision.fence}")]
    if _reached(modes, GateMode.V2_VALIDATING):
        p.status = "done"
    elif rehearsed and not closed:
        p.actions = [("begin_validation", "Begin validation")]
    phases.append(p)

    p = Phase("activation", "First activation: publication barriers held, dual-approved decision, one transaction")
    if barrier_set is not None:
        p.receipts = [("barrier set", f"#{barrier_set.pk} {barrier_set.state}, fence {barrier_set.fence}")]
    if attempt.outcome == AttemptOutcome.V2_COMMITTED:
        p.status = "done"
    elif decision is not None and decision.state == DecisionState.ROLLBACK_OPEN and not closed:
        if barrier_set is None or barrier_set.state == BarrierSetState.RELEASED:
            p.actions = [("hold", "Acquire and hold the publication barriers")]
        elif barrier_set.state in (BarrierSetState.ACQUIRING,):
            p.actions = [("hold", "Reread the owners and hold the barriers")]
        else:
            p.actions = [("activate", "Activate (needs the dual approval of the activation decision)")]
        p.actions.append(("restore", "Full restore of the V1RestorePoint"))
    elif decision is not None and decision.state == DecisionState.ACTIVATING_V2:
        p.status, p.actions = "current", [("activate", "Resume the activation (activation won the decision)")]
    elif decision is not None and decision.state in (DecisionState.RESTORING_V1, DecisionState.V1_RESTORED):
        p.status, p.blockers = "blocked", [f"the restore won the CutoverDecision ({decision.state})"]
        if decision.state == DecisionState.RESTORING_V1:
            p.actions = [("restore", "Resume the restore")]
    phases.append(p)

    if closed:
        for phase in phases:
            if phase.status != "done":
                phase.status, phase.actions = "blocked", []
                phase.blockers = phase.blockers or [f"attempt closed: {attempt.outcome}"]
    else:
        for phase in phases:
            if phase.status == "pending" and (phase.actions or phase.blockers):
                phase.status = "blocked" if phase.blockers and not phase.actions else "current"
                break
    return phases


def _budgets() -> dict:
    return {**DEFAULT_BUDGETS, **getattr(settings, "CUTOVER_BUDGETS", {})}


ACTIONS: dict[str, Callable[[str, Actor, dict], object]] = {
    "certify": lambda k, a, kw: sd.cutover_certify(attempt_key=k, budgets=kw.get("budgets") or _budgets(), actor=a),
    "close": lambda k, a, kw: sd.maintenance_close(attempt_key=k, actor=a),
    "remeasure": lambda k, a, kw: sd.maintenance_remeasure(attempt_key=k, actor=a),
    "abort": lambda k, a, kw: sd.cutover_abort(attempt_key=k, reason=kw.get("reason") or "operator abort", actor=a),
    "stop": lambda k, a, kw: sd.v1_stop(attempt_key=k, actor=a),
    "export": lambda k, a, kw: sd.v1_export(attempt_key=k, actor=a),
    "certify_drained": lambda k, a, kw: sd.v1_certify_drained(attempt_key=k, actor=a),
    "capture": lambda k, a, kw: restore_point.restore_point_capture(attempt_key=k, actor=str(a)),
    "rehearse": lambda k, a, kw: restore_point.restore_point_rehearse(attempt_key=k, actor=str(a)),
    "cold_abort": lambda k, a, kw: restore.cutover_cold_abort(attempt_key=k, actor=a),
    "begin_validation": lambda k, a, kw: restore.cutover_begin_validation(attempt_key=k, actor=a),
    "hold": lambda k, a, kw: (fa.first_activation_acquire(attempt_key=k, actor=a),
                              fa.first_activation_hold(attempt_key=k, actor=a))[1],
    "activate": lambda k, a, kw: fa.first_activation_commit(attempt_key=k, actor=a),
    "restore": lambda k, a, kw: restore.restore_run(attempt_key=k, actor=a),
    # a crashed coordinator's set taken over by this one (its holder), then the CutoverDecision followed (D-302)
    "recover": lambda k, a, kw: fa_recovery.first_activation_recover(
        attempt_key=k, holder=kw.get("holder") or f"{a}", actor=a, release=bool(kw.get("release")),
        reason=kw.get("reason") or ""),
}


def run_action(*, attempt_key: str, action: str, actor: Actor, **kwargs) -> object:
    """Run one phase action through its service (each opens its own transactions and checks its fences)."""
    if action not in ACTIONS:
        raise sd.CutoverPhaseRefused(f"{action!r} is not a cutover action; allowed: {', '.join(ACTIONS)}")
    if actor.user is not None and not actor.user.has_perm(PERMISSION):
        raise PermissionRefused(f"{actor} lacks the {PERMISSION} permission")
    return ACTIONS[action](attempt_key, actor, kwargs)
