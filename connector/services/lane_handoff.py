"""The OrderingLane writes of a succession handoff and of cutover's lane initialization (issue 39: each app owns
its tables; decision D-550).

cutover decides when a lane is frozen for a handoff, when a successor lane is staged and when a lane starts from a
V1 baseline; connector, which owns `connector_orderinglane`, writes the rows. Each function runs in the CALLER's
transaction (it asserts one is open) after the caller took the locks of docs/locking.md (the lanes FOR UPDATE,
ascending pk): the statements, locks, lock order, fences and transaction boundaries are the caller's, unchanged.
A duplicate successor lane surfaces as the IntegrityError of the unique lane key, inside its own savepoint, for the
caller to refuse in its own terms (nothing of the caller's transaction is lost).
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from connector.choices import LaneState
from connector.models import OrderingLane, ServingEpoch

__all__ = ["HANDOFF_BASELINE_ORIGIN", "HANDOFF_HALT_REASON", "SuccessorLane", "lane_create_from_baseline",
           "lane_freeze_for_handoff", "lanes_freeze_for_handoff", "successor_lane_create", "successor_lanes_insert"]

HANDOFF_HALT_REASON = "ORDERING_HANDOFF"
HANDOFF_BASELINE_ORIGIN = "ordering_handoff"


def _in_transaction() -> None:
    assert transaction.get_connection().in_atomic_block, "lane writes run inside the caller's transaction"


def lane_freeze_for_handoff(*, lane_pk: int, fence: int) -> int:
    """Freeze one predecessor lane locked FOR UPDATE by the caller at `fence`: `halted`, ORDERING_HANDOFF, fence + 1
    (one UPDATE fenced on the read fence). Returns the rows updated (0 if the fence moved)."""
    _in_transaction()
    return OrderingLane.objects.filter(pk=lane_pk, fence=fence).update(
        state=LaneState.HALTED, halt_reason=HANDOFF_HALT_REASON, fence=fence + 1)


def lanes_freeze_for_handoff(lane_pks: list[int]) -> int:
    """Freeze the predecessor lanes of a chunk, locked FOR UPDATE by the caller, in ONE UPDATE (`halted`,
    ORDERING_HANDOFF, fence + 1 each). Returns the rows updated; the caller refuses the chunk when short."""
    _in_transaction()
    return OrderingLane.objects.filter(pk__in=lane_pks).update(
        state=LaneState.HALTED, halt_reason=HANDOFF_HALT_REASON, fence=F("fence") + 1)


def successor_lane_create(*, epoch: ServingEpoch, lane: OrderingLane, route_version: int,
                          tie: bytes | None) -> OrderingLane:
    """Create the successor lane of the frozen `lane` under `epoch` (baseline = high-water = the frozen
    high-water, origin ORDERING_HANDOFF), in a savepoint: a duplicate raises IntegrityError and writes nothing."""
    _in_transaction()
    with transaction.atomic():
        return OrderingLane.objects.create(
            epoch=epoch, account_id=lane.account_id, route=lane.route, route_version=route_version,
            partition=lane.partition, contract=lane.contract, baseline=lane.high_water,
            baseline_origin=HANDOFF_BASELINE_ORIGIN, high_water=lane.high_water, high_water_tie=tie)


# The successor lanes of a chunk, one statement: the columns `OrderingLane.objects.create` writes (the model's
# defaults spelled out: no active execution, `open`, no halt reason, no gap, fence 1, changed_at now).
_STAGE_LANES_SQL = """
INSERT INTO connector_orderinglane (epoch_id, account_id, route, route_version, partition, contract, baseline,
                                    baseline_origin, high_water, high_water_tie, active_execution_id, state,
                                    halt_reason, gap_since, fence, changed_at)
SELECT %(epoch)s, v.account_id, v.route, v.route_version, v.partition, v.contract, v.high_water, %(origin)s,
       v.high_water, v.tie, NULL, %(state)s, '', NULL, 1, %(now)s::timestamptz
  FROM unnest(%(accounts)s::bigint[], %(routes)s::text[], %(versions)s::int[], %(partitions)s::text[],
              %(contracts)s::text[], %(high_waters)s::numeric[], %(ties)s::bytea[]) WITH ORDINALITY
       AS v(account_id, route, route_version, partition, contract, high_water, tie, ordinal)
 ORDER BY v.ordinal
RETURNING id, account_id, route, route_version, partition"""


def successor_lanes_insert(*, epoch_pk: int, lanes: list[OrderingLane], versions: dict[int, int],
                           ties: dict[int, bytes | None]) -> dict[tuple[int, str, int, str], int]:
    """Insert the successor lane of every frozen lane of a chunk in ONE statement, in a savepoint (baseline =
    high-water = the frozen high-water, origin ORDERING_HANDOFF, route version `versions[lane.pk]`); returns
    {(account id, route, route version, partition): successor lane pk}. A duplicate raises IntegrityError and
    writes nothing."""
    _in_transaction()
    assert OrderingLane._meta.db_table == "connector_orderinglane"
    with transaction.atomic(), transaction.get_connection().cursor() as cursor:
        cursor.execute(_STAGE_LANES_SQL, {
            "epoch": epoch_pk, "origin": HANDOFF_BASELINE_ORIGIN, "state": LaneState.OPEN, "now": timezone.now(),
            "accounts": [lane.account_id for lane in lanes], "routes": [lane.route for lane in lanes],
            "versions": [versions[lane.pk] for lane in lanes], "partitions": [lane.partition for lane in lanes],
            "contracts": [lane.contract for lane in lanes], "high_waters": [lane.high_water for lane in lanes],
            "ties": [ties[lane.pk] for lane in lanes]})
        return {tuple(rest): pk for pk, *rest in cursor.fetchall()}


@dataclass(frozen=True)
class SuccessorLane:
    """What `lane_create_from_baseline` returns: the lane and whether this call created it."""

    lane: OrderingLane
    created: bool


def lane_create_from_baseline(*, epoch: ServingEpoch, account_id: int, route: str, route_version: int,
                              partition: str, contract: str, baseline: Decimal, origin: str) -> SuccessorLane:
    """The candidate epoch's lane of (account, route, version, partition) starting at the certified V1 baseline
    (baseline = high-water, origin as certified): an existing lane is returned as it is (created False), for the
    caller to compare its baseline."""
    _in_transaction()
    key = dict(epoch=epoch, account_id=account_id, route=route, route_version=route_version, partition=partition)
    lane = OrderingLane.objects.filter(**key).first()
    if lane is not None:
        return SuccessorLane(lane, False)
    return SuccessorLane(OrderingLane.objects.create(**key, contract=contract, baseline=baseline, high_water=baseline,
                                                     baseline_origin=origin), True)
