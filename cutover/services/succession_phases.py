"""The multi-row phases of a successor activation, shared by `manage.py succession` and the cutover console.

Each phase is a loop of single-row service calls (`gate_transition`, `ordering_handoff`), each its own fenced
transaction, so a phase is idempotent and resumable: rerunning it skips what is done and retries what was
refused. `on_step(i, n, text)` reports progress (a progress bar in the command, nothing on the console).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from connector.actors import Actor
from connector.choices import GateMode
from connector.errors import ConnectorError
from connector.selectors.rows import AccountServingGate, OrderingLane, ServingEpoch
from connector.services import gates as gate_services
from cutover.models import OrderingHandoff, ServingPublicationBarrierSet
from cutover.services import succession

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


def halt_all(*, predecessor: ServingEpoch, actor: Actor, on_step: Step = _quiet) -> PhaseOutcome:
    """Move every gate of the predecessor's account set v2_serving -> halting_v2 -> v2_halted. An open permit keeps
    a gate `halting_v2` (the halt blocker); that account is listed as refused and the phase can be rerun."""
    accounts = sorted(predecessor.configuration.accounts.values_list("account_id", flat=True))
    outcome = PhaseOutcome(total=len(accounts))
    for i, account_id in enumerate(accounts, 1):
        gate = AccountServingGate.objects.get(account_id=account_id)
        try:
            if gate.mode == GateMode.V2_SERVING:
                gate = gate_services.gate_transition(account_id=account_id, action="halt_v2",
                                                     expected_fence=gate.fence, actor=actor, reason=REASON)
            if gate.mode == GateMode.HALTING_V2:
                gate = gate_services.gate_transition(account_id=account_id, action="confirm_halted",
                                                     expected_fence=gate.fence, actor=actor, reason=REASON)
        except ConnectorError as exc:
            outcome.refused.append(f"account {account_id}: {exc.detail}")
        if gate.mode == GateMode.V2_HALTED:
            outcome.done += 1
        on_step(i, len(accounts), f"account {account_id}: {gate.mode}")
    return outcome


def handoff_all(*, barrier_set: ServingPublicationBarrierSet, actor: Actor, on_step: Step = _quiet) -> PhaseOutcome:
    """One OrderingHandoff per predecessor lane not yet handed off. A lane with nonterminal work is refused and
    listed; rerun after it drained."""
    lanes = list(OrderingLane.objects.filter(epoch_id=barrier_set.predecessor_epoch_id).order_by("pk")
                 .values_list("pk", flat=True))
    done = set(OrderingHandoff.objects.filter(successor_epoch_id=barrier_set.successor_epoch_id)
               .values_list("predecessor_lane_id", flat=True))
    outcome = PhaseOutcome(total=len(lanes))
    for i, lane_pk in enumerate(lanes, 1):
        if lane_pk in done:
            outcome.done += 1
            on_step(i, len(lanes), f"lane {lane_pk}: already handed off")
            continue
        try:
            handoff = succession.ordering_handoff(barrier_set_pk=barrier_set.pk, lane_pk=lane_pk, actor=actor)
        except ConnectorError as exc:
            outcome.refused.append(f"lane {lane_pk}: {exc.detail}")
            on_step(i, len(lanes), f"lane {lane_pk}: REFUSED")
            continue
        outcome.done += 1
        on_step(i, len(lanes), f"lane {lane_pk}: frozen at high-water {handoff.high_water}")
    return outcome


def activate_and_release(*, barrier_set: ServingPublicationBarrierSet, expected_fence: int | None,
                         actor: Actor) -> tuple[ServingEpoch, ServingPublicationBarrierSet]:
    """The successor activation transaction, then (after it read back) the fenced barrier release."""
    successor = succession.successor_activate(barrier_set_pk=barrier_set.pk, expected_fence=expected_fence,
                                              actor=actor)
    row = ServingPublicationBarrierSet.objects.get(pk=barrier_set.pk)
    row = succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence,
                                         reason="successor activation read back", actor=actor)
    return successor, row
