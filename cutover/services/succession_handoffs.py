"""The successor's ordering handoffs, set-based (issue 19, D-282): many predecessor lanes per transaction.

`handoff_chunk` does for the lanes of a chunk of accounts (at most CONNECTOR["HALT_CHUNK_ACCOUNTS"]) what
`succession.ordering_handoff` does for one lane, with the same checks and the same rows, in one transaction whose
statement count does not grow with the chunk. A lane that fails a lane check is refused and listed; the others of
the chunk proceed. A check of the whole succession (barrier set, epochs, gates, unmaterialized receipts) refuses
the whole chunk, as it would refuse every single-lane handoff.

Locks, in the canonical order (docs/locking.md): barrier set FOR SHARE, both epochs FOR SHARE (ascending pk),
gates FOR SHARE in ascending account id: EVERY gate of the service while no handoff of the predecessor is committed
(the first handoff is the forward-only cutoff: a predecessor resume must wait for it and then see it, as with the
single-lane path), afterwards the chunk's gates only plus a read that no other gate is anything but v2_halted on
the predecessor (a resume is then refused by its blocker, which reads the committed handoffs under the gate's
FOR UPDATE); then the chunk's lanes FOR UPDATE, ascending pk.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from connector.actors import Actor
from connector.choices import EXECUTION_ACTIVE, EpochState, GateMode, LaneState
from connector.selectors.routes import ChannelNotFound, routes_for_accounts
from connector.selectors.rows import AccountServingGate, Execution, OrderingLane, Projection, ServingEpoch
from connector.selectors.serving import unmaterialized_receipts_of_epoch
from connector.services import lane_handoff
from connector.services.audit import audit_records_each
from cutover import locks
from cutover.errors import HandoffRefused
from cutover.models import OrderingHandoff, ServingPublicationBarrierSet
from cutover.services.succession import (
    HANDOFF_HALT_REASON,
    epoch_account_ids,
    digest_of_handoff,
    require_succession_perm,
    contract_digest,
    handoff_epochs_for_share,
)


@dataclass
class HandoffChunk:
    """What one chunk transaction did: the handoff of every lane done (new or existing), refusals per lane."""

    done: dict[int, OrderingHandoff] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)


def _contracts(lanes: list[dict], predecessor: ServingEpoch, successor: ServingEpoch, out: HandoffChunk) -> dict:
    """Before the transaction, as the single-lane path: each lane's route in both epochs (`routes_for_accounts`:
    one query per epoch and route for the accounts' enabled routes, the compiled program cached per epoch digest)
    and the contract digest. Returns {lane pk: (old digest, successor route version)}."""
    routes: dict[tuple[int, int, str], object] = {}
    for epoch in (predecessor, successor):
        for channel in sorted({lane["route"] for lane in lanes}):
            accounts = sorted({lane["account_id"] for lane in lanes if lane["route"] == channel})
            for account_id, program in routes_for_accounts(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest),
                                                           account_ids=accounts, channel=channel).items():
                routes[(epoch.pk, account_id, channel)] = program
    found = {}
    for lane in lanes:
        old_route, new_route = (routes[(epoch.pk, lane["account_id"], lane["route"])]
                                for epoch in (predecessor, successor))
        absent = next(((epoch, route) for epoch, route in ((predecessor, old_route), (successor, new_route))
                       if isinstance(route, ChannelNotFound)), None)
        if absent is not None:
            out.refused[lane["pk"]] = (f"epoch {absent[0].epoch_id} has no route {lane['route']} for account "
                                       f"{lane['account_id']}: {absent[1].detail}")
            continue
        old_digest = contract_digest(contract=old_route.contract, ordering=old_route.ordering)
        if old_digest != contract_digest(contract=new_route.contract, ordering=new_route.ordering):
            out.refused[lane["pk"]] = ("the successor changes the comparator or partition derivation of route "
                                       f"{lane['route']}; no total L1 transformation with a snapshot barrier exists")
            continue
        found[lane["pk"]] = (old_digest, new_route.version)
    return found


def _succession_locked(row: ServingPublicationBarrierSet, accounts: list[int], chunk_accounts: list[int],
                       holder: str | None = None):
    """The checks of the whole succession under their locks (raise HandoffRefused for the chunk, FENCE_STALE for a
    coordinator that no longer holds the set)."""
    pred, succ = handoff_epochs_for_share(row, holder)
    cutoff_committed = OrderingHandoff.objects.filter(predecessor_epoch_id=pred.pk).exists()
    locked = chunk_accounts if cutoff_committed else accounts
    gates = locks.gates_for_share(locked)
    bad = [(g.account_id, g.mode) for g in gates if g.mode != GateMode.V2_HALTED or g.epoch_id != pred.pk]
    complete = len(gates) == len(locked)
    if cutoff_committed and complete and not bad:
        # The other gates, read without a lock: after the cutoff none may leave v2_halted but by the activation.
        service = AccountServingGate.objects.filter(account_id__in=accounts)
        counted = service.aggregate(n=Count("pk"),
                                    bad=Count("pk", filter=~Q(mode=GateMode.V2_HALTED, epoch_id=pred.pk)))
        complete = counted["n"] == len(accounts)
        if counted["bad"]:
            bad = list(service.exclude(mode=GateMode.V2_HALTED, epoch_id=pred.pk).order_by("account_id")
                       .values_list("account_id", "mode")[:10])
    if bad or not complete:
        raise HandoffRefused("every gate must be v2_halted on the predecessor before a handoff; not halted: "
                             + ", ".join(f"{a}={m}" for a, m in bad[:10]))
    waiting = unmaterialized_receipts_of_epoch(epoch_pk=pred.pk)
    if waiting:
        raise HandoffRefused("predecessor receipts await materialization: "
                             + ", ".join(f"receipt #{pk}" for pk in waiting)
                             + "; resume the predecessor, let them materialize, then halt again")
    return pred, succ


def _lane_refusals(lanes: list[OrderingLane], succ: ServingEpoch, versions: dict[int, int],
                   out: HandoffChunk) -> dict[int, OrderingHandoff]:
    """The lane checks of the single-lane path for the locked lanes, one query per kind: refused lanes go to
    `out.refused`; returns {lane pk: prior handoff} of the lanes frozen for a rejected successor."""
    pks = [lane.pk for lane in lanes]
    frozen = [lane.pk for lane in lanes if lane.halt_reason == HANDOFF_HALT_REASON]
    priors: dict[int, OrderingHandoff] = {}
    for h in (OrderingHandoff.objects.filter(predecessor_lane_id__in=frozen).select_related("successor_epoch")
              .order_by("predecessor_lane_id", "-pk").distinct("predecessor_lane_id") if frozen else []):
        priors[h.predecessor_lane_id] = h
    busy = set(Execution.objects.filter(lane_id__in=pks, state__in=EXECUTION_ACTIVE)
               .values_list("lane_id", flat=True))
    pending = set(Projection.objects.filter(lane_id__in=pks, lane_status="pending")
                  .values_list("lane_id", flat=True))
    taken = set(OrderingLane.objects.filter(epoch=succ, account_id__in={lane.account_id for lane in lanes})
                .values_list("account_id", "route", "route_version", "partition"))
    derived = {}
    for lane in lanes:
        if lane.halt_reason == HANDOFF_HALT_REASON:
            prior = priors.get(lane.pk)
            if prior is None or prior.successor_epoch.state != EpochState.REJECTED:
                out.refused[lane.pk] = (f"lane {lane.pk} is frozen by a handoff to successor "
                                        f"{prior.successor_epoch.epoch_id if prior else '?'}, which is not rejected; "
                                        "reject that candidate before staging a replacement")
            elif lane.fence != prior.predecessor_lane_fence or lane.high_water != prior.high_water:
                out.refused[lane.pk] = f"lane {lane.pk} moved after its handoff #{prior.pk}"
            else:
                derived[lane.pk] = prior
        elif lane.state != LaneState.OPEN:
            out.refused[lane.pk] = f"lane {lane.pk} is halted ({lane.halt_reason}); remediate the partition first"
        elif lane.active_execution_id is not None or lane.pk in busy:
            out.refused[lane.pk] = f"lane {lane.pk} ({lane.route}/{lane.partition}) has a nonterminal execution"
        elif lane.pk in pending:
            out.refused[lane.pk] = f"lane {lane.pk} ({lane.route}/{lane.partition}) has pending positions"
        if lane.pk not in out.refused and (lane.account_id, lane.route, versions[lane.pk], lane.partition) in taken:
            out.refused[lane.pk] = f"the successor lane of {lane.route}/{lane.partition} already exists"
    return derived


# The handoffs of a chunk, one statement (created_at as auto_now_add).
_INSERT_HANDOFFS_SQL = """
INSERT INTO cutover_orderinghandoff (barrier_set_id, predecessor_epoch_id, successor_epoch_id, account_id,
                                     predecessor_lane_id, predecessor_lane_fence, successor_lane_id, route,
                                     predecessor_route_version, successor_route_version, partition, contract,
                                     contract_digest, high_water, high_water_tie, derived_from_id, handoff_digest,
                                     created_at)
