"""The drain phase of a V2 -> V2 successor activation (CV2-11-005, D-315/D-316): before any gate enters
`halting_v2`, continuation work of the predecessor drains under the still-active predecessor and `v2_serving`
gates while the predecessor's new roots are refused.

- `succession_drain_open` (under the attempt's `held` barrier set, every gate `v2_serving` on the active
  predecessor): closes the predecessor's roots barrier (its advisory lock exclusive, so every root writer that
  already passed the barrier commits first and joins the inventory) and writes the `draining` SuccessionDrain. From
  its commit, a trigger (migration 0014) refuses every new Receipt and every OutboundCommand no Execution authored
  that would bind the predecessor: SUCCESSION_ROOTS_CLOSED, nothing written. Materialization, lane advance,
  claims, executions, outbound authoring by executions, permits, dispatch and settlement continue as before.
- `succession_drain_inventory`: the predecessor's continuation work still open, counted in ONE statement (one
  snapshot: a transaction that completes an execution and authors its effect is seen before or after, never half).
- `succession_drain_complete`: `draining -> drained` only when that inventory is empty; otherwise
  SUCCESSION_DRAIN_REFUSED lists it and nothing moves. No timeout completes or abandons a drain: it waits for the
  work, or the operator releases the barrier set (which releases the drain and reopens the roots).

The coordinator's halt (`succession_phases.halt_drained`) requires the drain `drained` (SUCCESSION_NOT_DRAINED).
Lock order: roots barrier (order 0, with the owner barriers), barrier set, drain row.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import IntegrityError, transaction

from connector.actors import Actor
from connector.choices import EXECUTION_ACTIVE, EpochState, GateMode
from connector.errors import FenceStale, PermissionRefused
from connector.faults import fault_point
from connector.selectors.rows import (AccountServingGate, Execution, MaterializationDue, Projection,
                                     ProjectionWindow, ServiceConfigurationGeneration, ServingEpoch)
from connector.services.audit import audit_record
from cutover import locks
from cutover.choices import BarrierSetState, SuccessionDrainState
from cutover.errors import SuccessionDrainRefused
from cutover.models import ServingPublicationBarrierSet, SuccessionDrain
from cutover.services.fencing import SUCCESSION_PERMISSION, check_holder
from effects.selectors import open_effects_of_epoch

__all__ = ["DrainInventory", "succession_drain_open", "succession_drain_inventory", "succession_drain_complete",
           "release_drain_of"]

SHOWN = 10
PERMISSION = SUCCESSION_PERMISSION


def _require_perm(actor: Actor) -> None:
    if actor.user is not None and not actor.user.has_perm(PERMISSION):
        raise PermissionRefused(f"{actor} lacks {PERMISSION}")


@dataclass(frozen=True)
class DrainInventory:
    """The predecessor's open continuation work, per kind: (count, the first SHOWN pks)."""

    kinds: dict[str, tuple[int, list[int]]]

    @property
    def empty(self) -> bool:
        return all(count == 0 for count, _ in self.kinds.values())

    def describe(self) -> str:
        return "; ".join(f"{count} {kind} ({', '.join(f'#{pk}' for pk in pks)}{', …' if count > len(pks) else ''})"
                         for kind, (count, pks) in self.kinds.items() if count)

    def as_evidence(self) -> dict:
        return {kind: count for kind, (count, _) in self.kinds.items()}


def _inventory_parts(epoch_pk: int) -> dict[str, object]:
    """Each kind of continuation work of the epoch, as a queryset of pks (ascending)."""
    return {
        "receipts awaiting materialization": MaterializationDue.objects.filter(receipt__epoch_id=epoch_pk)
        .order_by("receipt_id").values_list("receipt_id", flat=True),
        "pending lane positions": Projection.objects.filter(lane__epoch_id=epoch_pk, lane_status="pending")
        .order_by("pk").values_list("pk", flat=True),
        "nonterminal executions": Execution.objects.filter(epoch_id=epoch_pk, state__in=EXECUTION_ACTIVE)
        .order_by("pk").values_list("pk", flat=True),
        "open windows": ProjectionWindow.objects.filter(epoch_id=epoch_pk, state="open")
        .order_by("pk").values_list("pk", flat=True),
        "nonterminal remote effects": open_effects_of_epoch(epoch_pk=epoch_pk).order_by("pk"),
    }


