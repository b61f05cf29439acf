"""The first production activation of a V1 -> V2 service cutover (seed step 8; CV2-12-064..071, CV2-12-085,
CV2-12-096/097).

Phases (each idempotent and resumable from the durable facts alone):

- `first_activation_acquire`: the attempt's ServingPublicationBarrierSet (no predecessor), `acquiring`, while the
  gates are `v2_validating` and the CutoverDecision is `rollback_open`.
- `first_activation_hold`: in one transaction holding the set FOR UPDATE, reread the candidate epoch's owners and
  the readiness certificate, V1ShutdownCertificate, V1RestorePoint and exhaustive gate set; freeze their combined
  digest (`held`), and the closed activation inventory (cutover.services.activation_inventory: an uncovered
  path refuses the hold). From now on every owner publication is refused (connector.hooks.publication_guard) and an urgent
  revocation aborts the activation only while rollback is open.
- `first_activation_commit`: requires the dual approval of the activation decision, then ONE `default` transaction
  locks the set, wins `CutoverDecision: rollback_open -> activating_v2` in the journal while holding it (a restore
  that won first makes this record no activation and fenced-release the set), rejects any drift, and moves the set
  `held -> activation_committed`, the epoch `verified -> active` and every gate `v2_validating -> v2_serving`
  (connector.services.serving.activate_first_locked), the epoch `provider_io_held` (no DispatchPermit yet). After
  a fresh exact readback, whose transaction alone enables provider I/O (D-321): `v2_committed`, then the set is
  released and the attempt closed `v2_committed`. V1's owner barriers stay closed and its generation terminated:
  V1 tables are terminal read-only from here (CV2-12-069); V2 admission opens through the serving gates.

Crash points, one at every barrier boundary: activation.after_acquire, activation.after_hold,
activation.after_decision, activation.before_commit, activation.after_commit, activation.after_v2_committed.
`first_activation_commit` is also the resume: it continues from what it finds. A coordinator that crashed is
replaced by `first_activation_recovery.first_activation_recover`: a holder-fenced takeover of the same set that
follows the CutoverDecision (CV2-11-043/049/056). Every phase takes the caller's `holder` (and optionally the fence
it last saw): a coordinator whose holder was taken over, or whose fence is stale, acts on nothing.
"""
from __future__ import annotations

import hmac

from django.db import IntegrityError, transaction
from django.utils import timezone

from connector.actors import Actor
from connector.canonical.shapes import text_list
from connector.choices import EpochState, GateMode
from connector.errors import FenceStale, TransitionRefused
from connector.faults import fault_point
from connector.selectors import locks as connector_locks
from connector.selectors.rows import AccountServingGate, ServiceConfigurationGeneration, ServingEpoch
from connector.services import approvals, serving
from connector.services.audit import audit_record
from cutover import locks
from cutover.choices import BARRIER_SET_OPEN, BarrierSetState, DecisionState
from cutover.errors import (
    ActivationLost,
    BarrierSetRefused,
    CutoverPhaseRefused,
    PublicationBarrierHeld,
    RestorePointInvalid,
)
from cutover.models import (
    AttemptOutcome,
    CutoverReadinessCertificate,
    ServiceCutoverAttempt,
    ServingPublicationBarrierSet,
    V1RestorePoint,
    V1ShutdownCertificate,
)
from cutover.services import barrier_receipts
from cutover.services import activation_inventory
from cutover.services import decision as decisions
from cutover.services import succession
from cutover.services.fencing import check_holder  # one holder fence for both kinds of set (D-133)
from cutover.services.approval_subjects import account_gate_rows, activation_decision
from cutover.services.restore_point import rehearsed_restore_point
from cutover.services.preflight import attempt_get, evidence_digest, require_coordinator
from cutover.services.v1_shutdown import l2_frozen_by

__all__ = ["first_activation_acquire", "first_activation_hold", "first_activation_commit", "activation_evidence",
           "barrier_set_of", "default_holder", "check_holder"]


def default_holder(attempt_key: str) -> str:
    """The holder of a set acquired without a named coordinator (the operator's phase actions)."""
    return f"cutover:{attempt_key}"


