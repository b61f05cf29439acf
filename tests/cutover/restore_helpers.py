"""Builders for the V1 restore tests: accounts, a Catalog view, one configuration generation and a verified
candidate epoch (never activated); the REAL V1 (`v1` app) accepting and finishing work against a loopback
provider, its barriers closed and its generation terminated and isolated; the frozen gates walked to `v1_drained`
(halt_v1, stop_v1, certify_drained: engineer B writes the real drain); a ServiceCutoverAttempt and its
V1ShutdownCertificate (written here; B writes the real writer)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from connector.actors import Actor
from connector.choices import BindingKind
from connector.models import AccountServingGate, ConnectorAccount, ServingEpoch
from connector.selectors.routes import clear_caches
from connector.services import gates as gate_services
from connector.services import owners, serving
from cutover.models import ServiceCutoverAttempt, V1ShutdownCertificate
from cutover.ports import BarrierKind, v1_owner
from tests.conformance.packs import PACK_A
from tests.effects.receiver import Receiver
from tests.support import whole_seconds
from v1 import runtime
from v1.models import RELEASE_ID, V1SourceCursor

ACTOR = Actor.system("restore-test")
H = lambda s: hashlib.sha256(s.encode()).digest()  # noqa: E731


@dataclass
class RestoreWorld:
    prefix: str
    accounts: list[ConnectorAccount] = field(default_factory=list)
    configuration: object = None
    epoch: ServingEpoch | None = None
    attempt: ServiceCutoverAttempt | None = None
    v1_generation: str = ""

    @property
    def key(self) -> str:
        return self.attempt.attempt_key

    def modes(self) -> set[str]:
        return set(AccountServingGate.objects.filter(account__in=self.accounts).values_list("mode", flat=True))


def build_owners(prefix: str, account_keys=("acct-1", "acct-2")) -> RestoreWorld:
    clear_caches()
    world = RestoreWorld(prefix)
    pack = PACK_A
    for key in account_keys:
        world.accounts.append(owners.account_create(account_key=f"{prefix}{key}", provider_scope="conformance",
                                                    display_name=key, actor=ACTOR))
    generation = owners.pack_generation_install(
        generation_id=f"{prefix}{pack['owner_pack']}.g1", owner_pack=pack["owner_pack"],
        pack_installation_id=f"{prefix}{pack['owner_pack']}.inst", actor=ACTOR, definitions=[
            *({"kind": BindingKind.INBOUND_ROUTE, "business_key": k, "version": 1, "definition": d}
              for k, d in pack["routes"].items()),
            *({"kind": BindingKind.FIELD_MAPPING, "business_key": k, "version": 1, "definition": d}
              for k, d in pack["mappings"].items())])
    bindings = [{"kind": BindingKind.INBOUND_ROUTE, "pack_generation_id": generation.generation_id,
                 "business_key": k, "definition_version": 1, "credential_refs": [pack["credential_ref"]],
                 "runtime": tuple(pack["runtime"])} for k in pack["routes"]]
    bindings += [{"kind": BindingKind.FIELD_MAPPING, "pack_generation_id": generation.generation_id,
                  "business_key": k, "definition_version": 1, "credential_refs": []} for k in pack["mappings"]]
    view = owners.catalog_view_publish(
        view_key=f"{prefix}view", organization="conformance-org", application_installation="crm-install",
        authorized_workload="connector-v2", lineage_revision="1.0", source_snapshot_digest=H(f"{prefix}snap"),
        security_epoch=1, capability_version="cap.v1", bindings=bindings, actor=ACTOR)
    relation = []
    for account in world.accounts:
        generation_id = f"{account.account_key}.{pack['credential_ref']}.g1"
        owners.credential_generation_create(
            generation_id=generation_id, credential_identity=pack["credential_ref"], account_key=account.account_key,
            secret=hashlib.sha256(generation_id.encode()).hexdigest().encode(),
            transport_config={"base_url": "http://127.0.0.1:8900", "auth": "bearer"}, actor=ACTOR)
        relation.append((account.account_key, pack["credential_ref"], generation_id))
    routes = list(pack["routes"])
    world.configuration = owners.service_configuration_create(
        generation_id=f"{prefix}config.g1", catalog_view_key=view.view_key, catalog_revision=view.revision,
        accounts=[{"account_key": a.account_key, "enabled_routes": routes,
                   "mapping_selections": {k: "default" for k in pack["mappings"]}, "policy_values": {}}
                  for a in world.accounts], credential_relation=relation, actor=ACTOR)
    epoch = serving.epoch_prepare_from_owners(epoch_id=f"{prefix}epoch", actor=ACTOR,
                                              configuration_generation_id=world.configuration.generation_id)
    world.epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    return world


def start_provider(settings) -> Receiver:
    """The provider V1's egress calls: a real loopback HTTP receiver."""
    receiver = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR,
                          "EGRESS_BASE_URL": receiver.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(1)}
    return receiver