def succession_drain_inventory(*, epoch_pk: int) -> DrainInventory:
    """The epoch's open continuation work, measured in one statement (one snapshot) from the database: receipts
    awaiting materialization, pending lane positions, nonterminal executions (ready or waiting on a dependency),
    open windows, and RemoteEffects not terminal (an open DispatchPermit's effect is `dispatching`; an `uncertain`
    effect counts until reconciled)."""
    selects, params = [], []
    for i, queryset in enumerate(_inventory_parts(epoch_pk).values()):
        sql, sub = queryset.query.sql_with_params()
        selects.append(f"(SELECT count(*) FROM ({sql}) AS c{i}), "
                       f"(SELECT array(SELECT * FROM ({sql}) AS s{i} LIMIT {SHOWN}))")
        params += [*sub, *sub]
    with transaction.get_connection().cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(selects), params)
        row = cursor.fetchone()
    kinds = list(_inventory_parts(epoch_pk))
    return DrainInventory({kind: (row[2 * i], list(row[2 * i + 1] or [])) for i, kind in enumerate(kinds)})


def _accounts(epoch: ServingEpoch) -> list[int]:
    configuration = ServiceConfigurationGeneration(pk=epoch.configuration_id)
    return sorted(configuration.accounts.values_list("account_id", flat=True))


def succession_drain_open(*, barrier_set_pk: int, actor: Actor, holder: str | None = None) -> SuccessionDrain:
    """Open the drain of the attempt's barrier set: require the set `held`, its predecessor `active` with the
    bound digest and every gate of the predecessor's account set `v2_serving` on it; close the predecessor's roots
    barrier (exclusive: waits for every root writer already past it) and write the `draining` row, with its audit
    row. Idempotent: an existing drain of the set is returned (whatever its state). Refusals write nothing."""
    _require_perm(actor)
    if holder is not None:  # a taken-over coordinator is refused even where the answer would be a read (D-133)
        check_holder(ServingPublicationBarrierSet.objects.get(pk=barrier_set_pk), holder, None)
    existing = SuccessionDrain.objects.filter(barrier_set_id=barrier_set_pk).first()
    if existing is not None:
        return existing
    current = ServingPublicationBarrierSet.objects.get(pk=barrier_set_pk)
    if current.predecessor_epoch_id is None:
        raise SuccessionDrainRefused(f"{current} is a first activation; only a succession drains a predecessor")
    with transaction.atomic():
        locks.succession_roots_lock(current.predecessor_epoch_id)  # order 0: every root already past it committed
        row = ServingPublicationBarrierSet.objects.select_for_update().get(pk=barrier_set_pk)
        check_holder(row, holder, None)
        existing = SuccessionDrain.objects.filter(barrier_set=row).first()
        if existing is not None:
            return existing
        if row.state != BarrierSetState.HELD:
            raise SuccessionDrainRefused(f"{row} is {row.state}; the drain opens under a held barrier set")
        predecessor = ServingEpoch.objects.defer("preimage").get(pk=row.predecessor_epoch_id)
        if predecessor.state != EpochState.ACTIVE or bytes(predecessor.digest) != bytes(row.predecessor_digest):
            raise SuccessionDrainRefused(f"predecessor {predecessor.epoch_id} is {predecessor.state} or not the "
                                         "bound bytes; the drain runs under the still-active predecessor")
        accounts = _accounts(predecessor)
        gates = list(AccountServingGate.objects.filter(account_id__in=accounts).order_by("account_id")
                     .values_list("account_id", "mode", "epoch_id"))
        bad = [(a, mode) for a, mode, epoch in gates if mode != GateMode.V2_SERVING or epoch != predecessor.pk]
        if bad or len(gates) != len(accounts):
            raise SuccessionDrainRefused("the drain runs with every gate v2_serving on the predecessor; not serving: "
                                         + ", ".join(f"{a}={mode}" for a, mode in bad[:10]))
        try:
            with transaction.atomic():
                drain = SuccessionDrain.objects.create(barrier_set=row, predecessor_epoch=predecessor)
        except IntegrityError as exc:
            raise SuccessionDrainRefused(f"another drain closes the roots of {predecessor.epoch_id}") from exc
        audit_record(actor=actor, entity=drain, action="succession_drain_open", to_state=drain.state,
                     fence=drain.fence, evidence_digest=bytes(row.successor_digest),
                     reason=f"roots of {predecessor.epoch_id} closed for successor {row.successor_key}")
        fault_point("succession.drain_open_before_commit")
    return drain