def barrier_set_of(attempt: ServiceCutoverAttempt) -> ServingPublicationBarrierSet | None:
    """The attempt's latest first-activation barrier set."""
    return (ServingPublicationBarrierSet.objects.filter(attempt_key=attempt.attempt_key, predecessor_epoch=None)
            .order_by("-pk").first())


CERTIFICATE_DIGESTS_SQL = f"""
SELECT (SELECT digest FROM {CutoverReadinessCertificate._meta.db_table} WHERE attempt_id = %(a)s ORDER BY id LIMIT 1),
       (SELECT digest FROM {V1ShutdownCertificate._meta.db_table} WHERE attempt_id = %(a)s ORDER BY id LIMIT 1)
"""


def _certificate_digests(attempt: ServiceCutoverAttempt) -> tuple[bytes, bytes]:
    with transaction.get_connection().cursor() as cursor:  # both in one round trip (D-289)
        cursor.execute(CERTIFICATE_DIGESTS_SQL, {"a": attempt.pk})
        readiness, shutdown = cursor.fetchone()
    if readiness is None or shutdown is None:
        raise CutoverPhaseRefused("the readiness or shutdown certificate is missing")
    return bytes(readiness), bytes(shutdown)


def _account_gates(rows) -> tuple[list[int], list[tuple[int, int, str]]]:
    """The frozen account set (ascending) and its gates as (account, gate pk, mode) from the configuration's
    `approval_subjects.account_gate_rows`: the rows the activation decision's digest is computed from (D-289)."""
    ordered = sorted(rows)
    return [a for a, _, _, _ in ordered], [(a, pk, mode) for a, _, pk, mode in ordered if pk is not None]


def activation_evidence(attempt: ServiceCutoverAttempt, epoch: ServingEpoch, *, gates=None, rows=None,
                        point: V1RestorePoint | None = None, certificates: tuple[bytes, bytes] | None = None,
                        owners: bytes | None = None) -> bytes:
    """The combined digest the held set freezes and the activation transaction recomputes: the candidate's owner
    receipts, the readiness certificate, the V1ShutdownCertificate, the V1RestorePoint and the exhaustive gate set
    (account, gate row, mode). Any difference is drift (CV2-12-064/067).

    The activation transaction passes the gates it holds FOR UPDATE (connector GateRow tuples, ascending account
    id) and the restore point it verified just before its locks (D-280); the early evidence before the locks
    passes the (account, pk, mode) tuples it read (`rows`, D-287); otherwise both are read here. The digest's bytes
    are the same either way. The gate list is
    encoded once by `connector.canonical.shapes.text_list` (the bytes of the generic encoding, a fifth of its
    time: D-289)."""
    readiness, shutdown = certificates if certificates is not None else _certificate_digests(attempt)
    point = point if point is not None else rehearsed_restore_point(attempt.attempt_key)
    if rows is None:
        rows = ([(g.account_id, g.pk, g.mode) for g in gates] if gates is not None
                else _account_gates(account_gate_rows(attempt.configuration_id))[1])
    owners = owners if owners is not None else succession.epoch_owner_receipts_digest(epoch)
    return evidence_digest("first_activation_evidence", {
        "owners": owners.hex(), "epoch": bytes(epoch.digest).hex(),
        "readiness": bytes(readiness).hex(), "shutdown": bytes(shutdown).hex(),
        "restore_point": bytes(point.digest).hex(), "gates": text_list([a, pk, mode] for a, pk, mode in rows),
        "account_set": bytes(attempt.account_set_digest).hex()})[1]


