"""Several lanes of one account advanced in one transaction (issue 18 goal 5, D-295).

`lane_advance` is the one semantics: one guarded transaction per lane, 8 statements. After a burst materialized
together (D-294) each new lane still paid its own advance. This module advances the open lanes of one account
on the guarded epoch together: the guard once, the lanes `FOR UPDATE` in ascending pk, their pending Projections
in one read, the ordering contract applied per lane by the same function (`advance.apply_contract`), and the
chosen Projections minted with one statement each for the generation compare-and-set, the Executions and the
lanes' active Execution and fence. A halted lane (replay resumption), a lane of another epoch, and everything
while tracing is on stay for `lane_advance`; any failure rolls the whole transaction back and every lane takes
that path."""
from __future__ import annotations

import hashlib

from django.db import transaction

from connector import tracing
from connector.choices import LaneState
from connector.faults import fault_point
from connector.models import Execution, OrderingLane, Projection
from connector.selectors.routes import route_for
from connector.services.advance import apply_contract
from connector.services.guard import lock_serving
from connector.services.materialize import _insert_rows, command_id_for, execution_ref

# The chosen Projections' next generation, compare-and-set on the generation each was read at (as
# `mint_execution`'s UPDATE): a row another writer moved is not updated, and the count check rolls back.
_GENERATIONS_SQL = """
UPDATE connector_projection p
   SET execution_generation = u.generation, lane_status = 'minted'
  FROM unnest(%(ids)s::bigint[], %(generations)s::integer[]) AS u(id, generation)
 WHERE p.id = u.id AND p.account_id = %(account)s AND p.execution_generation = u.generation - 1"""

# The lanes' active Execution and fence (the row trigger requires the fence to advance by one).
_LANES_SQL = """
UPDATE connector_orderinglane l
   SET active_execution_id = u.execution_id, gap_since = NULL, fence = u.fence
  FROM unnest(%(ids)s::bigint[], %(executions)s::bigint[], %(fences)s::bigint[]) AS u(id, execution_id, fence)
 WHERE l.id = u.id AND l.account_id = %(account)s"""


def lanes_advance(*, lane_pks, account_id: int) -> tuple[set[int], list[int]]:
    """Advance the lanes of `lane_pks` (all of account `account_id`) that this path takes, in one guarded
    transaction. Returns (the lanes it took: each advanced exactly as `lane_advance` would, or found with
    nothing to do; the Executions it minted). The others are for `lane_advance`. Raises whatever the guard or a
    statement raises; the transaction then rolled back.

    Statements for any number of lanes, when each mints: BEGIN, the guard, the lanes `FOR UPDATE`, their pending
    Projections, the generations, the Executions, the lanes, COMMIT (a superseded Projection or a gap marker adds
    the contract's own statements for that lane). Fault point `advance.together_before_commit` fires before the
    COMMIT."""
    if not lane_pks or tracing.enabled():
        return set(), []
    with transaction.atomic():
        ctx = lock_serving(account_id=account_id)
        lanes = [lane for lane in OrderingLane.objects.select_for_update(of=("self",)).select_related("epoch")
                 .defer("epoch__preimage", "epoch__configuration_receipt")
                 .filter(account_id=account_id, pk__in=sorted(set(lane_pks))).order_by("pk")
                 if lane.epoch_id == ctx.epoch_pk and (lane.active_execution_id is not None
                                                        or lane.state == LaneState.OPEN)]
        if not lanes:
            return set(), []
        idle = {lane.pk: lane for lane in lanes if lane.active_execution_id is None}
        pending: dict[int, list[Projection]] = {}
        for p in (Projection.objects.filter(lane_id__in=sorted(idle), account_id=account_id, lane_status="pending")
                  .order_by("lane_id", "position", "tie_breaker", "pk")) if idle else ():
            pending.setdefault(p.lane_id, []).append(p)
        profile_id = lanes[0].epoch.profile_id  # every taken lane is on the guarded epoch
        mint = []
        for lane_pk, projections in sorted(pending.items()):
            lane = idle[lane_pk]
            route = route_for(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, account_id=account_id,
                              channel=lane.route)
            chosen = apply_contract(lane, projections, route)
            if chosen is not None:
                mint.append((lane, chosen, route))
        minted = _mint(mint, ctx, profile_id, account_id) if mint else []
        fault_point("advance.together_before_commit")
    return {lane.pk for lane in lanes}, minted


def _mint(mint: list, ctx, profile_id: str, account_id: int) -> list[int]:
    """`mint_execution` for each (lane, chosen Projection, route), set-based, lanes in ascending pk."""
    rows, ids, generations = [], [], []
    for lane, projection, route in mint:
        generation = projection.execution_generation + 1
        command_id = command_id_for(projection.identity_digest, generation)
        ref = execution_ref(command_id=command_id, projection=projection, generation=generation, route=route,
                            epoch_digest=ctx.epoch_digest, profile_id=profile_id)
        rows.append(dict(projection_id=projection.pk, generation=generation, account_id=account_id,
                         epoch_id=projection.epoch_id, lane_id=lane.pk, command_id=command_id, execution_ref=ref,
                         execution_ref_digest=hashlib.sha256(ref).digest()))
        ids.append(projection.pk)
        generations.append(generation)
    connection = transaction.get_connection()
    with connection.cursor() as cursor:
        cursor.execute(_GENERATIONS_SQL, {"ids": ids, "generations": generations, "account": account_id})
        if cursor.rowcount != len(ids):
            raise AssertionError(f"lanes_advance: {cursor.rowcount} of {len(ids)} generations moved")
    executions = [pk for (pk,) in _insert_rows(Execution, rows)]
    with connection.cursor() as cursor:
        cursor.execute(_LANES_SQL, {"ids": [lane.pk for lane, _, _ in mint], "executions": executions,
                                    "fences": [lane.fence + 1 for lane, _, _ in mint], "account": account_id})
        if cursor.rowcount != len(mint):
            raise AssertionError(f"lanes_advance: {cursor.rowcount} of {len(mint)} lanes moved")
    return executions