def succession_drain_complete(*, barrier_set_pk: int, expected_fence: int | None, actor: Actor,
                              holder: str | None = None) -> SuccessionDrain:
    """`draining -> drained` once the predecessor's continuation inventory is empty (measured after the roots
    closed, so nothing can add to it: new roots are refused and continuation only follows open work). Locks the
    drain row FOR UPDATE (after the barrier set FOR SHARE, which must still be `held`), measures, and records the
    (empty) inventory as evidence. Not empty: SUCCESSION_DRAIN_REFUSED naming the work; nothing moves; rerun
    later (no timeout decides). Idempotent on a drained drain."""
    _require_perm(actor)
    if holder is not None:
        check_holder(ServingPublicationBarrierSet.objects.get(pk=barrier_set_pk), holder, None)
    current = SuccessionDrain.objects.filter(barrier_set_id=barrier_set_pk).first()
    if current is None:
        raise SuccessionDrainRefused("no drain is open for this barrier set; open it first")
    if current.state == SuccessionDrainState.DRAINED:
        return current
    with transaction.atomic():
        row = locks.barrier_set_for_share(barrier_set_pk)
        check_holder(row, holder, None)
        drain = SuccessionDrain.objects.select_for_update().get(pk=current.pk)
        if expected_fence is not None and drain.fence != expected_fence:
            raise FenceStale(f"{drain}: acted on with fence {expected_fence}; it holds fence {drain.fence}")
        if drain.state == SuccessionDrainState.DRAINED:
            return drain
        if drain.state != SuccessionDrainState.DRAINING or row.state != BarrierSetState.HELD:
            raise SuccessionDrainRefused(f"{drain} is {drain.state} and {row} is {row.state}; nothing to complete")
        inventory = succession_drain_inventory(epoch_pk=drain.predecessor_epoch_id)
        if not inventory.empty:
            raise SuccessionDrainRefused("predecessor continuation work is not terminal yet: "
                                         + inventory.describe(), inventory=inventory.as_evidence())
        drain.complete(inventory=inventory.as_evidence())
        drain.save()
        audit_record(actor=actor, entity=drain, action="succession_drain_complete",
                     from_state=SuccessionDrainState.DRAINING, to_state=drain.state, fence=drain.fence,
                     reason="continuation inventory empty under v2_serving gates")
        fault_point("succession.drain_complete_before_commit")
    return drain


def release_drain_of(barrier_set: ServingPublicationBarrierSet, *, actor: Actor) -> None:
    """Inside a barrier set's release (the caller holds it FOR UPDATE): its drain, if open, -> `released`, which
    reopens the predecessor's roots (an abort resumes the predecessor; after an activation the roots bind the
    successor anyway)."""
    drain = SuccessionDrain.objects.select_for_update().filter(barrier_set=barrier_set).first()
    if drain is None or drain.state == SuccessionDrainState.RELEASED:
        return
    from_state = drain.state
    drain.release()
    drain.save()
    audit_record(actor=actor, entity=drain, action="succession_drain_release", from_state=from_state,
                 to_state=drain.state, fence=drain.fence, reason="barrier set released")
