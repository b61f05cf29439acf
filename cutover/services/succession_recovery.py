"""The V2 -> V2 successor coordinator run end to end, and its recovery by a new holder after a crash (CV2-11-049,
CV2-11-056; D-133).

`succession_run` is the coordinator: acquire, hold, drain, halt, handoffs, activate, release, each phase the same
resumable service `manage.py succession` and the cutover console call, every act naming its `holder`. A crash
between any two of them (the crash points `succession.after_*`, `succession.before_commit`, ...) leaves the set
open with its durable phase state; nothing expires it.

A new coordinator recovers it by ONE holder-fenced takeover of the SAME open set (`fencing.barrier_set_takeover`,
the one takeover of both kinds of set: the holder changes, the fence advances by one, the state, the handoffs, the
drain and the owner receipts stay; PostgreSQL allows no other change, migration 0020). From then on every act of
the earlier holder (acquire, hold, drain, halt, handoff, activation, release) is refused with FENCE_STALE.
`succession_resume` takes over and continues as the set's local state says:

- `acquiring`: hold (the owners reread under the barriers), then as `held`;
- `held` (the activation did not commit): drain, halt, the remaining handoffs, activate, read back, release;
- `activation_committed`: read back (successor `active`, predecessor `draining`, every gate `v2_serving` on the
  successor's exact ID and digest), then release.

Nothing here reads a clock: a set held for years is recovered the same way, and only an explicit fenced release
(or the activation's readback) reopens the owners' publications.
"""
from __future__ import annotations

from dataclasses import dataclass

from connector.actors import Actor
from connector.faults import fault_point
from cutover.choices import BARRIER_SET_OPEN, BarrierSetState
from cutover.errors import BarrierSetRefused
from cutover.models import ServingPublicationBarrierSet
from cutover.services import succession, succession_phases
from cutover.services.fencing import barrier_set_takeover

__all__ = ["Resumed", "succession_run", "succession_resume"]


@dataclass(frozen=True)
class Resumed:
    """Where a run or a resumption stopped: the set (same pk throughout), its holder, fence and state, and the phase
    that did not complete (None when the successor serves and the set is released) with what blocks it."""

    barrier_set_pk: int
    holder: str
    fence: int
    set_state: str
    stopped_at: str | None = None
    blocked_by: str = ""


def _open_set(predecessor_epoch_id: str) -> ServingPublicationBarrierSet:
    predecessor = succession.succession_epoch_get(predecessor_epoch_id)
    row = (ServingPublicationBarrierSet.objects.filter(predecessor_epoch=predecessor, state__in=BARRIER_SET_OPEN)
           .first())
    if row is None:
        raise BarrierSetRefused(f"no barrier set is open for predecessor {predecessor_epoch_id}; nothing to take over")
    return row


def _stopped(row: ServingPublicationBarrierSet, phase: str | None = None, blocked_by: str = "") -> Resumed:
    row = ServingPublicationBarrierSet.objects.get(pk=row.pk)
    return Resumed(row.pk, row.holder, row.fence, row.state, phase, blocked_by)


def _continue(row: ServingPublicationBarrierSet, *, holder: str, actor: Actor) -> Resumed:
    """Every phase after the hold, as `holder`, from wherever the durable state says (each phase is idempotent)."""
    if row.state == BarrierSetState.HELD:
        drain, inventory = succession_phases.drain_all(barrier_set=row, actor=actor, holder=holder)
        if drain.state != "drained":
            return _stopped(row, "drain", inventory.describe())
        fault_point("succession.after_drain")
        halted = succession_phases.halt_drained(barrier_set=row, actor=actor, holder=holder)
        if halted.refused:
            return _stopped(row, "halt", "; ".join(halted.refused))
        fault_point("succession.after_halt")
        handed = succession_phases.handoff_all(barrier_set=row, actor=actor, holder=holder)
        if handed.refused:
            return _stopped(row, "handoffs", "; ".join(handed.refused))
        row = ServingPublicationBarrierSet.objects.get(pk=row.pk)
        succession.successor_activate(barrier_set_pk=row.pk, expected_fence=row.fence, actor=actor, holder=holder)
        row = ServingPublicationBarrierSet.objects.get(pk=row.pk)
    if row.state == BarrierSetState.ACTIVATION_COMMITTED:
        # Read back, then release: barrier_set_release refuses unless the successor serves every gate exactly.
        succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence, holder=holder, actor=actor,
                                       reason=f"successor activation read back by {holder}")
    return _stopped(row)


def succession_run(*, predecessor_epoch_id: str, successor_epoch_id: str, holder: str, actor: Actor) -> Resumed:
    """The coordinator, every phase in order as `holder` (each resumable; a refusal stops it with its reason)."""
    row = succession.barrier_set_acquire(predecessor_epoch_id=predecessor_epoch_id,
                                         successor_epoch_id=successor_epoch_id, holder=holder, actor=actor)
    fault_point("succession.after_acquire")
    row = succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=actor, holder=holder)
    fault_point("succession.after_hold")
    return _continue(row, holder=holder, actor=actor)


def succession_resume(*, predecessor_epoch_id: str, holder: str, actor: Actor) -> Resumed:
    """Take the predecessor's open set over as `holder` and continue as its local state says (module docstring)."""
    row = barrier_set_takeover(barrier_set_pk=_open_set(predecessor_epoch_id).pk, holder=holder, actor=actor)
    if row.state == BarrierSetState.ACQUIRING:
        row = succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=actor,
                                          holder=holder)
    return _continue(row, holder=holder, actor=actor)
