"""The V1 -> V2 service cutover up to `v1_drained` (seed "Offline V1 shutdown", steps 1-5; CV2-12-012..049).

Phases, each an idempotent service (rerunning a finished phase changes nothing):

1. `cutover_open` + `cutover_certify`: the attempt and its immutable CutoverReadinessCertificate (preflight;
   cutover.services.preflight, re-exported here).
2. `maintenance_close`: owner barriers closed (receipts), then one transaction locks and byte-compares the
   certificate, requires the exhaustive one-to-one gate set and moves every gate `v1_serving -> halting_v1`.
3. `maintenance_remeasure`: the workload against the certificate; a breach takes `cutover_abort` (fenced
   `halting_v1 -> v1_serving`, barriers reopened) before any termination.
4. `v1_stop`: after the live inventory first reaches zero, terminate and egress-isolate the exact V1 generation
   (receipts) and move every gate `halting_v1 -> v1_stopped`.
5. `v1_reconcile` (fenced, in `v1_stopped` only), `v1_export` (tombstones and OrderingBaselines) and
   `v1_certify_drained` (second inventory under the same gate locks, the V1ShutdownCertificate, every gate
   `v1_stopped -> v1_drained`).

The coordinator never imports `v1`: it talks to `cutover.ports.v1_owner()`. Gates are locked FOR UPDATE in
ascending account id (docs/locking.md); owner calls that wait (barrier closes) happen before those transactions.
"""
from __future__ import annotations

import hashlib
import hmac
from decimal import Decimal

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from connector.actors import Actor
from connector.choices import EpochState, GateMode
from connector.faults import fault_point
from connector.selectors.locks import owner_barriers_lock
from connector.selectors.rows import AccountServingGate, ConnectorAccount, Receipt, ServingEpoch, V1AcceptanceTombstone
from connector.services.audit import audit_record
from connector.services.tombstones import tombstones_import
from cutover.errors import CutoverPhaseRefused, DrainBlocked, OrderingPlanDrifted
from cutover.models import (
    AttemptOutcome,
    CutoverReadinessCertificate,
    MaintenanceBarrierReceipt,
    OrderingBaseline,
    ServiceCutoverAttempt,
    V1GenerationReceipt,
    V1Reconciliation,
    V1ShutdownCertificate,
)
from cutover.ports import BarrierKind, Receipt as OwnerReceipt, v1_owner
from cutover.services import approval_subjects, ordering_plan, v2_artifacts
from cutover.services.preflight import (  # noqa: F401  (phase 1 and the shared helpers, re-exported)
    BARRIER_ORDER,
    BUDGET_PHASES,
    IN_FLIGHT,
    PERMISSION,
    SAFETY_FACTOR,
    SECONDS_PER_BACKLOG_ITEM,
    account_set,
    attempt_account_keys,
    attempt_get,
    certificate_locked,
    cutover_certify,
    cutover_open,
    evidence_digest,
    frozen_gates,
    gates_move,
    measure,
    modes_of,
    project,
    receipt_verify,
    require_coordinator,
    require_open,
)


# -- 2./3. barriers, halt, remeasure, abort -------------------------------------------------------------------

def _barrier_receipt(attempt, kind: BarrierKind, action: str, receipt: OwnerReceipt) -> None:
    receipt_verify(receipt, attempt, f"barrier.{kind.value}.{'closed' if action == 'closed' else 'open'}",
                    kind.value)
    MaintenanceBarrierReceipt.objects.get_or_create(
        attempt=attempt, barrier=kind.value, action=action,
        defaults={"owner_kind": receipt.kind, "subject": receipt.subject, "payload": receipt.payload,
                  "digest": receipt.digest})


