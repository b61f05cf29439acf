"""Read paths of V2 -> V2 succession: the resume blocker the app registers, and the coordinator's status view."""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Q

from connector.selectors.rows import AccountServingGate, OrderingLane, ServingEpoch
from cutover.choices import BARRIER_SET_OPEN
from cutover.models import (
    CutoverDecision,
    OrderingHandoff,
    ServiceCutoverAttempt,
    ServingPublicationBarrierSet,
    SuccessionDrain,
    V1GenerationReceipt,
)

# The cutover model classes other apps may name, as types and as the subject of their own read queries (D-259).
# `cutover.models` is private to this app (an import-linter contract holds it); every write is a cutover service.
__all__ = ["CutoverDecision", "OrderingHandoff", "ServiceCutoverAttempt", "ServingPublicationBarrierSet",
           "SuccessionDrain", "SuccessionStatus", "V1GenerationReceipt", "barrier_set_open_for", "barrier_set_retention_blockers",
           "predecessor_resume_blockers",
           "succession_status"]


def predecessor_resume_blockers(gate) -> list[str]:
    """`v2_halted -> v2_serving` on the predecessor is refused once any OrderingHandoff froze one of its lanes:
    the first committed handoff is the forward-only cutoff (CV2-03-011, CV2-11-019/020/051). Registered as a
    connector resume blocker; runs under the gate's FOR UPDATE lock, so a handoff holding the gate FOR SHARE
    either committed before (and is seen) or starts after and finds the gate serving."""
    if gate.epoch_id is None:
        return []
    handoff = (OrderingHandoff.objects.filter(predecessor_epoch_id=gate.epoch_id)
               .select_related("successor_epoch").order_by("pk").first())
    if handoff is None:
        return []
    return [f"OrderingHandoff #{handoff.pk} to successor {handoff.successor_epoch.epoch_id} is committed: the "
            "predecessor is frozen and only the successor activation may resume this gate"]


def barrier_set_retention_blockers(epoch) -> list[tuple[str, str]]:
    """A draining epoch retires only once no publication barrier set naming it (as predecessor or successor) is
    still open (D-267): the coordinator must release it after readback first. Registered as a connector retention
    blocker; code BARRIER_SET_OPEN."""
    rows = list(ServingPublicationBarrierSet.objects.filter(
        Q(predecessor_epoch_id=epoch.pk) | Q(successor_epoch_id=epoch.pk), state__in=BARRIER_SET_OPEN)
        .order_by("pk").values_list("pk", "state")[:10])
    return [("BARRIER_SET_OPEN", ", ".join(f"barrier set #{pk} is {state}" for pk, state in rows))] if rows else []


def barrier_set_open_for(*, predecessor_epoch_pk: int) -> ServingPublicationBarrierSet | None:
    return (ServingPublicationBarrierSet.objects.filter(predecessor_epoch_id=predecessor_epoch_pk,
                                                        state__in=BARRIER_SET_OPEN)
            .select_related("successor_epoch", "predecessor_epoch").first())


@dataclass
class SuccessionStatus:
    predecessor: ServingEpoch
    successor: ServingEpoch | None
    barrier_set: ServingPublicationBarrierSet | None
    gate_modes: dict[str, int] = field(default_factory=dict)
    lanes: int = 0
    handoffs: int = 0
    next_phase: str = ""
    drain: str = ""


def succession_status(*, predecessor_epoch_id: str, successor_epoch_id: str | None = None) -> SuccessionStatus:
    predecessor = ServingEpoch.objects.get(epoch_id=predecessor_epoch_id)
    barrier_set = barrier_set_open_for(predecessor_epoch_pk=predecessor.pk)
    successor = (ServingEpoch.objects.filter(epoch_id=successor_epoch_id).first() if successor_epoch_id
                 else barrier_set.successor_epoch if barrier_set else None)
    accounts = list(predecessor.configuration.accounts.values_list("account_id", flat=True))
    modes: dict[str, int] = {}
    for mode in AccountServingGate.objects.filter(account_id__in=accounts).values_list("mode", flat=True):
        modes[mode] = modes.get(mode, 0) + 1
    lanes = OrderingLane.objects.filter(epoch=predecessor).count()
    handoffs = OrderingHandoff.objects.filter(successor_epoch=successor).count() if successor else 0
    status = SuccessionStatus(predecessor, successor, barrier_set, modes, lanes, handoffs)
    if predecessor.state == "retired":
        status.next_phase = "done"
    elif successor is not None and successor.state == "active":
        status.next_phase = "release" if barrier_set is not None else "retire"
    elif barrier_set is None:
        status.next_phase = "barriers"
    elif barrier_set.state == "acquiring":
        status.next_phase = "barriers"
    elif set(modes) != {"v2_halted"}:
        drain = SuccessionDrain.objects.filter(barrier_set=barrier_set).values_list("state", flat=True).first()
        status.drain = drain or ""
        status.next_phase = "halt" if drain == "drained" else "drain"
    elif handoffs < lanes:
        status.next_phase = "handoffs"
    else:
        status.next_phase = "activate"
    return status
