"""A service still on V1: accounts, one configuration generation and a verified (never active) candidate epoch
built through the services, the gates in `v1_serving`, and the REAL V1 (`v1` app) running one process generation
against a loopback provider."""
from __future__ import annotations

from dataclasses import dataclass, field

from connector.actors import Actor
from connector.demo import build_owners
from connector.models import AccountServingGate, ConnectorAccount, ServingEpoch
from connector.services import serving
from v1 import runtime

ACTOR = Actor.system("cutover-test")
BUDGETS = {"barrier_closure": 60, "drain": 600, "baseline_capture": 60, "recovery_point_capture": 600,
           "restore_rehearsal": 900, "offline_validation": 600, "activation_readback": 60, "full_restore": 900}


@dataclass
class V1World:
    prefix: str
    accounts: list[ConnectorAccount] = field(default_factory=list)
    configuration: object = None
    epoch: ServingEpoch | None = None
    generation_id: str = ""

    @property
    def keys(self) -> list[str]:
        return [a.account_key for a in self.accounts]

    def modes(self) -> set[str]:
        return set(AccountServingGate.objects.filter(account__in=self.accounts).values_list("mode", flat=True))

    def accept(self, index: int, key: str, position: int, partition: str = "rec-1", source: str = "webhook",
               payload: bytes | None = None):
        return runtime.accept(account_key=self.accounts[index].account_key, source_key=source,
                              transport_key=key,
                              payload=payload or f'{{"id":"{key}","sequence":{position}}}'.encode(),
                              partition=partition, position=position)


def build_v1_world(prefix: str = "c-", **owners) -> V1World:
    """`owners`: build_owners' extra_routes / disabled_routes (more inbound routes of the candidate epoch)."""
    owners_world = build_owners(prefix, actor=ACTOR, **owners)
    world = V1World(prefix, accounts=owners_world.accounts, configuration=owners_world.configuration)
    epoch = serving.epoch_prepare_from_owners(epoch_id=f"{prefix}v2-epoch-1",
                                              configuration_generation_id=world.configuration.generation_id,
                                              actor=ACTOR)
    world.epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    world.generation_id = runtime.generation_start(started_by="test").generation_id
    return world


def approve_activation(epoch_id: str) -> None:
    """Two approvers other than the requester approve the activation decision's current digest."""
    from tests.cutover.approval_helpers import approve

    approve("activation_decision", epoch_id)


def to_validating(world: V1World, key: str = "att-1") -> None:
    """Every phase up to v2_validating through the services: certificate, barriers, drain, stop, export, shutdown
    certificate, restore point with its rehearsal, begin validation."""
    from cutover.services import v1_shutdown as sd
    from cutover.services.restore import cutover_begin_validation
    from cutover.services.restore_point import restore_point_capture, restore_point_rehearse
    from tests.cutover.approval_helpers import approve

    sd.cutover_open(attempt_key=key, configuration_generation_id=world.configuration.generation_id,
                    candidate_epoch_id=world.epoch.epoch_id, actor=ACTOR)
    sd.cutover_certify(attempt_key=key, budgets=BUDGETS, actor=ACTOR)
    approve("readiness_certificate", key)
    sd.maintenance_close(attempt_key=key, actor=ACTOR)
    runtime.drain(world.generation_id)
    sd.v1_stop(attempt_key=key, actor=ACTOR)
    sd.v1_export(attempt_key=key, actor=ACTOR)
    sd.v1_certify_drained(attempt_key=key, actor=ACTOR)
    restore_point_capture(attempt_key=key, actor="op")
    restore_point_rehearse(attempt_key=key, actor="op")
    approve("restore_point", key)
    cutover_begin_validation(attempt_key=key, actor=ACTOR)