def l2_frozen_by() -> str | None:
    """The key of the open cutover attempt whose V1 authoring barrier is closed (and not reopened), if any: while
    it is, the L2 configuration owner is frozen at the attempt's generation (CV2-12-024, D-291): no account is
    created and no configuration generation published (`first_activation.publication_guard`). It thaws when
    the barrier is reopened (the halting abort) or the attempt closes (aborted, restored, v2_committed)."""
    closed = MaintenanceBarrierReceipt.objects.filter(attempt_id=OuterRef("pk"), barrier=BarrierKind.AUTHORING.value)
    return (ServiceCutoverAttempt.objects.filter(outcome=AttemptOutcome.OPEN)
            .filter(Exists(closed.filter(action="closed")), ~Exists(closed.filter(action="reopened")))
            .values_list("attempt_key", flat=True).first())


def maintenance_close(*, attempt_key: str, actor: Actor) -> int:
    """Requires the dual approval of the readiness certificate. Close every owner barrier (each close waits for the transactions crossing it), store the receipts, then
    halt every frozen gate `v1_serving -> halting_v1`. Returns the gates moved now."""
    require_coordinator(actor)
    attempt = attempt_get(attempt_key)
    require_open(attempt)
    approval_subjects.require("readiness_certificate", attempt.attempt_key)  # fail fast, before any barrier
    # Offline, before any barrier closes: the V2 schema, binary, epoch and configuration are exactly the
    # certificate's and V2 is disabled (CV2-12-019); a mismatch refuses with nothing changed.
    v2_artifacts.offline_verify(attempt, CutoverReadinessCertificate.objects.get(attempt=attempt))
    owner = v1_owner()
    for kind in BARRIER_ORDER:
        receipt = owner.close_barrier(kind, attempt.attempt_key)
        with transaction.atomic():
            if kind == BarrierKind.AUTHORING:
                # The L2 freeze starts with this receipt (D-291): an account or configuration write already past
                # its owner barrier commits first, every later one reads the closed barrier and is refused.
                owner_barriers_lock(["configuration"], exclusive=True)
            _barrier_receipt(attempt, kind, "closed", receipt)
    with transaction.atomic():
        certificate = certificate_locked(attempt)
        approval_subjects.require("readiness_certificate", attempt.attempt_key)  # held until the gates moved
        gates = frozen_gates(attempt)
        v2_artifacts.offline_verify(attempt, certificate)  # again, under the certificate and gate locks
        if modes_of(gates) - {GateMode.V1_SERVING, GateMode.HALTING_V1}:
            raise CutoverPhaseRefused("every frozen gate must be v1_serving or halting_v1 to halt")
        return gates_move(gates, source=GateMode.V1_SERVING, action="halt_v1", actor=actor, attempt=attempt,
                     evidence=bytes(certificate.digest))


def maintenance_remeasure(*, attempt_key: str, actor: Actor) -> list[str]:
    """Remeasure the actual workload against the certificate's budgets (after the barriers closed). Returns the
    breaches; a breach takes the fenced abort at once (CV2-12-033/089)."""
    require_coordinator(actor)
    attempt = attempt_get(attempt_key)
    require_open(attempt)
    certificate = CutoverReadinessCertificate.objects.get(attempt=attempt)
    workload, unreadable = measure(attempt, v1_owner(), attempt_account_keys(attempt))
    now = project(workload, certificate.budgets, certificate.measurements["rehearsal"])
    breaches = [f"{p}: projected {now[p]:.1f}s > budget {certificate.budgets[p]}s" for p in BUDGET_PHASES
                if now[p] > certificate.budgets[p]] + unreadable
    if breaches:
        cutover_abort(attempt_key=attempt_key, reason="budget breach: " + "; ".join(breaches), actor=actor)
    return breaches


def v2_stopped_proof(attempt: ServiceCutoverAttempt) -> list[str]:
    """Why V2 is not provably stopped for the attempt's accounts (empty = stopped)."""
    problems = []
    if ServingEpoch.objects.filter(state=EpochState.ACTIVE).exists():
        problems.append("a ServingEpoch is active")
    ids = [i for i, _ in account_set(attempt.configuration)]
    if Receipt.objects.filter(account_id__in=ids).exists():
        problems.append("a V2 receipt exists for the attempt's accounts")
    return problems