def first_activation_acquire(*, attempt_key: str, actor: Actor, holder: str | None = None
                             ) -> ServingPublicationBarrierSet:
    """Write the set `acquiring` and one fenced receipt per owner in one transaction (CV2-11-037, CV2-15-009).
    Idempotent for its holder; an open set of another holder refuses, and a concurrent acquisition loses to the
    partial unique index (one nonreleased set per activation scope)."""
    require_coordinator(actor)
    holder = holder or default_holder(attempt_key)
    attempt = attempt_get(attempt_key)
    decision = decisions.decision_read(attempt_key)
    if decision is None or decision.state != DecisionState.ROLLBACK_OPEN:
        raise BarrierSetRefused(f"the CutoverDecision of {attempt_key} is "
                                f"{decision.state if decision else 'absent'}, not rollback_open")
    existing = barrier_set_of(attempt)
    if existing is not None and existing.state in BARRIER_SET_OPEN:
        if existing.holder != holder:
            raise BarrierSetRefused(f"{existing} is open for holder {existing.holder!r}, not {holder!r}")
        return existing
    epoch = attempt.candidate_epoch
    serving.activation_cardinality_check(accounts=attempt.account_count)  # before the barrier set exists (D-210)
    try:
        with transaction.atomic():
            connector_locks.epoch_for_share(epoch.pk)
            # every frozen account's gate (None: an account without one)
            modes = {mode for _, _, _, mode in account_gate_rows(attempt.configuration_id)}
            if modes != {GateMode.V2_VALIDATING}:
                raise BarrierSetRefused("every frozen gate must be v2_validating; modes: "
                                        + ", ".join(sorted(map(str, modes))))
            row = ServingPublicationBarrierSet.objects.create(
                successor_epoch=epoch, successor_key=epoch.epoch_id, successor_digest=bytes(epoch.digest),
                scope_digest=bytes(epoch.serving_scope_digest), holder=holder, attempt_key=attempt_key)
            barrier_receipts.record_owner_receipts(row, epoch)
            audit_record(actor=actor, entity=row, action="barrier_set_acquire", to_state=row.state, fence=row.fence,
                         evidence_digest=bytes(epoch.digest), reason=f"first activation of {attempt_key} by {holder}")
    except IntegrityError as exc:  # the partial unique index: another coordinator's set is open for this scope
        raise BarrierSetRefused(f"another barrier set opened for {epoch.epoch_id} concurrently") from exc
    fault_point("activation.after_acquire")
    return row


def first_activation_hold(*, attempt_key: str, actor: Actor, holder: str | None = None,
                          expected_fence: int | None = None) -> ServingPublicationBarrierSet:
    require_coordinator(actor)
    attempt = attempt_get(attempt_key)
    current = barrier_set_of(attempt)
    if current is None or current.state not in BARRIER_SET_OPEN:
        raise BarrierSetRefused(f"attempt {attempt_key} has no open first-activation barrier set; acquire first")
    if current.state != BarrierSetState.ACQUIRING:
        check_holder(current, holder, None)
        return current
    with transaction.atomic():
        row = locks.barrier_set_for_update(current.pk)
        check_holder(row, holder, expected_fence)
        if row.state != BarrierSetState.ACQUIRING:
            return row
        epoch = connector_locks.epoch_for_share(row.successor_epoch_id)
        drift = serving.epoch_owner_drift(epoch_pk=epoch.pk)
        problems = barrier_receipts.owner_receipt_problems(row, epoch)  # one receipt per owner, the same bytes
        if epoch.state != EpochState.VERIFIED or not hmac.compare_digest(bytes(epoch.digest),
                                                                          bytes(row.successor_digest)):
            problems.append(f"candidate {epoch.epoch_id} is {epoch.state} or not the bound bytes")
        if drift is not None:
            problems.append(f"owner drift {drift[0]}: {drift[1]}")
        if problems:
            succession.record_release(row, "mismatch under the held fences: " + "; ".join(problems), actor)
            return row
        activation_inventory.inventory_freeze(attempt, row, epoch, actor)  # uncovered: refused, stays acquiring
        row.hold(owner_receipts_digest=activation_evidence(attempt, epoch))
        row.save()
        audit_record(actor=actor, entity=row, action="barrier_set_hold", from_state=BarrierSetState.ACQUIRING,
                     to_state=row.state, fence=row.fence, evidence_digest=bytes(row.owner_receipts_digest))
    fault_point("activation.after_hold")
    return row