def accept(account_key: str, transport_key: str, position: int):
    return runtime.accept(account_key=account_key, source_key=f"{account_key}/webhook", transport_key=transport_key,
                          payload=f'{{"k":"{transport_key}"}}'.encode(), partition="rec-1", position=position)


def seed_v1(world: RestoreWorld) -> None:
    """The real V1 serves: two items per account accepted (cursor checkpointed) and finished (one provider call
    each, effect finalized, high-water advanced); then the owner barriers close and the generation is terminated
    and egress-isolated, as the drain leaves it."""
    owner = v1_owner()
    generation = runtime.generation_start(started_by="restore-test")
    for i, account in enumerate(world.accounts):
        accept(account.account_key, f"evt-{i}-a", 10 + i)
        accept(account.account_key, f"evt-{i}-b", 20 + i)
    runtime.drain(generation.generation_id)
    key = f"{world.prefix}attempt-1"
    for kind in BarrierKind:
        owner.close_barrier(kind, key)
    owner.terminate_generation(generation.generation_id, key)
    owner.isolate_egress(generation.generation_id, key)
    world.v1_generation = generation.generation_id


def v1_cursors() -> dict[str, str]:
    return dict(V1SourceCursor.objects.values_list("source_key", "cursor"))


def drain(world: RestoreWorld, *, actions=("halt_v1", "stop_v1", "certify_drained")) -> None:
    for account in world.accounts:
        for action in actions:
            gate_services.gate_transition(account_id=account.pk, action=action, expected_fence=None, actor=ACTOR,
                                          reason="restore test: drained V1 (engineer B writes the real drain)")


def open_attempt(world: RestoreWorld, *, certificate: bool = True) -> ServiceCutoverAttempt:
    world.attempt = ServiceCutoverAttempt.objects.create(
        attempt_key=f"{world.prefix}attempt-1", configuration=world.configuration, candidate_epoch=world.epoch,
        candidate_epoch_digest=bytes(world.epoch.digest), v1_release_id=RELEASE_ID,
        v1_generation_id=world.v1_generation, account_set_digest=H("accounts"), account_count=len(world.accounts),
        opened_by="restore-test")
    if certificate:
        write_certificate(world)
    return world.attempt


def write_certificate(world: RestoreWorld) -> V1ShutdownCertificate:
    digests = {f: H(f"{world.prefix}{f}") for f in (
        "readiness_certificate_digest", "egress_manifest_digest", "barrier_receipts_digest", "inventory_digest",
        "tombstone_coverage_digest", "baseline_coverage_digest", "termination_receipt_digest",
        "isolation_receipt_digest")}
    payload = b"|".join(sorted(digests.values()))
    release = v1_owner().release()
    return V1ShutdownCertificate.objects.create(
        attempt=world.attempt, v1_release_id=release.release_id, v1_binary_digest=release.binary_digest,
        v1_schema_digest=release.schema_digest, configuration_digest=release.configuration_digest,
        account_set_digest=bytes(world.attempt.account_set_digest), payload=payload,
        digest=hashlib.sha256(payload).digest(), **digests)


def drained_world(prefix: str = "r-") -> RestoreWorld:
    world = build_owners(prefix)
    seed_v1(world)
    drain(world)
    open_attempt(world)
    return world
