"""V2 -> V2 successor activation, `requires_drain` only (CV2-11): the publication barrier set, the per-lane
OrderingHandoff, and the one activation transaction.

Phases, each a resumable service: `barrier_set_acquire` (`acquiring`), `barrier_set_hold` (the owners reread
under its locks, receipts frozen: `held`, D-285), the whole-service halt and handoffs (`succession_phases`, one
transaction per chunk), `successor_activate`, `barrier_set_release` (after readback). Lock order
(docs/locking.md): owner barriers, barrier set, epochs (ascending pk), gates (ascending account id), lanes
(ascending pk), entity rows.
"""
from __future__ import annotations

import hashlib
import json

from django.db import IntegrityError, transaction

from connector.actors import Actor
from connector.choices import EXECUTION_ACTIVE, EpochState, GateMode, LaneState
from connector.errors import ConnectorError, EpochNotFound, PermissionRefused
from connector.faults import fault_point
from connector.selectors import locks as connector_locks
from connector.selectors.rows import (AccountServingGate, Execution, OrderingLane, Projection, ProjectionWindow,
                                     ServiceConfigurationGeneration, ServingEpoch, ServingEpochBindingProof,
                                     ServingEpochCredentialProof)
from connector.selectors.routes import epoch_ordering_proofs, route_for
from connector.selectors.serving import unmaterialized_receipts_of_epoch
from connector.services import gates as gate_services
from connector.services import serving
from connector.services import lane_handoff
from connector.services.audit import audit_record
from connector.services.lane_handoff import HANDOFF_BASELINE_ORIGIN, HANDOFF_HALT_REASON
from cutover import locks
from cutover.choices import SUPPORTED_SUCCESSOR_CLASSES, BarrierSetState, SuccessorClass
from cutover.errors import (BarrierSetRefused, HandoffRefused, SuccessorActivationRefused, SuccessorClassUnsupported,
                            SuccessorDrifted)
from cutover.models import OrderingHandoff, ServingPublicationBarrierSet
from cutover.services import barrier_receipts
from cutover.services.fencing import SUCCESSION_PERMISSION, check_holder
from cutover.services.succession_drain import release_drain_of
from cutover.services.handoff_digests import (HANDOFF_LANE_COMPARISON_SQL, LANES_WITHOUT_HANDOFF_SQL, digest_of_handoff,
                                              same_digest, verify_handoff_digests)
from effects.selectors import nonterminal_effects_of_epoch

PERMISSION = SUCCESSION_PERMISSION
# The comparator and partition derivation of a route: a change needs a total L1 transformation plus a snapshot
# barrier (CV2-11-016), which this product does not implement, so any difference refuses the handoff.
CONTRACT_KEYS = ("partition", "position", "position_kind", "tie_breaker", "first_position")


def require_succession_perm(actor: Actor) -> None:
    if actor.user is not None and not actor.user.has_perm(PERMISSION):
        raise PermissionRefused(f"{actor} lacks {PERMISSION}")


def succession_epoch_get(epoch_id: str) -> ServingEpoch:
    epoch = ServingEpoch.objects.select_related("configuration").filter(epoch_id=epoch_id).first()
    if epoch is None:
        raise EpochNotFound(f"no epoch {epoch_id}")
    return epoch


def epoch_account_ids(epoch: ServingEpoch) -> list[int]:
    configuration = ServiceConfigurationGeneration(pk=epoch.configuration_id)
    return sorted(configuration.accounts.values_list("account_id", flat=True))


def contract_digest(*, contract: str, ordering: dict) -> bytes:
    """sha256 of the canonical JSON of the ordering contract and its comparator/partition derivation."""
    body = {"contract": contract, **{k: ordering.get(k) for k in CONTRACT_KEYS}}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).digest()


