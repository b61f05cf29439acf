"""The V1 side of the cutover after the drain: begin validation (decision 11), cold abort (CV2-12-072/082) and
the full restore (CV2-12-073..075, CV2-12-083/084), with the once-active refusal (CV2-12-076/098).

Order of authority in the full restore: the journal decides first (CutoverDecision rollback_open -> restoring_v1,
then the RestoreAttempt row), then `default` is replaced atomically from the restore point's dump and verified
against every frozen digest, then the recovery receipt and `v1_restored` are written to the journal, and only
then does V1 start a NEW process generation and the gates return to `v1_serving`. Each step is a durable
boundary: a crash anywhere leaves V1 and V2 offline and `restore_run` resumes the same RestoreAttempt.
"""
from __future__ import annotations

import hashlib

from django.db import IntegrityError, connection, connections, transaction
from django.utils import timezone

from config.routers import JOURNAL_DB
from connector.actors import Actor
from connector.choices import GateMode
from connector.errors import FenceStale, TransitionRefused
from connector.faults import fault_point
from connector.selectors import locks
from connector.selectors.rows import AccountServingGate
from connector.services.gates import gate_transition
from cutover.choices import DecisionState, RestoreAttemptState
from cutover.errors import ColdAbortRefused, RestorePointInvalid, RestoreRefused
from cutover.models import AttemptOutcome, RestoreAttempt, ServiceCutoverAttempt, V1RestorePoint
from cutover.ports import BarrierKind, v1_owner
from cutover.services import pg_snapshot
from cutover.services.decision import (
    decision_choose_restore, decision_complete_restore, decision_open, decision_read,
)
from cutover.services import approval_subjects
from cutover.services.lane_init import initialize_lanes_from_baselines
from cutover.services.restore_point import (
    attempt_for, frame, live_drift, recompute_digests, rehearsed_restore_point,
)
from cutover.services.v2_scope import active_epochs, attempt_account_ids, v2_rows

__all__ = ["cutover_begin_validation", "cutover_cold_abort", "restore_run", "restore_attempt_for",
           "restore_blockers"]

ONCE_ACTIVE = (DecisionState.ACTIVATING_V2, DecisionState.V2_COMMITTED)


def restore_attempt_for(attempt_key: str) -> RestoreAttempt | None:
    return RestoreAttempt.objects.using(JOURNAL_DB).filter(attempt_key=attempt_key).first()


def restore_blockers(attempt: ServiceCutoverAttempt) -> list[str]:
    """Why V1 may not come back for this attempt (empty = it may): an epoch that ever became active, or any V2
    admission, Runtime submission, provider I/O or source ack for the attempt's accounts (CV2-12-076/083)."""
    decision = decision_read(attempt.attempt_key)
    found = []
    if decision is not None and decision.state in ONCE_ACTIVE:
        found.append(f"the CutoverDecision chose activation ({decision.state})")
    with connection.cursor() as cursor:
        found += [f"epoch {e} became active" for e in active_epochs(cursor)]
        found += v2_rows(cursor, attempt_account_ids(attempt))
    return found


def _gates_locked(attempt: ServiceCutoverAttempt) -> list[AccountServingGate]:
    """Canonical order (docs/locking.md): the candidate epoch FOR SHARE (#2), then the frozen gates (#3) FOR UPDATE
    in ascending account id."""
    locks.epoch_for_share(attempt.candidate_epoch_id)
    return [locks.gate_for_update(account_id) for account_id in attempt_account_ids(attempt)]


def _move_gates(attempt: ServiceCutoverAttempt, action: str, actor: Actor, evidence: bytes, why: str) -> None:
    for account_id in attempt_account_ids(attempt):
        gate_transition(account_id=account_id, action=action, expected_fence=None, actor=actor,
                        reason=f"cutover attempt {attempt.attempt_key}: {why}", evidence_digest=evidence,
                        coordinated=True)


def _close(attempt: ServiceCutoverAttempt, outcome: str) -> None:
    attempt.outcome = outcome
    attempt.closed_at = timezone.now()
    attempt.save(update_fields=["outcome", "closed_at"])