def cutover_abort(*, attempt_key: str, reason: str, actor: Actor) -> int:
    """The fenced abort `halting_v1 -> v1_serving`, only before termination/isolation receipts exist, after proving
    V2 stopped and reopening the owner barriers; closes the attempt `aborted` (CV2-12-034)."""
    require_coordinator(actor)
    attempt = attempt_get(attempt_key)
    require_open(attempt)
    if V1GenerationReceipt.objects.filter(attempt=attempt).exists():
        raise CutoverPhaseRefused("V1 was terminated or isolated: the halting abort is no longer allowed "
                                  "(cold abort after v1_drained, or restore)")
    stopped = v2_stopped_proof(attempt)
    if stopped:
        raise CutoverPhaseRefused("V2 is not provably stopped: " + "; ".join(stopped))
    owner = v1_owner()
    for kind in reversed(BARRIER_ORDER):
        receipt = owner.reopen_barrier(kind, attempt.attempt_key)
        with transaction.atomic():
            _barrier_receipt(attempt, kind, "reopened", receipt)
    with transaction.atomic():
        locked = attempt_get(attempt_key, lock=True)
        gates = frozen_gates(locked)
        if modes_of(gates) - {GateMode.V1_SERVING, GateMode.HALTING_V1}:
            raise CutoverPhaseRefused("only halting_v1 gates can take the abort")
        moved = gates_move(gates, source=GateMode.HALTING_V1, action="abort_halt_v1", actor=actor, attempt=locked,
                      evidence=None)
        locked.outcome, locked.closed_at = AttemptOutcome.ABORTED, timezone.now()
        locked.save(update_fields=["outcome", "closed_at"])
        audit_record(actor=actor, entity=locked, action="cutover_abort", from_state=AttemptOutcome.OPEN,
                     to_state=AttemptOutcome.ABORTED, reason=reason)
    return moved


# -- 4. stop -----------------------------------------------------------------------------------------------------

def v1_stop(*, attempt_key: str, actor: Actor) -> int:
    """After the live V1 inventory first reaches zero: terminate and isolate the exact V1 generation (receipts),
    then move every frozen gate `halting_v1 -> v1_stopped` binding both receipts (CV2-12-037..039). Refuses with
    DRAIN_BLOCKED (retryable) while anything blocks."""
    require_coordinator(actor)
    attempt = attempt_get(attempt_key)
    require_open(attempt)
    owner = v1_owner()
    with transaction.atomic():
        if modes_of(frozen_gates(attempt)) - {GateMode.HALTING_V1, GateMode.V1_STOPPED}:
            raise CutoverPhaseRefused("stop needs every frozen gate halting_v1 (close the barriers first)")
    done = {r.kind for r in V1GenerationReceipt.objects.filter(attempt=attempt)}
    if not done:
        # Zero accepted work left for V1 to do; a provider call in flight is interrupted by the termination and
        # becomes `v1_stopped` reconciliation work (CV2-12-040/080, decision D-137).
        blocking = [b for b in owner.inventory(attempt_account_keys(attempt)).blocking if b.kind != IN_FLIGHT]
        if blocking:
            raise DrainBlocked(f"{len(blocking)} V1 rows block the drain: " + ", ".join(
                f"{b.kind} {b.table}#{b.row_id}" for b in blocking[:10]))
    for kind, call, owner_kind in (("terminated", owner.terminate_generation, "generation.terminated"),
                                   ("isolated", owner.isolate_egress, "egress.isolated")):
        if kind in done:
            continue
        receipt = call(attempt.v1_generation_id, attempt.attempt_key)
        receipt_verify(receipt, attempt, owner_kind, attempt.v1_generation_id)
        with transaction.atomic():
            V1GenerationReceipt.objects.get_or_create(attempt=attempt, kind=kind, defaults={
                "generation_id": attempt.v1_generation_id, "payload": receipt.payload, "digest": receipt.digest})
    receipts = evidence_digest("stop_receipts", [bytes(r.digest).hex() for r in
                                                 V1GenerationReceipt.objects.filter(attempt=attempt).order_by("kind")])
    with transaction.atomic():
        gates = frozen_gates(attempt)
        if modes_of(gates) - {GateMode.HALTING_V1, GateMode.V1_STOPPED}:
            raise CutoverPhaseRefused("every frozen gate must be halting_v1 to stop")
        return gates_move(gates, source=GateMode.HALTING_V1, action="stop_v1", actor=actor, attempt=attempt,
                     evidence=receipts[1])