OWNER_RECEIPTS_SQL = f"""
SELECT 0 AS kind, ordinal, encode(owner_receipt_digest, 'hex') FROM {ServingEpochBindingProof._meta.db_table}
 WHERE epoch_id = %(e)s
UNION ALL
SELECT 1, ordinal, encode(owner_receipt_digest, 'hex') FROM {ServingEpochCredentialProof._meta.db_table}
 WHERE epoch_id = %(e)s
ORDER BY 1, 2
"""


def epoch_owner_receipts_digest(epoch: ServingEpoch) -> bytes:
    """The frozen owner receipts of the successor: configuration, every binding and credential proof, in order
    (both proof lists in one statement, their digests as hex from PostgreSQL: encode(..., 'hex') is bytes.hex(),
    D-289)."""
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(OWNER_RECEIPTS_SQL, {"e": epoch.pk})
        proofs = cursor.fetchall()
    parts = [bytes(epoch.configuration_receipt_digest or b"").hex()] + [hex_digest for _, _, hex_digest in proofs]
    return hashlib.sha256(json.dumps(parts).encode()).digest()


# -- barrier set ----------------------------------------------------------------------------------------------

@transaction.atomic
def barrier_set_acquire(*, predecessor_epoch_id: str, successor_epoch_id: str, holder: str, actor: Actor,
                        successor_class: str = SuccessorClass.REQUIRES_DRAIN,
                        compatibility_evidence: object = None) -> ServingPublicationBarrierSet:
    """Write the `acquiring` barrier set binding the exact active predecessor and verified successor (ID, digest,
    serving scope) before any owner fence is requested (CV2-11-037). Only `requires_drain` is accepted, whatever
    `compatibility_evidence` says (CV2-11-002/003/058). Idempotent for the same holder and successor; another
    open set for the predecessor refuses (one open set per activation scope). Locks: both epochs FOR SHARE."""
    if successor_class not in SUPPORTED_SUCCESSOR_CLASSES:
        raise SuccessorClassUnsupported(f"successor class {successor_class!r} is not authorized; only "
                                        f"requires_drain is (compatibility evidence is not considered)")
    require_succession_perm(actor)
    if not holder or holder != holder.strip():
        raise BarrierSetRefused("a barrier set needs a canonical holder identity")
    predecessor, successor = succession_epoch_get(predecessor_epoch_id), succession_epoch_get(successor_epoch_id)
    # Lock both epochs FOR SHARE (ascending pk) and decide on the locked rows' state.
    locked = {pk: connector_locks.epoch_for_share(pk) for pk in sorted({predecessor.pk, successor.pk})}
    pred_state, succ_state = locked[predecessor.pk].state, locked[successor.pk].state
    existing = ServingPublicationBarrierSet.objects.filter(
        predecessor_epoch=predecessor, state__in=[BarrierSetState.ACQUIRING, BarrierSetState.HELD,
                                                  BarrierSetState.ACTIVATION_COMMITTED]).first()
    if existing is not None:
        if existing.successor_epoch_id == successor.pk:
            check_holder(existing, holder, None)  # taken over: the earlier holder is stale (D-133)
            return existing
        raise BarrierSetRefused(f"{existing} is open for holder {existing.holder}; release it first")
    if pred_state != EpochState.ACTIVE:
        raise BarrierSetRefused(f"predecessor {predecessor.epoch_id} is {pred_state}, not active")
    if succ_state != EpochState.VERIFIED:
        raise SuccessorDrifted(f"successor {successor.epoch_id} is {succ_state}, not verified")
    serving.activation_cardinality_check(accounts=len(epoch_account_ids(successor)))  # before the set exists (D-210)
    if epoch_account_ids(predecessor) != epoch_account_ids(successor):
        raise SuccessorDrifted("the successor's account set differs from the predecessor's gate set; this "
                               "succession moves the same gates only")
    try:
        with transaction.atomic():
            row = ServingPublicationBarrierSet.objects.create(
                predecessor_epoch=predecessor, predecessor_digest=bytes(predecessor.digest), successor_epoch=successor,
                successor_key=successor.epoch_id, successor_digest=bytes(successor.digest),
                scope_digest=bytes(successor.serving_scope_digest), successor_class=successor_class, holder=holder)
    except IntegrityError as exc:
        raise BarrierSetRefused(f"another barrier set opened for {predecessor.epoch_id} concurrently") from exc
    barrier_receipts.record_owner_receipts(row, successor)  # one fenced receipt per owner (CV2-15-009)
    audit_record(actor=actor, entity=row, action="barrier_set_acquire", to_state=row.state, fence=row.fence,
                 evidence_digest=bytes(successor.digest), reason=f"holder {holder}")
    return row