def _readback(attempt: ServiceCutoverAttempt, epoch_pk: int) -> bool:
    epoch = ServingEpoch.objects.defer("preimage").get(pk=epoch_pk)
    configuration = ServiceConfigurationGeneration(pk=attempt.configuration_id)
    gates = list(AccountServingGate.objects.filter(account_id__in=configuration.accounts.values("account_id"))
                 .values_list("mode", "epoch_id", "epoch_digest"))  # tuples: the compared columns only
    digest = bytes(epoch.digest)
    return (epoch.state == EpochState.ACTIVE and len(gates) == attempt.account_count
            and all(mode == GateMode.V2_SERVING and epoch_id == epoch.pk and epoch_digest is not None
                    and bytes(epoch_digest) == digest for mode, epoch_id, epoch_digest in gates))


def activation_transaction(attempt: ServiceCutoverAttempt, set_pk: int, actor: Actor, *, rows=None,
                            holder: str | None = None, expected_fence: int | None = None) -> None:
    """`rows`: the configuration's `account_gate_rows`, when the caller read them for the approval's digest."""
    # Before the CutoverDecision is won in the journal: activate_first_locked would refuse it after (D-210).
    serving.activation_cardinality_check(accounts=attempt.account_count)
    # Read before the locks (D-280): the frozen account set (immutable rows) and the restore point, whose dump file
    # is hashed here (a file is under no PostgreSQL lock: hashing it inside them only lengthened the locked window).
    # A failure is raised where it was, under the locks once the decision is won; the point's digest is compared
    # there with the rest of the evidence.
    rows = rows if rows is not None else account_gate_rows(attempt.configuration_id)
    account_ids, early_rows = _account_gates(rows)
    try:
        point, point_refused = rehearsed_restore_point(attempt.attempt_key), None
    except RestorePointInvalid as exc:
        point, point_refused = None, exc
    # The evidence computed before the locks too (D-287): its canonical encoding is linear Python (40% of the
    # transaction at 10,000 accounts). Under the locks it is used only if every input equals what the locks hold.
    candidate = attempt.candidate_epoch  # preimage deferred by attempt_get (D-285)
    owners = succession.epoch_owner_receipts_digest(candidate)  # immutable proof rows (connector migration 0002)
    try:
        certificates = _certificate_digests(attempt)
        early = (None if point is None else
                 activation_evidence(attempt, candidate, rows=early_rows, point=point, certificates=certificates,
                                     owners=owners))
    except CutoverPhaseRefused:
        certificates, early_rows, early = None, None, None  # raised again under the locks
    with transaction.atomic():
        row = locks.barrier_set_for_update(set_pk)
        check_holder(row, holder, None)
        if row.state == BarrierSetState.ACTIVATION_COMMITTED:
            return
        check_holder(row, None, expected_fence)
        if row.state != BarrierSetState.HELD:
            raise BarrierSetRefused(f"{row} is {row.state}, not held")
        decision = decisions.decision_read(attempt.attempt_key)
        if decision is not None and decision.state == DecisionState.ROLLBACK_OPEN:
            try:  # won in the journal while this transaction holds the set (a revocation waits for it)
                decision = decisions.decision_choose_activation(attempt.attempt_key, expected_fence=decision.fence)
            except (FenceStale, TransitionRefused):
                decision = decisions.decision_read(attempt.attempt_key)
        if decision is None or decision.state != DecisionState.ACTIVATING_V2:
            succession.record_release(row, f"restore won the CutoverDecision ({decision.state if decision else 'absent'}); "
                          "no activation recorded", actor)
            lost = True
        else:
            lost = False
            fault_point("activation.after_decision")
            epoch = connector_locks.epoch_for_update(row.successor_epoch_id)
            if epoch.state != EpochState.VERIFIED or not hmac.compare_digest(bytes(epoch.digest),
                                                                              bytes(row.successor_digest)):
                raise CutoverPhaseRefused(f"candidate {epoch.epoch_id} is {epoch.state} or changed")
            if point_refused is not None:
                raise point_refused
            # The gates in the canonical order (after the set and the epoch), read once: the evidence's gate set
            # is the locked rows themselves, and activate_first_locked moves them (D-280).
            gates = connector_locks.gates_for_update(account_ids)
            now = _certificate_digests(attempt)
            if (early is not None and now == certificates and epoch.pk == candidate.pk
                    and bytes(epoch.digest) == bytes(candidate.digest)
                    and [(g.account_id, g.pk, g.mode) for g in gates] == early_rows):
                evidence = early  # every input equal to what the locks hold: the same bytes
            else:
                evidence = activation_evidence(attempt, epoch, gates=gates, point=point, certificates=now,
                                               owners=owners if epoch.pk == candidate.pk else None)
            if not hmac.compare_digest(evidence, bytes(row.owner_receipts_digest)):
                raise CutoverPhaseRefused("owner, certificate, restore point or gate-set drift under the held "
                                          "barriers; nothing moved")
            row.commit_activation()
            row.save()
            audit_record(actor=actor, entity=row, action="barrier_set_commit_activation",
                         from_state=BarrierSetState.HELD, to_state=row.state, fence=row.fence)
            serving.activate_first_locked(epoch=epoch, account_ids=account_ids, actor=actor,
                                          observed=bytes(row.successor_digest), gates=gates,
                                          hold_provider_io=True)  # until the exact readback (D-321)
            fault_point("activation.before_commit")
    if lost:
        raise ActivationLost(f"a RestoreAttempt won the CutoverDecision of {attempt.attempt_key}; the barrier "
                             "set was released and nothing activated")


