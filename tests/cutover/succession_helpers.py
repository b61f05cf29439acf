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
from tests.connector.inbound_helpers import build_inbound_world, deliver, drain, webhook_body, webhook_event

ACTOR = Actor.system("succession-test")
WEBHOOK = "records.webhook"


def build_succession_world(prefix: str, packs: list | None = None):
    world = build_inbound_world(prefix, packs or [PACK_A], account_keys=("acct-1", "acct-2"))
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


__all__ = ["ACTOR", "WEBHOOK", "GateMode", "drain", "build_succession_world", "send", "halt_all", "resume_all",
           "held_barrier", "handoff_all", "state_of", "gate_modes"]


def build_changed_successor(world, *, epoch_key: str, ordering_patch: dict, generation: str = "g2"):
    """Author, through the owner services, a new pack generation whose route changes `ordering` by
    `ordering_patch`, the next Catalog view revision binding it, a new configuration generation over that revision,
    and prepare and verify a successor epoch from it."""
    import copy
    import hashlib

    from connector.choices import BindingKind
    from connector.services import owners

    pack = copy.deepcopy(PACK_A)
    for definition in pack["routes"].values():
        definition["ordering"] = {**definition["ordering"], **ordering_patch}
    prefix = world.prefix
    installed = owners.pack_generation_install(
        generation_id=f"{prefix}{pack['owner_pack']}.{generation}", owner_pack=pack["owner_pack"],
        pack_installation_id=f"{prefix}{pack['owner_pack']}.inst", actor=ACTOR, definitions=[
            *({"kind": BindingKind.INBOUND_ROUTE, "business_key": k, "version": 1, "definition": d}
              for k, d in pack["routes"].items()),
            *({"kind": BindingKind.FIELD_MAPPING, "business_key": k, "version": 1, "definition": d}
              for k, d in pack["mappings"].items())])
    bindings = [{"kind": BindingKind.INBOUND_ROUTE, "pack_generation_id": installed.generation_id,
                 "business_key": k, "definition_version": 1, "credential_refs": [pack["credential_ref"]],
                 "runtime": tuple(pack["runtime"])} for k in pack["routes"]]
    bindings += [{"kind": BindingKind.FIELD_MAPPING, "pack_generation_id": installed.generation_id,
                  "business_key": k, "definition_version": 1, "credential_refs": []} for k in pack["mappings"]]
    view = owners.catalog_view_publish(
        view_key=world.view.view_key, organization="conformance-org", application_installation="crm-install",
        authorized_workload="connector-v2", lineage_revision="1.0",
        source_snapshot_digest=hashlib.sha256(f"{prefix}snapshot".encode()).digest(), security_epoch=1,
        capability_version="cap.v1", bindings=bindings, actor=ACTOR)
    relation = [(a.account_key, pack["credential_ref"], f"{a.account_key}.{pack['credential_ref']}.g1")
                for a in world.accounts]
    configuration = owners.service_configuration_create(
        generation_id=f"{prefix}config.{generation}", catalog_view_key=view.view_key, catalog_revision=view.revision,
        accounts=[{"account_key": a.account_key, "enabled_routes": list(pack["routes"]),
                   "mapping_selections": {k: "default" for k in pack["mappings"]}, "policy_values": {}}
                  for a in world.accounts], credential_relation=relation, actor=ACTOR)
    epoch = serving.epoch_prepare_from_owners(epoch_id=f"{prefix}{epoch_key}",
                                              configuration_generation_id=configuration.generation_id, actor=ACTOR)
    return serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