def barrier_set_hold(*, barrier_set_pk: int, expected_fence: int | None, actor: Actor,
                     holder: str | None = None) -> ServingPublicationBarrierSet:
    """`acquiring -> held`: lock the set (FOR UPDATE, after every owner barrier exclusive) and the successor
    epoch (FOR SHARE), reread every owner of the successor under those locks (the final reread, D-285), require the
    same verified bytes and no owner drift, and freeze the owner receipts digest (CV2-11-013/035). Drift raises
    SuccessorDrifted and writes nothing. Idempotent on a set already held."""
    require_succession_perm(actor)
    current = ServingPublicationBarrierSet.objects.get(pk=barrier_set_pk)
    if current.state == BarrierSetState.HELD:
        check_holder(current, holder, None)
        return current
    with transaction.atomic():
        row = locks.barrier_set_for_update(barrier_set_pk)  # every owner barrier exclusive first (D-284)
        check_holder(row, holder, expected_fence)
        if row.state != BarrierSetState.ACQUIRING:
            raise BarrierSetRefused(f"{row} is {row.state}, not acquiring")
        successor = connector_locks.epoch_for_share(row.successor_epoch_id)
        if successor.state != EpochState.VERIFIED or not same_digest(successor.digest, row.successor_digest):
            raise SuccessorDrifted(f"successor {successor.epoch_id} is {successor.state} or not the bound bytes")
        # The final owner reread, under the held fences (CV2-11-013, CV2-02-039, D-285): the activation does not.
        drift = serving.epoch_owner_drift(epoch_pk=row.successor_epoch_id)
        if drift is not None:
            raise SuccessorDrifted(f"successor owners changed under the barrier: {drift[0]}: {drift[1]}")
        missing = barrier_receipts.owner_receipt_problems(row, successor)
        if missing:
            raise SuccessorDrifted("the set's owner receipts are not the successor's owners: " + "; ".join(missing))
        row.hold(owner_receipts_digest=epoch_owner_receipts_digest(successor))
        row.save()
        audit_record(actor=actor, entity=row, action="barrier_set_hold", from_state=BarrierSetState.ACQUIRING,
                     to_state=row.state, fence=row.fence, evidence_digest=bytes(row.owner_receipts_digest))
    return row


def record_release(row: ServingPublicationBarrierSet, reason: str, actor: Actor) -> ServingPublicationBarrierSet:
    """`row` (locked FOR UPDATE by the caller, its release already judged legal) -> `released`, with its audit row:
    the one write of every release path, successor and first activation alike."""
    from_state = row.state
    row.release(reason=reason)
    row.save()
    release_drain_of(row, actor=actor)  # the drain ends with its set: the predecessor's roots reopen (D-315)
    audit_record(actor=actor, entity=row, action="barrier_set_release", from_state=from_state, to_state=row.state,
                 fence=row.fence, reason=reason)
    return row