def first_activation_commit(*, attempt_key: str, actor: Actor, holder: str | None = None,
                            expected_fence: int | None = None) -> ServingEpoch:
    """The activation, its readback, `v2_committed`, the release: continues from whatever state it finds. With a
    `holder`, every locked step first checks that it still holds the set (and `expected_fence`, when given,
    the fence the activation transaction finds)."""
    require_coordinator(actor)
    attempt = attempt_get(attempt_key)
    row = barrier_set_of(attempt)
    if row is None:
        raise BarrierSetRefused(f"attempt {attempt_key} has no first-activation barrier set")
    if row.state in BARRIER_SET_OPEN:
        check_holder(row, holder, None)  # early, unlocked; every locked step checks again
    epoch = attempt.candidate_epoch
    if row.state == BarrierSetState.HELD:
        # The account set and its gates read once for the decision's digest and the transaction (one configuration:
        # an epoch's configuration is immutable, connector migration 0006).
        rows = account_gate_rows(attempt.configuration_id)
        digest, _ = activation_decision(epoch.epoch_id,
                                        rows=rows if epoch.configuration_id == attempt.configuration_id else None)
        approvals.approval_require(kind="activation_decision", subject_key=epoch.epoch_id, digest=digest)
        activation_inventory.inventory_check(attempt, row)  # CV2-12-010: nothing uncovered, as frozen (D-320)
        activation_transaction(attempt, row.pk, actor, rows=rows, holder=holder, expected_fence=expected_fence)
        fault_point("activation.after_commit")
        row.refresh_from_db()
    if row.state == BarrierSetState.RELEASED and not _readback(attempt, epoch.pk):
        raise BarrierSetRefused(f"{row} was released without activation ({row.release_reason}); acquire a new set")
    if row.state not in (BarrierSetState.ACTIVATION_COMMITTED, BarrierSetState.RELEASED):
        raise BarrierSetRefused(f"{row} is {row.state}")
    # The exact readback, under the epoch FOR UPDATE; only when it holds is provider I/O enabled, in its
    # transaction (CV2-12-071, D-321). V1 is retired at `v2_committed` below (cutover migration 0013).
    if not serving.epoch_enable_provider_io(epoch_pk=epoch.pk, readback=lambda e: _readback(attempt, e.pk),
                                            actor=actor):
        raise CutoverPhaseRefused("activation readback does not show the epoch active on every frozen gate")
    decision = decisions.decision_read(attempt_key)
    if decision.state == DecisionState.ACTIVATING_V2:
        decisions.decision_commit_activation(attempt_key, expected_fence=decision.fence)
        fault_point("activation.after_v2_committed")
    with transaction.atomic():
        row = locks.barrier_set_for_update(row.pk)
        if row.state == BarrierSetState.ACTIVATION_COMMITTED:
            check_holder(row, holder, None)
            succession.record_release(row, "first activation read back and v2_committed", actor)
        locked = attempt_get(attempt_key, lock=True)
        if locked.outcome == AttemptOutcome.OPEN:
            locked.outcome, locked.closed_at = AttemptOutcome.V2_COMMITTED, timezone.now()
            locked.save(update_fields=["outcome", "closed_at"])
            audit_record(actor=actor, entity=locked, action="cutover_v2_committed", from_state=AttemptOutcome.OPEN,
                         to_state=AttemptOutcome.V2_COMMITTED, evidence_digest=bytes(epoch.digest))
    return ServingEpoch.objects.defer("preimage").get(pk=epoch.pk)