def cutover_begin_validation(*, attempt_key: str, actor: Actor) -> list[AccountServingGate]:
    """v1_drained -> v2_validating for every frozen gate, once the rehearsed restore point still matches the live
    database (no drift); opens the CutoverDecision first (decision 11). V2 stays disabled (CV2-12-056)."""
    point = rehearsed_restore_point(attempt_key)
    attempt = attempt_for(attempt_key)
    if decision_read(attempt_key) is None:  # entering validation needs the dual approval of the restore point
        approval_subjects.require("restore_point", attempt_key)
    if attempt.outcome != AttemptOutcome.OPEN:
        raise TransitionRefused(f"attempt {attempt_key} is {attempt.outcome}")
    modes = set(AccountServingGate.objects.filter(account_id__in=attempt_account_ids(attempt))
                .values_list("mode", flat=True))
    if modes == {GateMode.V2_VALIDATING} and decision_read(attempt_key) is not None:
        return list(AccountServingGate.objects.filter(account_id__in=attempt_account_ids(attempt)))
    drift = live_drift(point)
    if drift:
        raise RestorePointInvalid(f"the live database drifted since the restore point ({', '.join(drift)}); "
                                  "validation may not begin")
    decision_open(attempt_key)
    with transaction.atomic():
        gates = _gates_locked(attempt)
        wrong = [f"account {g.account_id}: {g.mode}" for g in gates if g.mode != GateMode.V1_DRAINED]
        if wrong:
            raise TransitionRefused("begin validation needs every frozen gate v1_drained: " + "; ".join(wrong))
        _move_gates(attempt, "begin_validation", actor, bytes(point.digest), "restore point rehearsed, validation")
        initialize_lanes_from_baselines(attempt)
    return list(AccountServingGate.objects.filter(account_id__in=attempt_account_ids(attempt)))


def cutover_cold_abort(*, attempt_key: str, actor: Actor) -> str:
    """v1_drained -> v1_serving before any V2 mutation: a NEW generation of the exact certified release, every
    barrier reopened, outcome `cold_aborted`. Returns the new generation ID."""
    attempt = attempt_for(attempt_key)
    if attempt.outcome != AttemptOutcome.OPEN:
        raise ColdAbortRefused(f"attempt {attempt_key} is {attempt.outcome}")
    decision = decision_read(attempt_key)
    if decision is not None:
        raise ColdAbortRefused(f"validation began (CutoverDecision {decision.state}); use the full restore")
    certificate = getattr(attempt, "shutdown_certificate", None)
    if certificate is None:
        raise ColdAbortRefused(f"attempt {attempt_key} has no V1ShutdownCertificate: V1 is not drained")
    port = v1_owner()
    with transaction.atomic():
        gates = _gates_locked(attempt)
        wrong = [f"account {g.account_id}: {g.mode}" for g in gates if g.mode != GateMode.V1_DRAINED]
        if wrong:
            raise ColdAbortRefused("cold abort needs every frozen gate v1_drained: " + "; ".join(wrong))
        with connection.cursor() as cursor:
            touched = v2_rows(cursor, attempt_account_ids(attempt)) + active_epochs(cursor)
        if touched:
            raise ColdAbortRefused("V2 already mutated the scope: " + "; ".join(touched))
        generation = port.start_generation(certificate.v1_release_id, attempt_key)
        _move_gates(attempt, "cold_abort", actor, bytes(certificate.digest), f"cold abort, V1 {generation.generation_id}")
        for kind in BarrierKind:
            port.reopen_barrier(kind, attempt_key)
        _close(attempt, AttemptOutcome.COLD_ABORTED)
    return generation.generation_id


def _start(attempt_key: str, point: V1RestorePoint, actor: Actor) -> RestoreAttempt:
    """Take the restore branch of the decision (or find it taken) and write the RestoreAttempt."""
    decision = decision_read(attempt_key)
    if decision is None:
        raise RestoreRefused(f"attempt {attempt_key} never entered v2_validating; use the cold abort")
    if decision.state in ONCE_ACTIVE:
        raise RestoreRefused(f"activation won the CutoverDecision of {attempt_key} ({decision.state})")
    if decision.state == DecisionState.ROLLBACK_OPEN:
        blockers = restore_blockers(attempt_for(attempt_key))
        if blockers:
            raise RestoreRefused("; ".join(blockers))
        try:
            decision_choose_restore(attempt_key, expected_fence=decision.fence)
        except (FenceStale, TransitionRefused) as exc:
            raise RestoreRefused(f"the CutoverDecision moved under the restore: {exc}") from exc
    try:
        with transaction.atomic(using=JOURNAL_DB):
            row = RestoreAttempt.objects.using(JOURNAL_DB).create(attempt_key=attempt_key, restore_point=point,
                                                                  started_by=actor.principal)
    except IntegrityError:
        row = restore_attempt_for(attempt_key)
    fault_point("restore.after_restoring_v1")
    return row