def _stopped_gates(attempt: ServiceCutoverAttempt) -> list[AccountServingGate]:
    gates = frozen_gates(attempt)
    if modes_of(gates) != {GateMode.V1_STOPPED}:
        raise CutoverPhaseRefused("every frozen gate must be v1_stopped; modes: " + ", ".join(sorted(modes_of(gates))))
    return gates


def gate_fences_digest(gates) -> bytes:
    return evidence_digest("gate_fences", [[g.account_id, g.mode, g.fence] for g in gates])[1]


# -- 5. reconcile, export, certify -------------------------------------------------------------------------------

def v1_reconcile(*, attempt_key: str, effect_row_id: str, outcome: str, evidence: bytes, reason: str,
                 expected_fences_digest: bytes | None, actor: Actor) -> V1Reconciliation:
    """A fenced `v1_stopped` reconciliation (CV2-12-040..042/092): lock the same gate rows certification locks,
    require them `v1_stopped` at the fences the caller saw, and append the evidence while the V1 owner
    terminalizes its row in this same transaction. No V1 execution or restart happens here."""
    require_coordinator(actor)
    if not evidence or not reason.strip():
        raise CutoverPhaseRefused("a reconciliation needs evidence bytes and a reason")
    attempt = attempt_get(attempt_key)
    require_open(attempt)
    with transaction.atomic():
        gates = _stopped_gates(attempt)
        fences = gate_fences_digest(gates)
        if expected_fences_digest is not None and not hmac.compare_digest(fences, bytes(expected_fences_digest)):
            raise CutoverPhaseRefused("the gate fences changed since the page was read; reload")
        if V1ShutdownCertificate.objects.filter(attempt=attempt).exists():
            raise CutoverPhaseRefused("the shutdown certificate is written: no reconciliation after it")
        receipt = v1_owner().reconcile_effect(effect_row_id, outcome, evidence, attempt.attempt_key)
        row = V1Reconciliation.objects.create(
            attempt=attempt, effect_row_id=effect_row_id, outcome=outcome,
            evidence_digest=hashlib.sha256(evidence).digest(), gate_fences_digest=fences,
            receipt_digest=receipt.digest, reason=reason, actor=str(actor))
        audit_record(actor=actor, entity=attempt, action="v1_reconcile", evidence_digest=receipt.digest,
                     reason=f"V1 effect {effect_row_id}: {outcome}: {reason}")
    return row


def v1_export(*, attempt_key: str, actor: Actor) -> tuple[int, int]:
    """Export every accepted V1 transport identity as a ReceiptAdmissionKey tombstone (byte-compared) and every
    order-dependent route's OrderingBaseline from the drained V1 high-water. Idempotent. Returns (tombstones,
    baselines) created now."""
    require_coordinator(actor)
    attempt = attempt_get(attempt_key)
    require_open(attempt)
    owner = v1_owner()
    keys = attempt_account_keys(attempt)
    identities = owner.transport_identities(keys)
    waters = owner.high_waters(keys)
    accounts = dict(ConnectorAccount.objects.filter(account_key__in=keys).values_list("account_key", "pk"))
    with transaction.atomic():
        _stopped_gates(attempt)
        # The capture executes the certified plan, recomputed and byte-compared first (D-312, CV2-06-023/028).
        plan = ordering_plan.plan_revalidate(attempt, certificate_locked(attempt))
        imported = tombstones_import(rows=[{
            "account": i.account_key, "channel": i.source_key, "transport_key": i.transport_identity.decode(),
            "payload_digest": i.payload_digest, "predecessor_ref": i.predecessor_ref} for i in identities],
            actor=actor)
        created = 0
        for water in waters:
            disposition = _baselined(plan, water)
            if disposition is None:
                continue
            _, new = OrderingBaseline.objects.get_or_create(
                attempt=attempt, account_id=accounts[water.account_key], route_key=water.route_key,
                partition=water.partition_key.decode(),
                defaults={"high_water": Decimal(water.high_water.decode()), "comparator": water.comparator,
                          "origin": disposition})
            created += new
    return imported.created, created


