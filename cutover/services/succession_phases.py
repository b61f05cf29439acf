"""The multi-row phases of a successor activation, shared by `manage.py succession` and the cutover console.

Each phase is a loop of set-based chunk transactions (`gate_sets.halt_chunk`,
`succession_handoffs.handoff_chunk`; issue 19, D-281/D-282), each its own fenced transaction over the gates or
lanes of at most CONNECTOR["HALT_CHUNK_ACCOUNTS"] accounts, so a phase is idempotent and resumable: rerunning it
skips what is done and retries what was refused. `on_step(i, n, text)` reports progress once per chunk (a
progress bar in the command, nothing on the console).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import transaction

from connector.actors import Actor
from connector.choices import GateMode
from connector.errors import ConnectorError, FenceStale
from connector.faults import fault_point
from connector.selectors.rows import OrderingLane, ServingEpoch
from connector.services import gate_sets
from cutover import locks
from cutover.choices import SuccessionDrainState
from cutover.errors import SuccessionNotDrained
from cutover.models import OrderingHandoff, ServingPublicationBarrierSet, SuccessionDrain
from cutover.services import succession, succession_drain, succession_handoffs
from cutover.services.fencing import check_holder
from cutover.services.succession_drain import DrainInventory

Step = Callable[[int, int, str], None]
REASON = "successor activation (requires_drain)"


def _quiet(i: int, n: int, text: str) -> None:
    return None


@dataclass
class PhaseOutcome:
    total: int = 0
    done: int = 0
    refused: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.refused and self.done == self.total


def halt_all(*, predecessor: ServingEpoch, actor: Actor, on_step: Step = _quiet,
             barrier_set: ServingPublicationBarrierSet | None = None, holder: str | None = None) -> PhaseOutcome:
    """Move every gate of the predecessor's account set v2_serving -> halting_v2 -> v2_halted, set-based: one
    transaction per chunk of at most CONNECTOR["HALT_CHUNK_ACCOUNTS"] accounts (`gate_sets.halt_chunk`, D-281),
    on_step once per chunk. An open permit keeps a gate `halting_v2` (the halt blocker); that account is listed as
    refused and the phase can be rerun. The succession coordinator calls it through `halt_drained` (after the drain
    phase, CV2-11-005) naming its `holder`: each chunk then first locks the barrier set FOR SHARE and checks that
    holder (FENCE_STALE once another coordinator took the set over, D-133); called directly it is the set-based halt
    mechanism only."""
    accounts = sorted(predecessor.configuration.accounts.values_list("account_id", flat=True))
    outcome = PhaseOutcome(total=len(accounts))
    size = gate_sets.halt_chunk_accounts()
    for start in range(0, len(accounts), size):
        chunk = accounts[start:start + size]
        try:
            with transaction.atomic():
                if holder is not None:
                    check_holder(locks.barrier_set_for_share(barrier_set.pk), holder, None)
                result = gate_sets.halt_chunk(account_ids=chunk, actor=actor, reason=REASON)
        except FenceStale:
            raise
        except ConnectorError as exc:
            outcome.refused += [f"account {account_id}: {exc.detail}" for account_id in chunk]
            on_step(start + len(chunk), len(accounts), f"accounts {chunk[0]}..{chunk[-1]}: REFUSED")
            continue
        outcome.refused += [f"account {a}: {detail}" for a, detail in sorted(result.refused.items())]
        outcome.done += sum(1 for mode in result.modes.values() if mode == GateMode.V2_HALTED)
        on_step(start + len(chunk), len(accounts),
                f"accounts {chunk[0]}..{chunk[-1]}: {result.halted} halted, {result.confirmed} confirmed, "
                f"{len(result.refused)} refused")
    return outcome


def drain_all(*, barrier_set: ServingPublicationBarrierSet, actor: Actor,
              holder: str | None = None) -> tuple[SuccessionDrain, DrainInventory]:
    """The drain phase (CV2-11-005, D-315/D-316), before any gate halts: open the attempt's drain (idempotent;
    the predecessor's new roots are refused from its commit) with every gate still `v2_serving`, measure the
    predecessor's continuation inventory, and complete the drain if it is empty. Returns the drain and the
    inventory; a nonempty inventory leaves the drain `draining` (rerun when the work finished; no timeout)."""
    drain = succession_drain.succession_drain_open(barrier_set_pk=barrier_set.pk, actor=actor, holder=holder)
    if drain.state != SuccessionDrainState.DRAINING:
        return drain, succession_drain.succession_drain_inventory(epoch_pk=drain.predecessor_epoch_id)
    inventory = succession_drain.succession_drain_inventory(epoch_pk=drain.predecessor_epoch_id)
    if inventory.empty:
        drain = succession_drain.succession_drain_complete(barrier_set_pk=barrier_set.pk, expected_fence=drain.fence,
                                                           actor=actor, holder=holder)
    return drain, inventory


def halt_drained(*, barrier_set: ServingPublicationBarrierSet, actor: Actor, on_step: Step = _quiet,
                 holder: str | None = None) -> PhaseOutcome:
    """The succession coordinator's halt: only after the attempt's drain is `drained` (SUCCESSION_NOT_DRAINED
    otherwise, nothing moved), every gate v2_serving -> halting_v2 -> v2_halted (`halt_all`)."""
    if holder is not None:  # checked again under the set's lock with each chunk
        check_holder(ServingPublicationBarrierSet.objects.get(pk=barrier_set.pk), holder, None)
    drain = SuccessionDrain.objects.filter(barrier_set_id=barrier_set.pk).first()
    if drain is None or drain.state != SuccessionDrainState.DRAINED:
        raise SuccessionNotDrained(f"{barrier_set}: the drain is {drain.state if drain else 'not open'}; gates "
                                   "enter halting_v2 only after continuation work drained under v2_serving")
    return halt_all(predecessor=ServingEpoch.objects.get(pk=barrier_set.predecessor_epoch_id), actor=actor,
                    on_step=on_step, barrier_set=barrier_set, holder=holder)


def handoff_all(*, barrier_set: ServingPublicationBarrierSet, actor: Actor, on_step: Step = _quiet,
                holder: str | None = None) -> PhaseOutcome:
    """One OrderingHandoff per predecessor lane not yet handed off, set-based: one transaction per chunk of the
    lanes of at most CONNECTOR["HALT_CHUNK_ACCOUNTS"] accounts (`succession_handoffs.handoff_chunk`, D-282),
    on_step once per chunk. A lane with nonterminal work is refused and listed; rerun after it drained."""
    lanes = list(OrderingLane.objects.filter(epoch_id=barrier_set.predecessor_epoch_id).order_by("account_id", "pk")
                 .values_list("account_id", "pk"))
    done = set(OrderingHandoff.objects.filter(successor_epoch_id=barrier_set.successor_epoch_id)
               .values_list("predecessor_lane_id", flat=True))
    outcome = PhaseOutcome(total=len(lanes))
    outcome.done = sum(1 for _account, pk in lanes if pk in done)
    todo: dict[int, list[int]] = {}
    for account_id, pk in lanes:
        if pk not in done:
            todo.setdefault(account_id, []).append(pk)
    accounts = sorted(todo)
    size = gate_sets.halt_chunk_accounts()
    seen = outcome.done
    if seen:
        on_step(seen, len(lanes), f"{seen} lane(s) already handed off")
    for start in range(0, len(accounts), size):
        chunk = accounts[start:start + size]
        lane_pks = [pk for account_id in chunk for pk in todo[account_id]]
        try:
            result = succession_handoffs.handoff_chunk(barrier_set_pk=barrier_set.pk, lane_pks=lane_pks, actor=actor,
                                                       holder=holder)
        except FenceStale:
            raise
        except ConnectorError as exc:
            result = succession_handoffs.HandoffChunk()
            outcome.refused += [f"lane {pk}: {exc.detail}" for pk in lane_pks]
        else:
            outcome.done += len(result.done)
            outcome.refused += [f"lane {pk}: {detail}" for pk, detail in sorted(result.refused.items())]
            fault_point("succession.after_handoff_chunk")
        seen += len(lane_pks)
        on_step(seen, len(lanes), f"accounts {chunk[0]}..{chunk[-1]}: {len(lane_pks)} lanes" + "".join(
            f"; lane {pk} frozen at high-water {h.high_water}" for pk, h in sorted(result.done.items())[:3]))
    return outcome


def activate_and_release(*, barrier_set: ServingPublicationBarrierSet, expected_fence: int | None,
                         actor: Actor, holder: str | None = None) -> tuple[ServingEpoch, ServingPublicationBarrierSet]:
    """The successor activation transaction, then (after it read back) the fenced barrier release."""
    successor = succession.successor_activate(barrier_set_pk=barrier_set.pk, expected_fence=expected_fence,
                                              actor=actor, holder=holder)
    row = ServingPublicationBarrierSet.objects.get(pk=barrier_set.pk)
    row = succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence,
                                         reason="successor activation read back", actor=actor, holder=holder)
    return successor, row