# -- publication and revocation guards (registered in cutover.apps) -----------------------------------------------

def _held_sets():
    """Every held or committing set, locked FOR SHARE: an activation (FOR UPDATE) and a publication serialize."""
    queryset = ServingPublicationBarrierSet.objects.filter(
        state__in=(BarrierSetState.HELD, BarrierSetState.ACTIVATION_COMMITTED)).order_by("pk")
    sql, params = queryset.query.sql_with_params()
    return list(ServingPublicationBarrierSet.objects.raw(sql + " FOR SHARE", params))


def publication_guard(owner: str) -> None:
    """An owner write holds its owner barrier shared (connector.services.owners, D-284) before it gets here; every
    set transition holds all of them exclusive (locks.barrier_set_for_update), so the states read here are the
    committed ones and stay so until the write commits. The configuration owner (accounts, configuration
    generations) is also refused while an open cutover attempt's V1 authoring barrier is closed (D-291): the
    receipt of that closure is written under the configuration barrier held exclusive."""
    held = _held_sets()
    if held:
        raise PublicationBarrierHeld(f"the {owner} publication barrier is held by {held[0]}; retry after the "
                                     "activation is released")
    if owner == "configuration":
        frozen = l2_frozen_by()
        if frozen is not None:
            raise PublicationBarrierHeld(f"the L2 configuration owner is frozen by cutover attempt {frozen} (its V1 "
                                         "authoring barrier is closed); retry after the attempt closes or aborts")


def revocation_guard(credential_gate) -> None:
    """An urgent revocation aborts an activation that has not begun and waits for one that has (CV2-11-041/042):
    - a first-activation set held while its decision is still `rollback_open`: the set is released (the
      activation aborts) and the revocation commits; once `activating_v2` won, refused (retryable) until the
      activation is read back, `v2_committed` and released;
    - a successor's set held: its local activation transaction has not begun (`successor_activate` holds the set
      FOR UPDATE until `activation_committed`, and the FOR SHARE read below waits for it), so the set is released
      (`succession.barrier_set_abort_for_revocation`) and the revocation commits;
    - a set `activation_committed` (either kind): refused (retryable) until its readback and release.
    The owner barriers are taken exclusive before any set is read or locked (the order of every set transition,
    D-284)."""
    connector_locks.owner_barriers_lock(exclusive=True)
    reason = f"urgent revocation of credential generation #{credential_gate.credential_generation_id}"
    for row in _held_sets():
        if row.state == BarrierSetState.HELD and not row.attempt_key and row.predecessor_epoch_id is not None:
            succession.barrier_set_abort_for_revocation(locks.barrier_set_for_update(row.pk), reason=reason,
                                                        actor=Actor.system("revocation"))
            continue
        decision = decisions.decision_read(row.attempt_key) if row.attempt_key else None
        if row.attempt_key and row.state == BarrierSetState.HELD and decision is not None and \
                decision.state == DecisionState.ROLLBACK_OPEN:
            locked = locks.barrier_set_for_update(row.pk)
            succession.record_release(locked, reason + " while rollback was open", Actor.system("revocation"))
            continue
        raise PublicationBarrierHeld(f"{row} is committing an activation; the revocation is retried after it")