def _advance(row: RestoreAttempt, method: str, **kwargs) -> RestoreAttempt:
    with transaction.atomic(using=JOURNAL_DB):
        locked = RestoreAttempt.objects.using(JOURNAL_DB).select_for_update().get(pk=row.pk)
        if locked.fence != row.fence:
            raise FenceStale(f"{locked} moved (fence {locked.fence}, expected {row.fence})")
        getattr(locked, method)(**kwargs)
        locked.save(using=JOURNAL_DB)
        return locked


def _restore_database(row: RestoreAttempt, point: V1RestorePoint) -> RestoreAttempt:
    attempt = attempt_for(row.attempt_key)
    blockers = restore_blockers(attempt)
    if blockers:
        raise RestoreRefused("; ".join(blockers))
    pg_snapshot.restore_default(point.dump_path)
    fault_point("restore.after_pg_restore")
    mismatched = [name for name, (now, frozen) in recompute_digests(point).items() if now != frozen]
    if mismatched:
        raise RestorePointInvalid(f"the restored database does not match the restore point: {', '.join(mismatched)}")
    return _advance(row, "database_restored", content_digest=bytes(point.content_digest))


def _record_receipt(row: RestoreAttempt, point: V1RestorePoint) -> RestoreAttempt:
    verified = recompute_digests(point)
    mismatched = [name for name, (now, frozen) in verified.items() if now != frozen]
    if mismatched:
        raise RestorePointInvalid(f"the restored database changed before the receipt: {', '.join(mismatched)}")
    payload = frame("recovered", row.attempt_key, point.digest, *(
        part for name in sorted(verified) for part in (name, verified[name][0])))
    row = _advance(row, "record_receipt", payload=payload, digest=hashlib.sha256(payload).digest())
    fault_point("restore.after_recovery_receipt")
    return row


def _serve_v1(row: RestoreAttempt, point: V1RestorePoint, actor: Actor) -> RestoreAttempt:
    decision = decision_read(row.attempt_key)
    if decision.state == DecisionState.RESTORING_V1:
        decision_complete_restore(row.attempt_key, expected_fence=decision.fence)
    port = v1_owner()
    attempt = attempt_for(row.attempt_key)
    if attempt.outcome == AttemptOutcome.V1_RESTORED:  # crashed after the default commit: the generation runs
        generation = port.current_generation()
        return _advance(row, "serve_v1", generation_id=generation.generation_id)
    with transaction.atomic():
        gates = _gates_locked(attempt)
        wrong = [f"account {g.account_id}: {g.mode}" for g in gates if g.mode != GateMode.V1_DRAINED]
        if wrong:
            raise RestorePointInvalid("the restored gates are not v1_drained: " + "; ".join(wrong))
        generation = port.start_generation(point.v1_release_id, row.attempt_key)
        _move_gates(attempt, "cold_abort", actor, bytes(row.recovery_digest),
                    f"V1 restored from restore point, V1 {generation.generation_id}")
        for kind in BarrierKind:
            port.reopen_barrier(kind, row.attempt_key)
        _close(attempt, AttemptOutcome.V1_RESTORED)
    return _advance(row, "serve_v1", generation_id=generation.generation_id)


def restore_run(*, attempt_key: str, actor: Actor) -> RestoreAttempt:
    """Run (or resume) the full restore of the attempt to its V1RestorePoint. Must not run inside a transaction:
    it replaces the `default` database."""
    if connections["default"].in_atomic_block:
        raise TransitionRefused("restore_run replaces the default database and cannot run inside a transaction")
    point = rehearsed_restore_point(attempt_key)
    row = restore_attempt_for(attempt_key)
    if row is None:
        row = _start(attempt_key, point, actor)
    if row.state == RestoreAttemptState.STARTED:
        row = _restore_database(row, point)
    if row.state == RestoreAttemptState.DATABASE_RESTORED:
        row = _record_receipt(row, point)
    if row.state == RestoreAttemptState.RECEIPT_RECORDED:
        row = _serve_v1(row, point, actor)
    return row