@transaction.atomic
def barrier_set_release(*, barrier_set_pk: int, expected_fence: int | None, reason: str, actor: Actor,
                        replacement: bool = False, holder: str | None = None) -> ServingPublicationBarrierSet:
    """Explicit fenced release (never by elapsed time, CV2-11-036/045). Locks the set FOR UPDATE, then gates.

    - `acquiring -> released`: always (no owner fence was frozen).
    - `held -> released`: before any OrderingHandoff of the predecessor, an abort that lets gates resume the
      predecessor (CV2-11-019/038/044); after the first handoff only as `replacement=True` of the candidate while
      every gate stays `v2_halted` (CV2-11-039/022).
    - `activation_committed -> released`: only after readback shows the successor `active`, the predecessor
      `draining` and every gate `v2_serving` naming the successor's exact ID and digest (CV2-11-025/044).
    """
    require_succession_perm(actor)
    if not reason.strip():
        raise BarrierSetRefused("a release needs a reason")
    row = locks.barrier_set_for_update(barrier_set_pk)
    check_holder(row, holder, expected_fence)
    from_state = row.state
    if from_state == BarrierSetState.RELEASED:
        raise BarrierSetRefused(f"{row} is already released (terminal)")
    predecessor = ServingEpoch.objects.select_related("configuration").get(pk=row.predecessor_epoch_id)
    accounts = epoch_account_ids(predecessor)
    if from_state == BarrierSetState.HELD:
        handoff = OrderingHandoff.objects.filter(predecessor_epoch_id=row.predecessor_epoch_id).first()
        if handoff is not None:
            if not replacement:
                raise BarrierSetRefused(f"OrderingHandoff #{handoff.pk} is committed: the barrier set may be released "
                                        "only to replace the candidate while every gate stays v2_halted")
            gates = locks.gates_for_share(accounts)
            not_halted = [g for g in gates if g.mode != GateMode.V2_HALTED]
            if not_halted or len(gates) != len(accounts):
                raise BarrierSetRefused("a replacement release needs every gate v2_halted; not halted: "
                                        + ", ".join(f"{g.account_id}={g.mode}" for g in not_halted[:10]))
    elif from_state == BarrierSetState.ACTIVATION_COMMITTED:
        successor = ServingEpoch.objects.get(pk=row.successor_epoch_id)
        gates = list(AccountServingGate.objects.filter(account_id__in=accounts))
        if (successor.state != EpochState.ACTIVE or predecessor.state != EpochState.DRAINING
                or not same_digest(successor.digest, row.successor_digest) or len(gates) != len(accounts)
                or any(g.mode != GateMode.V2_SERVING or g.epoch_id != successor.pk
                       or not same_digest(g.epoch_digest, row.successor_digest) for g in gates)):
            raise BarrierSetRefused("activation readback does not show the exact successor serving every gate")
    return record_release(row, reason + (" (replacement)" if replacement else ""), actor)


def barrier_set_abort_for_revocation(row: ServingPublicationBarrierSet, *, reason: str,
                                     actor: Actor) -> ServingPublicationBarrierSet:
    """An urgent credential revocation before the successor's local activation transaction (CV2-11-042): the held
    set is released. Before the predecessor's first OrderingHandoff that is the ordinary abort (the gates may
    resume the predecessor, CV2-11-019/038); after it, the release of the candidate (CV2-11-039/022): every gate
    stays `v2_halted` (after the cutoff no gate leaves `v2_halted` but by the activation, which needs this set
    held) and a replacement successor derives from the frozen handoffs. Called by the revocation guard
    (`first_activation.revocation_guard`) with every owner barrier exclusive and `row` locked FOR UPDATE; it
    locks nothing more (the revocation already holds its credential gate: the documented exception to the lock
    order, docs/locking.md "Owner barriers")."""
    if row.state != BarrierSetState.HELD:
        raise BarrierSetRefused(f"{row} is {row.state}; only a held set is aborted by a revocation")
    cut_off = OrderingHandoff.objects.filter(predecessor_epoch_id=row.predecessor_epoch_id).exists()
    return record_release(row, reason + (" before the successor's activation (replacement: gates stay v2_halted)"
                                         if cut_off else " before the successor's activation"), actor)


# -- ordering handoff -----------------------------------------------------------------------------------------

def _route(epoch: ServingEpoch, account_id: int, channel: str):
    try:
        return route_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), account_id=account_id,
                         channel=channel)
    except ConnectorError as exc:
        raise HandoffRefused(f"epoch {epoch.epoch_id} has no route {channel} for account {account_id}: "
                             f"{exc.detail}") from exc