def _baselined(plan: dict[str, dict], water) -> str | None:
    """The certified disposition of a high-water's route when it needs a baseline (an enabled order-dependent
    route), else None. A high-water of an uncertified route, or one whose comparator is not the certified one (an
    enqueue ordinal or arrival order passed off as a position), refuses: never substituted (CV2-06-021)."""
    entry = plan.get(water.route_key)
    if entry is None:
        raise OrderingPlanDrifted(f"high-water of route {water.route_key} has no certified disposition")
    if entry["disposition"] not in ordering_plan.ORDERED or not entry["enabled"]:
        return None
    if water.comparator != entry["source_order"]["comparator"]:
        raise OrderingPlanDrifted(f"high-water of route {water.route_key}/{water.partition_key.decode()} is "
                                  f"compared by {water.comparator!r}, certified {entry['source_order']['comparator']!r}")
    return entry["disposition"]


def coverage(attempt: ServiceCutoverAttempt) -> tuple[list[str], bytes, bytes]:
    """(gaps, tombstone coverage digest, baseline coverage digest): every transport identity has its tombstone with
    the same digest and predecessor; every drained high-water of a v1_high_water route has its baseline."""
    owner = v1_owner()
    keys = attempt_account_keys(attempt)
    gaps: list[str] = []
    tombstones = {(t.account.account_key, t.channel, t.transport_key): t for t in
                  V1AcceptanceTombstone.objects.filter(account__account_key__in=keys).select_related("account")}
    covered = []
    for i in owner.transport_identities(keys):
        t = tombstones.get((i.account_key, i.source_key, i.transport_identity.decode()))
        if t is None or bytes(t.payload_digest) != i.payload_digest or t.predecessor_ref != i.predecessor_ref:
            gaps.append(f"identity {i.account_key}/{i.transport_identity.decode()} has no exact tombstone")
        else:
            covered.append([i.account_key, i.transport_identity.decode(), i.payload_digest.hex()])
    baselines = {(b.account.account_key, b.route_key, b.partition): b for b in
                 OrderingBaseline.objects.filter(attempt=attempt).select_related("account")}
    ordered = []
    plan = {r["route"]: r for r in CutoverReadinessCertificate.objects.get(attempt=attempt).routes}
    for w in owner.high_waters(keys):
        if _baselined(plan, w) is None:
            continue
        b = baselines.get((w.account_key, w.route_key, w.partition_key.decode()))
        if b is None or str(int(b.high_water)) != w.high_water.decode():
            gaps.append(f"route {w.route_key}/{w.partition_key.decode()} of {w.account_key} has no exact baseline")
        else:
            ordered.append([w.account_key, w.route_key, w.partition_key.decode(), w.high_water.decode()])
    return gaps, evidence_digest("tombstones", covered)[1], evidence_digest("baselines", ordered)[1]


