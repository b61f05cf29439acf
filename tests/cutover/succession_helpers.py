"""Builders for V2 -> V2 succession tests: an inbound world (pack A, two accounts) with an active predecessor
epoch and a verified successor prepared from the same configuration, and drivers for each phase."""
from __future__ import annotations

from connector.actors import Actor
from connector.choices import GateMode
from connector.models import AccountServingGate, OrderingLane, ServingEpoch
from connector.services import gates as gate_services
from connector.services import serving
from cutover.models import ServingPublicationBarrierSet
from cutover.services import succession
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import build_inbound_world, deliver, webhook_body, webhook_event

ACTOR = Actor.system("succession-test")
WEBHOOK = "records.webhook"


def build_succession_world(prefix: str):
    world = build_inbound_world(prefix, [PACK_A], account_keys=("acct-1", "acct-2"))
    successor = serving.epoch_prepare_from_owners(epoch_id=f"{prefix}epoch-2",
                                                  configuration_generation_id=world.configuration.generation_id,
                                                  actor=ACTOR)
    world.successor = serving.epoch_verify(epoch_pk=successor.pk, actor=ACTOR)
    assert world.successor.state == "verified"
    return world


def send(world, evt_id: str, position: int, record: str = "rec-1", account=None) -> None:
    deliver(world, WEBHOOK, webhook_body(webhook_event(evt_id, record, position)), account=account)


def halt_all(world) -> None:
    for account in world.accounts:
        gate_services.gate_transition(account_id=account.pk, action="halt_v2", expected_fence=None, actor=ACTOR)
        gate_services.gate_transition(account_id=account.pk, action="confirm_halted", expected_fence=None,
                                      actor=ACTOR)


def resume_all(world) -> None:
    for account in world.accounts:
        gate_services.gate_transition(account_id=account.pk, action="resume_predecessor", expected_fence=None,
                                      actor=ACTOR)


def held_barrier(world) -> ServingPublicationBarrierSet:
    row = succession.barrier_set_acquire(predecessor_epoch_id=world.epoch.epoch_id,
                                         successor_epoch_id=world.successor.epoch_id, holder="coord-1", actor=ACTOR)
    return succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=ACTOR)


def handoff_all(world, barrier: ServingPublicationBarrierSet) -> list:
    return [succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=pk, actor=ACTOR)
            for pk in OrderingLane.objects.filter(epoch=world.epoch).order_by("pk").values_list("pk", flat=True)]


def state_of(world) -> dict:
    """Everything the activation transaction may move, as stored."""
    return {
        "epochs": dict(ServingEpoch.objects.filter(pk__in=[world.epoch.pk, world.successor.pk])
                       .values_list("epoch_id", "state")),
        "gates": sorted(AccountServingGate.objects.filter(account__in=world.accounts)
                        .values_list("account_id", "mode", "fence", "epoch_id")),
        "barrier_sets": sorted(ServingPublicationBarrierSet.objects.values_list("pk", "state", "fence")),
    }


def gate_modes(world) -> set[str]:
    return set(AccountServingGate.objects.filter(account__in=world.accounts).values_list("mode", flat=True))


__all__ = ["ACTOR", "WEBHOOK", "GateMode", "build_succession_world", "send", "halt_all", "resume_all",
           "held_barrier", "handoff_all", "state_of", "gate_modes"]