def handoff_epochs_for_share(row: ServingPublicationBarrierSet, holder: str | None = None,
                             expected_fence: int | None = None) -> tuple[ServingEpoch, ServingEpoch]:
    """Under a held set's share lock (its holder and fence checked): both epochs FOR SHARE, ascending pk, each the
    bound state and bytes."""
    check_holder(row, holder, expected_fence)
    if row.state != BarrierSetState.HELD:
        raise HandoffRefused(f"{row} is {row.state}; handoffs run under a held barrier set")
    epochs = {pk: connector_locks.epoch_for_share(pk)
              for pk in sorted({row.predecessor_epoch_id, row.successor_epoch_id})}
    pred, succ = epochs[row.predecessor_epoch_id], epochs[row.successor_epoch_id]
    if pred.state != EpochState.ACTIVE or not same_digest(pred.digest, row.predecessor_digest):
        raise HandoffRefused(f"predecessor {pred.epoch_id} is {pred.state} or not the bound bytes")
    if succ.state != EpochState.VERIFIED or not same_digest(succ.digest, row.successor_digest):
        raise HandoffRefused(f"successor {succ.epoch_id} is {succ.state} or not the bound bytes")
    return pred, succ


def ordering_handoff(*, barrier_set_pk: int, lane_pk: int, actor: Actor, holder: str | None = None) -> OrderingHandoff:
    """Freeze one predecessor lane and stage its successor lane (CV2-11-014/015/018/046).

    One transaction: barrier set FOR SHARE (must be `held`), both epochs FOR SHARE (predecessor `active`,
    successor `verified`, the bound digests), every gate FOR SHARE (all `v2_halted` on the predecessor), then the
    lane FOR UPDATE. Refuses while the lane has an active or nonterminal execution or a pending projection, is
    halted, or its comparator/partition contract differs in the successor, and while any predecessor receipt
    awaits materialization (D-268). Then it advances the lane fence and
    freezes the lane (`halted`, ORDERING_HANDOFF), so no predecessor claim or result can move it again, creates
    the successor lane with baseline = high-water = the frozen high-water, and appends the immutable handoff.
    A predecessor result racing this either committed first (its high-water is frozen here) or finds no
    nonterminal work left to settle. A lane already frozen for a successor that was since rejected is not
    touched again: the replacement successor's handoff copies the frozen high-water and fence and cites the
    earlier handoff (`derived_from`). Idempotent: an existing handoff for the lane is returned."""
    require_succession_perm(actor)
    row = ServingPublicationBarrierSet.objects.select_related("predecessor_epoch", "successor_epoch").get(
        pk=barrier_set_pk)
    existing = OrderingHandoff.objects.filter(successor_epoch_id=row.successor_epoch_id,
                                              predecessor_lane_id=lane_pk).first()
    if existing is not None:
        return existing
    lane = OrderingLane.objects.get(pk=lane_pk)
    predecessor, successor = row.predecessor_epoch, row.successor_epoch
    if lane.epoch_id != predecessor.pk:
        raise HandoffRefused(f"lane {lane.pk} belongs to another epoch than the predecessor {predecessor.epoch_id}")
    old_route = _route(predecessor, lane.account_id, lane.route)
    new_route = _route(successor, lane.account_id, lane.route)
    old_digest = contract_digest(contract=old_route.contract, ordering=old_route.ordering)
    new_digest = contract_digest(contract=new_route.contract, ordering=new_route.ordering)
    if old_digest != new_digest:
        raise HandoffRefused("the successor changes the comparator or partition derivation of route "
                             f"{lane.route}; no total L1 transformation with a snapshot barrier exists")
    accounts = epoch_account_ids(predecessor)
    with transaction.atomic():
        row = locks.barrier_set_for_share(barrier_set_pk)
        pred, succ = handoff_epochs_for_share(row, holder)
        gates = locks.gates_for_share(accounts)
        bad = [g for g in gates if g.mode != GateMode.V2_HALTED or g.epoch_id != pred.pk]
        if bad or len(gates) != len(accounts):
            raise HandoffRefused("every gate must be v2_halted on the predecessor before a handoff; not halted: "
                                 + ", ".join(f"{g.account_id}={g.mode}" for g in bad[:10]))
        # A receipt not materialized now never will be once the predecessor is frozen (D-268): the guard
        # materializes only under an active epoch on a v2_serving gate. Before the first handoff the predecessor
        # may still resume, materialize it and halt again.
        waiting = unmaterialized_receipts_of_epoch(epoch_pk=pred.pk)
        if waiting:
            raise HandoffRefused("predecessor receipts await materialization: "
                                 + ", ".join(f"receipt #{pk}" for pk in waiting)
                                 + "; resume the predecessor, let them materialize, then halt again")
        lane = connector_locks.lane_for_update(lane_pk)
        existing = OrderingHandoff.objects.filter(successor_epoch=succ, predecessor_lane=lane).first()
        if existing is not None:
            return existing
        prior = None
        if lane.halt_reason == HANDOFF_HALT_REASON:
            # Already frozen (the forward-only cutoff): a replacement successor derives from the frozen handoff
            # and cites it; the predecessor lane is never unfrozen or touched again (CV2-11-021/022).
            prior = (OrderingHandoff.objects.filter(predecessor_lane=lane).select_related("successor_epoch")
                     .order_by("-pk").first())
            if prior is None or prior.successor_epoch.state != EpochState.REJECTED:
                raise HandoffRefused(f"lane {lane.pk} is frozen by a handoff to successor "
                                     f"{prior.successor_epoch.epoch_id if prior else '?'}, which is not rejected; "
                                     "reject that candidate before staging a replacement")
            if lane.fence != prior.predecessor_lane_fence or lane.high_water != prior.high_water:
                raise HandoffRefused(f"lane {lane.pk} moved after its handoff #{prior.pk}")
            frozen_fence = prior.predecessor_lane_fence
        else:
            if lane.state != LaneState.OPEN:
                raise HandoffRefused(f"lane {lane.pk} is halted ({lane.halt_reason}); remediate the partition first")
            if lane.active_execution_id is not None or Execution.objects.filter(
                    lane=lane, state__in=EXECUTION_ACTIVE).exists():
                raise HandoffRefused(f"lane {lane.pk} ({lane.route}/{lane.partition}) has a nonterminal execution")
            if Projection.objects.filter(lane=lane, lane_status="pending").exists():
                raise HandoffRefused(f"lane {lane.pk} ({lane.route}/{lane.partition}) has pending positions")
            frozen_fence = lane.fence + 1
            lane_handoff.lane_freeze_for_handoff(lane_pk=lane.pk, fence=lane.fence)
        tie = None if lane.high_water_tie is None else bytes(lane.high_water_tie)
        try:
            successor_lane = lane_handoff.successor_lane_create(epoch=succ, lane=lane,
                                                                route_version=new_route.version, tie=tie)
        except IntegrityError as exc:
            raise HandoffRefused(f"the successor lane of {lane.route}/{lane.partition} already exists") from exc
        handoff = OrderingHandoff(
            barrier_set=row, predecessor_epoch=pred, successor_epoch=succ, account_id=lane.account_id,
            predecessor_lane=lane, predecessor_lane_fence=frozen_fence, successor_lane=successor_lane,
            route=lane.route, predecessor_route_version=lane.route_version,
            successor_route_version=new_route.version, partition=lane.partition, contract=lane.contract,
            contract_digest=old_digest, high_water=lane.high_water, high_water_tie=tie, derived_from=prior)
        handoff.handoff_digest = digest_of_handoff(handoff)
        handoff.save()
        audit_record(actor=actor, entity=handoff, action="ordering_handoff", fence=frozen_fence,
                     evidence_digest=bytes(handoff.handoff_digest),
                     reason=(f"lane {lane.pk} frozen at high-water {lane.high_water}" if prior is None else
                             f"derived from handoff #{prior.pk} of abandoned successor "
                             f"{prior.successor_epoch.epoch_id} (high-water {lane.high_water})"))
    return handoff