def v1_certify_drained(*, attempt_key: str, actor: Actor) -> V1ShutdownCertificate:
    """The V1ShutdownCertificate and every frozen gate `v1_stopped -> v1_drained`, in ONE transaction that locks the
    same gate rows a reconciliation locks and takes the second authoritative inventory inside it
    (CV2-12-043..049, CV2-12-091/092). Any blocking row, live or egress-capable generation, missing receipt,
    tombstone or baseline refuses and writes nothing."""
    require_coordinator(actor)
    attempt = attempt_get(attempt_key)
    require_open(attempt)
    existing = V1ShutdownCertificate.objects.filter(attempt=attempt).first()
    if existing is not None:
        return existing
    owner = v1_owner()
    release = owner.release()
    manifest = owner.egress_manifest()
    with transaction.atomic():
        certificate = certificate_locked(attempt)
        gates = _stopped_gates(attempt)
        ordering_plan.plan_revalidate(attempt, certificate)  # reverified before the shutdown certificate (D-312)
        problems: list[str] = []
        inventory = owner.inventory(attempt_account_keys(attempt))
        problems += [f"{b.kind} {b.table}#{b.row_id}" for b in inventory.blocking[:10]]
        generation = owner.current_generation()
        if generation is None or generation.generation_id != attempt.v1_generation_id or \
                generation.state != "terminated" or not generation.egress_isolated:
            problems.append("the frozen V1 generation is not terminated and egress-isolated (or a newer one runs)")
        receipts = {r.kind: r for r in V1GenerationReceipt.objects.filter(attempt=attempt)}
        if set(receipts) != {"terminated", "isolated"}:
            problems.append("termination or isolation receipt missing")
        barrier_rows = list(MaintenanceBarrierReceipt.objects.filter(attempt=attempt, action="closed")
                            .order_by("barrier"))
        if len(barrier_rows) != len(BARRIER_ORDER):
            problems.append("a maintenance barrier receipt is missing")
        if not manifest.supported or release.release_id != attempt.v1_release_id:
            problems.append("the egress manifest or V1 release changed since the certificate")
        gaps, tombstone_digest, baseline_digest = coverage(attempt)
        problems += gaps[:10]
        if problems:
            raise DrainBlocked("the shutdown cannot be certified: " + "; ".join(problems))
        barrier_digest = evidence_digest("barrier_receipts", [bytes(r.digest).hex() for r in barrier_rows])[1]
        value = {
            "attempt": attempt.attempt_key, "v1_release": release.release_id,
            "v1_binary": release.binary_digest.hex(), "v1_schema": release.schema_digest.hex(),
            "configuration": attempt.configuration.generation_id,
            "readiness_certificate": bytes(certificate.digest).hex(),
            "account_gate_set": [[g.account_id, g.pk] for g in gates],
            "egress_manifest": manifest.digest.hex(), "barrier_receipts": barrier_digest.hex(),
            "inventory": inventory.digest.hex(), "tombstones": tombstone_digest.hex(),
            "baselines": baseline_digest.hex(), "terminated": bytes(receipts["terminated"].digest).hex(),
            "isolated": bytes(receipts["isolated"].digest).hex(),
        }
        payload, digest = evidence_digest("v1_shutdown_certificate", value)
        shutdown = V1ShutdownCertificate.objects.create(
            attempt=attempt, v1_release_id=release.release_id, v1_binary_digest=release.binary_digest,
            v1_schema_digest=release.schema_digest,
            configuration_digest=evidence_digest("configuration", attempt.configuration.generation_id)[1],
            readiness_certificate_digest=bytes(certificate.digest),
            account_set_digest=bytes(attempt.account_set_digest), egress_manifest_digest=manifest.digest,
            barrier_receipts_digest=barrier_digest, inventory_digest=inventory.digest,
            tombstone_coverage_digest=tombstone_digest, baseline_coverage_digest=baseline_digest,
            termination_receipt_digest=bytes(receipts["terminated"].digest),
            isolation_receipt_digest=bytes(receipts["isolated"].digest), payload=payload, digest=digest)
        gates_move(gates, source=GateMode.V1_STOPPED, action="certify_drained", actor=actor, attempt=attempt,
              evidence=digest)
        fault_point("cutover.certify_before_commit")
    return shutdown


# -- the frozen gates belong to the coordinator (registered in cutover.apps) ------------------------------------

V1_PATH_ACTIONS = frozenset({"halt_v1", "abort_halt_v1", "stop_v1", "certify_drained", "cold_abort",
                             "begin_validation", "restore_v1"})


def frozen_gate_blockers(gate: AccountServingGate, action: str) -> list[str]:
    """A V1-path gate action outside the coordinator is refused while an open attempt froze the gate's account."""
    if action not in V1_PATH_ACTIONS:
        return []
    attempt = (ServiceCutoverAttempt.objects.filter(outcome=AttemptOutcome.OPEN,
                                                    configuration__accounts__account_id=gate.account_id).first())
    if attempt is None:
        return []
    return [f"the gate is frozen by open service cutover {attempt.attempt_key}: only its coordinator moves it "
            f"(manage.py cutover / the cutover console)"]