SELECT %(barrier_set)s, %(predecessor)s, %(successor)s, v.account_id, v.lane_id, v.fence, v.successor_lane_id,
       v.route, v.old_version, v.new_version, v.partition, v.contract, v.contract_digest, v.high_water, v.tie,
       v.derived_from_id, v.digest, %(now)s::timestamptz
  FROM unnest(%(accounts)s::bigint[], %(lanes)s::bigint[], %(fences)s::bigint[], %(successor_lanes)s::bigint[],
              %(routes)s::text[], %(old_versions)s::int[], %(new_versions)s::int[], %(partitions)s::text[],
              %(contracts)s::text[], %(contract_digests)s::bytea[], %(high_waters)s::numeric[], %(ties)s::bytea[],
              %(derived)s::bigint[], %(digests)s::bytea[]) WITH ORDINALITY
       AS v(account_id, lane_id, fence, successor_lane_id, route, old_version, new_version, partition, contract,
            contract_digest, high_water, tie, derived_from_id, digest, ordinal)
 ORDER BY v.ordinal
RETURNING id, predecessor_lane_id"""


def _stage_lanes(succ: ServingEpoch, lanes: list[OrderingLane], versions: dict[int, int],
                 ties: dict[int, bytes | None]) -> dict[int, int]:
    """Insert the successor lane of every lane (baseline = high-water = the frozen high-water, origin
    ORDERING_HANDOFF); returns {predecessor lane pk: successor lane pk}. A concurrent insert of the same lane
    refuses the chunk."""
    try:
        created = lane_handoff.successor_lanes_insert(epoch_pk=succ.pk, lanes=lanes, versions=versions, ties=ties)
    except IntegrityError as exc:
        raise HandoffRefused("a successor lane of this chunk already exists (created concurrently); nothing was "
                             "handed off: rerun the phase") from exc
    return {lane.pk: created[(lane.account_id, lane.route, versions[lane.pk], lane.partition)] for lane in lanes}


def _insert_handoffs(handoffs: list[OrderingHandoff]) -> None:
    """Insert the handoffs (built and digested by the caller) in one statement and give each its pk."""
    assert OrderingHandoff._meta.db_table == "cutover_orderinghandoff"
    first = handoffs[0]
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(_INSERT_HANDOFFS_SQL, {
            "barrier_set": first.barrier_set_id, "predecessor": first.predecessor_epoch_id,
            "successor": first.successor_epoch_id, "now": timezone.now(),
            "accounts": [h.account_id for h in handoffs], "lanes": [h.predecessor_lane_id for h in handoffs],
            "fences": [h.predecessor_lane_fence for h in handoffs],
            "successor_lanes": [h.successor_lane_id for h in handoffs], "routes": [h.route for h in handoffs],
            "old_versions": [h.predecessor_route_version for h in handoffs],
            "new_versions": [h.successor_route_version for h in handoffs],
            "partitions": [h.partition for h in handoffs], "contracts": [h.contract for h in handoffs],
            "contract_digests": [bytes(h.contract_digest) for h in handoffs],
            "high_waters": [h.high_water for h in handoffs], "ties": [h.high_water_tie for h in handoffs],
            "derived": [h.derived_from_id for h in handoffs], "digests": [bytes(h.handoff_digest) for h in handoffs]})
        created = {lane: pk for pk, lane in cursor.fetchall()}
    for handoff in handoffs:
        handoff.pk = created[handoff.predecessor_lane_id]


def handoff_chunk(*, barrier_set_pk: int, lane_pks: list[int], actor: Actor,
                  holder: str | None = None) -> HandoffChunk:
    """Freeze the predecessor lanes `lane_pks` (the lanes of at most HALT_CHUNK_ACCOUNTS accounts) and stage their
    successor lanes, as `succession.ordering_handoff` does for each, in one transaction: the locks of the module
    docstring, then ONE UPDATE freezing the lanes (`halted`, ORDERING_HANDOFF, fence + 1), ONE INSERT of the
    successor lanes (baseline = high-water = the frozen high-water), ONE INSERT of the handoffs (digest
    `handoff_digests.digest_of_handoff`) and ONE audit INSERT. A lane frozen for a rejected successor is not
    touched: its handoff cites the earlier one (`derived_from`). A lane already handed off to this successor is
    returned as done; a lane failing a lane check is refused and listed; a failed succession check raises
    HandoffRefused and writes nothing. Statements per chunk do not grow with the chunk (a test pins them)."""
    require_succession_perm(actor)
    out = HandoffChunk()
    row = ServingPublicationBarrierSet.objects.select_related("predecessor_epoch__configuration",
                                                              "successor_epoch").get(pk=barrier_set_pk)
    predecessor, successor = row.predecessor_epoch, row.successor_epoch
    lanes = list(OrderingLane.objects.filter(pk__in=lane_pks).order_by("pk")
                 .values("pk", "epoch_id", "account_id", "route"))
    for lane in lanes:
        if lane["epoch_id"] != predecessor.pk:
            out.refused[lane["pk"]] = (f"lane {lane['pk']} belongs to another epoch than the predecessor "
                                       f"{predecessor.epoch_id}")
    contracts = _contracts([lane for lane in lanes if lane["pk"] not in out.refused], predecessor, successor, out)
    accounts = epoch_account_ids(predecessor)
    with transaction.atomic():
        row = locks.barrier_set_for_share(barrier_set_pk)
        pred, succ = _succession_locked(row, accounts, sorted({lane["account_id"] for lane in lanes}), holder)
        locked = locks.lane_rows_for_update(contracts)
        existing = {h.predecessor_lane_id: h for h in OrderingHandoff.objects.filter(
            successor_epoch=succ, predecessor_lane_id__in=[lane.pk for lane in locked])}
        out.done.update(existing)
        todo = [lane for lane in locked if lane.pk not in existing]
        derived = _lane_refusals(todo, succ, {pk: version for pk, (_digest, version) in contracts.items()}, out)
        todo = [lane for lane in todo if lane.pk not in out.refused]
        if not todo:
            return out
        fresh = [lane.pk for lane in todo if lane.pk not in derived]
        frozen = lane_handoff.lanes_freeze_for_handoff(fresh)
        if frozen != len(fresh):
            raise HandoffRefused(f"{len(fresh) - frozen} lane(s) changed under their lock; nothing was handed off")
        ties = {lane.pk: None if lane.high_water_tie is None else bytes(lane.high_water_tie) for lane in todo}
        staged = _stage_lanes(succ, todo, {pk: version for pk, (_digest, version) in contracts.items()}, ties)
        handoffs = []
        for lane in todo:
            prior = derived.get(lane.pk)
            handoff = OrderingHandoff(
                barrier_set=row, predecessor_epoch=pred, successor_epoch=succ, account_id=lane.account_id,
                predecessor_lane=lane, successor_lane_id=staged[lane.pk],
                predecessor_lane_fence=lane.fence + 1 if prior is None else prior.predecessor_lane_fence,
                route=lane.route, predecessor_route_version=lane.route_version,
                successor_route_version=contracts[lane.pk][1], partition=lane.partition, contract=lane.contract,
                contract_digest=contracts[lane.pk][0], high_water=lane.high_water, high_water_tie=ties[lane.pk],
                derived_from=prior)
            handoff.handoff_digest = digest_of_handoff(handoff)
            handoffs.append(handoff)
        _insert_handoffs(handoffs)
        audit_records_each(actor=actor, model=OrderingHandoff, action="ordering_handoff", rows=[
            (h.pk, h.predecessor_lane_fence, bytes(h.handoff_digest),
             f"lane {h.predecessor_lane_id} frozen at high-water {h.high_water}" if h.derived_from is None else
             f"derived from handoff #{h.derived_from.pk} of abandoned successor "
             f"{h.derived_from.successor_epoch.epoch_id} (high-water {h.high_water})") for h in handoffs])
        out.done.update({h.predecessor_lane_id: h for h in handoffs})
    return out