# -- activation -----------------------------------------------------------------------------------------------

def successor_activate(*, barrier_set_pk: int, expected_fence: int | None, actor: Actor,
                       holder: str | None = None) -> ServingEpoch:
    """The one successor activation transaction (CV2-11-023/024/057); the hold reread the owners (D-285).

    Locks, in order: the barrier set FOR UPDATE (`held`, holder fence), predecessor and successor epochs FOR
    UPDATE (ascending pk; `active` and `verified` with the bound digests), every gate FOR UPDATE (ascending
    account id; all `v2_halted` on the predecessor), every predecessor and successor lane FOR UPDATE (ascending
    pk). Requires every RemoteEffect, Execution and window of the predecessor terminal, and one handoff per
    predecessor lane, each byte-equal to its recomputed digest (checked before the transaction: handoff rows are
    append-only; a handoff written since is checked under the locks, D-280), its frozen predecessor lane and its
    successor lane baseline (one join under the locks). Then records barrier set `held -> activation_committed`,
    predecessor `active -> draining`, successor `verified -> active`, and every gate `v2_halted -> v2_serving`
    naming the successor with a new fence (one statement moves every gate and writes their audit rows, D-210,
    D-279), with audit rows. Any refusal moves nothing. Idempotent once committed (returns the active
    successor)."""
    require_succession_perm(actor)
    current = ServingPublicationBarrierSet.objects.get(pk=barrier_set_pk)
    if current.state == BarrierSetState.ACTIVATION_COMMITTED:
        check_holder(current, holder, None)
        return ServingEpoch.objects.get(pk=current.successor_epoch_id)
    if current.successor_class != SuccessorClass.REQUIRES_DRAIN:
        raise SuccessorClassUnsupported()
    # No owner reread (D-285: the hold's, under its locks, is final); the frozen receipts are compared again.
    successor = ServingEpoch.objects.defer("preimage").get(pk=current.successor_epoch_id)
    frozen = epoch_owner_receipts_digest(successor)
    try:  # an order_independent route needs no lane handoff, only its conformance proof, checked again (D-310)
        epoch_ordering_proofs(epoch_pk=successor.pk, epoch_digest=bytes(successor.digest))
    except ConnectorError as exc:
        raise SuccessorActivationRefused(f"successor {successor.epoch_id}: {exc.code}: {exc.detail}") from exc
    predecessor = ServingEpoch.objects.defer("preimage").get(pk=current.predecessor_epoch_id)
    accounts = epoch_account_ids(predecessor)
    serving.activation_cardinality_check(accounts=len(accounts))
    verified = verify_handoff_digests(OrderingHandoff.objects.filter(successor_epoch_id=current.successor_epoch_id))
    with transaction.atomic():
        row = locks.barrier_set_for_update(barrier_set_pk)
        check_holder(row, holder, expected_fence)
        if row.state != BarrierSetState.HELD:
            raise SuccessorActivationRefused(f"{row} is {row.state}; activation needs a held barrier set")
        epochs = {e.pk: e for e in connector_locks.epochs_for_update([row.predecessor_epoch_id,
                                                                      row.successor_epoch_id])}
        pred, succ = epochs[row.predecessor_epoch_id], epochs[row.successor_epoch_id]
        if pred.state != EpochState.ACTIVE or not same_digest(pred.digest, row.predecessor_digest):
            raise SuccessorActivationRefused(f"predecessor {pred.epoch_id} is {pred.state} or not the bound bytes")
        if succ.state != EpochState.VERIFIED or not same_digest(succ.digest, row.successor_digest):
            raise SuccessorDrifted(f"successor {succ.epoch_id} is {succ.state} or not the bound bytes")
        if row.owner_receipts_digest is None or not same_digest(frozen, row.owner_receipts_digest):
            raise SuccessorDrifted(f"successor {succ.epoch_id}: owner receipts differ from those frozen when the "
                                   "barrier set was held")
        gates = connector_locks.gates_for_update(accounts)
        bad = [g for g in gates if g.mode != GateMode.V2_HALTED or g.epoch_id != pred.pk
               or not same_digest(g.epoch_digest, pred.digest)]
        if bad or len(gates) != len(accounts):
            raise SuccessorActivationRefused("every gate must be v2_halted on the predecessor; not halted: "
                                             + ", ".join(f"{g.account_id}={g.mode}" for g in bad[:10]))
        # Effects only move toward terminal while every gate is halted (no permit can be acquired), so a read
        # under the gate locks is enough: nothing nonterminal may cross the epoch boundary (CV2-11-012/053).
        open_effects = nonterminal_effects_of_epoch(epoch_pk=pred.pk)
        if open_effects:
            raise SuccessorActivationRefused("predecessor outbound work is not terminal: " + ", ".join(open_effects))
        # The same for inbound work outside lanes (order-independent executions, open windows).
        open_inbound = [f"execution #{pk}" for pk in Execution.objects.filter(
            epoch=pred, state__in=EXECUTION_ACTIVE).order_by("pk").values_list("pk", flat=True)[:10]]
        open_inbound += [f"receipt #{pk} awaiting materialization"
                         for pk in unmaterialized_receipts_of_epoch(epoch_pk=pred.pk)]
        open_inbound += [f"window #{pk}" for pk in ProjectionWindow.objects.filter(
            epoch=pred, state="open").order_by("pk").values_list("pk", flat=True)[:10]]
        if open_inbound:
            raise SuccessorActivationRefused("predecessor inbound work is not terminal: " + ", ".join(open_inbound))
        # Every lane of both epochs locked by epoch, then every handoff compared with its lanes (D-288).
        predecessor_lanes = locks.epoch_lanes_for_update([pred.pk, succ.pk], counting=pred.pk)
        params = {"pred": pred.pk, "succ": succ.pk, "halt_reason": HANDOFF_HALT_REASON}
        with transaction.get_connection().cursor() as cursor:
            cursor.execute(HANDOFF_LANE_COMPARISON_SQL, params)
            handoff_count, mismatched = cursor.fetchone()
            if handoff_count != predecessor_lanes and not mismatched:
                cursor.execute(LANES_WITHOUT_HANDOFF_SQL, params)
                missing = [pk for (pk,) in cursor.fetchall()]
                raise SuccessorActivationRefused(
                    f"{predecessor_lanes - handoff_count} predecessor lane(s) have no OrderingHandoff: "
                    + ", ".join(map(str, missing)))
        if handoff_count != verified:  # one written after the check above: all verified again, under the locks
            verify_handoff_digests(OrderingHandoff.objects.filter(successor_epoch=succ))
        if mismatched:
            raise SuccessorActivationRefused("OrderingHandoff " + ", ".join(f"#{pk}" for pk in mismatched)
                                             + " does not byte-match its lanes")
        row.commit_activation()
        row.save()
        audit_record(actor=actor, entity=row, action="successor_activate", from_state=BarrierSetState.HELD,
                     to_state=row.state, fence=row.fence, evidence_digest=bytes(succ.digest))
        serving.epochs_hand_over(predecessor=pred, successor=succ, actor=actor)
        # Set-based (D-210, D-279): one statement moves every gate v2_halted -> v2_serving naming the successor (the
        # edge read from the django-fsm declaration, the triggers judging each row) and writes their audit rows.
        gate_services.gates_bind_epoch(gates=gates, action="activate_successor", epoch=succ, actor=actor,
                                       evidence_digest=bytes(succ.digest))
        fault_point("succession.before_commit")
    fault_point("succession.after_commit")
    return succ
