"""Builders and drivers for inbound-chain tests.

`build_inbound_world` installs L1 packs given as plain data (see `tests/conformance/packs.py`), publishes a
Catalog view, mints credential generations and one L2 configuration generation, and activates an epoch, all
through the services (STYLE R19: multi-row invariants are set up through services). The drivers walk the chain
the way workers do: admit -> materialize -> lane_advance -> claim -> run."""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.db.models import Model

from connector.actors import Actor
from connector.choices import BindingKind
from connector.demo import walk_gates_to_validating
from connector.models import (
    ConnectorAccount,
    Execution,
    IntegrationBindingView,
    OrderingLane,
    PackGeneration,
    Projection,
    Receipt,
    ServiceConfigurationGeneration,
    ServingEpoch,
)
from connector.selectors.routes import clear_caches
from connector.services import admission, execution, materialize, owners, serving

ACTOR = Actor.system("test")
_keys = itertools.count(1)


class BugReproduced(AssertionError):
    """Raised only by the final check of a test that reproduces a known product bug (marked
    `xfail(strict=True, raises=BugReproduced)`), so that a broken setup fails instead of counting as the bug."""


@dataclass
class InboundWorld:
    prefix: str
    accounts: list[ConnectorAccount] = field(default_factory=list)
    packs: list[PackGeneration] = field(default_factory=list)
    view: IntegrationBindingView | None = None
    configuration: ServiceConfigurationGeneration | None = None
    epoch: ServingEpoch | None = None

    @property
    def account(self) -> ConnectorAccount:
        return self.accounts[0]


def build_inbound_world(prefix: str, packs: list[dict[str, Any]], *,
                        account_keys: tuple[str, ...] = ("acct-1",)) -> InboundWorld:
    """Install `packs` (plain data), publish one Catalog view binding every route and mapping, mint one
    credential generation per (account, pack credential ref), author one configuration enabling every route,
    and verify and activate one epoch (gates walked to `v2_serving`)."""
    clear_caches()
    world = InboundWorld(prefix=prefix)
    for key in account_keys:
        world.accounts.append(owners.account_create(account_key=f"{prefix}{key}", provider_scope="conformance",
                                                    display_name=key, actor=ACTOR))
    bindings: list[dict[str, Any]] = []
    for pack in packs:
        generation = owners.pack_generation_install(
            generation_id=f"{prefix}{pack['owner_pack']}.g1", owner_pack=pack["owner_pack"],
            pack_installation_id=f"{prefix}{pack['owner_pack']}.inst", actor=ACTOR, definitions=[
                *({"kind": BindingKind.INBOUND_ROUTE, "business_key": key, "version": 1, "definition": d}
                  for key, d in pack["routes"].items()),
                *({"kind": BindingKind.FIELD_MAPPING, "business_key": key, "version": 1, "definition": d}
                  for key, d in pack["mappings"].items())])
        world.packs.append(generation)
        bindings += [{"kind": BindingKind.INBOUND_ROUTE, "pack_generation_id": generation.generation_id,
                      "business_key": key, "definition_version": 1, "credential_refs": [pack["credential_ref"]],
                      "runtime": tuple(pack["runtime"])} for key in pack["routes"]]
        bindings += [{"kind": BindingKind.FIELD_MAPPING, "pack_generation_id": generation.generation_id,
                      "business_key": key, "definition_version": 1, "credential_refs": []}
                     for key in pack["mappings"]]
    world.view = owners.catalog_view_publish(
        view_key=f"{prefix}view", organization="conformance-org", application_installation="crm-install",
        authorized_workload="connector-v2", lineage_revision="1.0",
        source_snapshot_digest=hashlib.sha256(f"{prefix}snapshot".encode()).digest(), security_epoch=1,
        capability_version="cap.v1", bindings=bindings, actor=ACTOR)
    relation = []
    for account in world.accounts:
        for ref in sorted({p["credential_ref"] for p in packs}):
            generation_id = f"{account.account_key}.{ref}.g1"
            owners.credential_generation_create(
                generation_id=generation_id, credential_identity=ref, account_key=account.account_key,
                secret=hashlib.sha256(generation_id.encode()).hexdigest().encode(),
                transport_config={"base_url": "http://127.0.0.1:8900", "auth": "bearer"}, actor=ACTOR)
            relation.append((account.account_key, ref, generation_id))
    routes = [key for p in packs for key in p["routes"]]
    mappings = {key: "default" for p in packs for key in p["mappings"]}
    world.configuration = owners.service_configuration_create(
        generation_id=f"{prefix}config.g1", catalog_view_key=world.view.view_key, catalog_revision=world.view.revision,
        accounts=[{"account_key": a.account_key, "enabled_routes": routes, "mapping_selections": mappings,
                   "policy_values": {}} for a in world.accounts], credential_relation=relation, actor=ACTOR)
    epoch = serving.epoch_prepare_from_owners(epoch_id=f"{prefix}epoch",
                                              configuration_generation_id=world.configuration.generation_id,
                                              actor=ACTOR)
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    walk_gates_to_validating(world, ACTOR)
    world.epoch = serving.epoch_activate_first(epoch_pk=epoch.pk, actor=ACTOR)
    assert world.epoch.state == "active"
    return world


# -- bodies ----------------------------------------------------------------------------------------------------

def webhook_event(evt_id: str, record_id: str, sequence: int, *, full_name: str = "Ada Lovelace",
                  mail: str = "ada@example.test", evt_type: str = "contact.updated", **extra: Any) -> dict:
    """One component of pack A (batched JSON webhook)."""
    return {"evt_id": evt_id, "evt_type": evt_type, "record_id": record_id, "sequence": sequence,
            "emitted_at": "2024-05-01T10:00:00Z", "attributes": {"full_name": full_name, "mail": mail}, **extra}


def webhook_body(*events: dict) -> bytes:
    return json.dumps({"events": list(events)}).encode()


def feed_line(line_id: str, seq: int, member_ref: str, *, batch_tag: str = "batch-1", payee_name: str = "Grace",
              payee_email: str = "grace@example.test") -> str:
    """One line of pack B (line-oriented feed)."""
    return "\t".join([line_id, str(seq), member_ref, batch_tag, payee_name, payee_email])


def feed_body(*lines: str) -> bytes:
    return ("\n".join(lines) + "\n").encode()


# -- drivers ---------------------------------------------------------------------------------------------------

def admit(world: InboundWorld, channel: str, body: bytes, *, key: str | None = None,
          account: ConnectorAccount | None = None) -> Receipt:
    account = account or world.account
    result = admission.receipt_admit(account_key=account.account_key, channel=channel,
                                     transport_key=key or f"delivery-{next(_keys)}", body=body, actor=ACTOR)
    return result.receipt


def deliver(world: InboundWorld, channel: str, body: bytes, **kwargs: Any) -> materialize.Materialized:
    """Admit and materialize one delivery."""
    receipt = admit(world, channel, body, **kwargs)
    return materialize.receipt_materialize(receipt_pk=receipt.pk)


def pending_lane_pks() -> list[int]:
    return sorted(set(Projection.objects.filter(lane_status="pending").values_list("lane_id", flat=True)))


def advance_lanes() -> list[Execution]:
    """One `lane_advance` of every lane with pending positions; the minted executions."""
    minted = []
    for lane_pk in pending_lane_pks():
        found = execution.lane_advance(lane_pk=lane_pk)
        if found is not None:
            minted.append(found)
    return minted


def run_ready(*, holder: str = "worker-1", lease_seconds: int = 60) -> list[Execution]:
    """Claim and run every claimable execution; the executions as recorded."""
    done = []
    while (token := execution.execution_claim(holder=holder, lease_seconds=lease_seconds)) is not None:
        done.append(execution.execution_run(token=token))
    return done


def drain() -> list[Execution]:
    """Advance lanes and run executions until nothing moves (the sweeper and workers, without time passing)."""
    done: list[Execution] = []
    while True:
        minted = advance_lanes()
        ran = run_ready()
        done += ran
        if not minted and not ran:
            return done


def lane(route: str, partition: str) -> OrderingLane:
    return OrderingLane.objects.get(route=route, partition=partition)


def snapshot(instance: Model) -> dict[str, Any]:
    """Every column of one row as stored (binary columns as bytes), for byte-identity comparisons."""
    row = type(instance).objects.filter(pk=instance.pk).values().get()
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in row.items()}


def waiting_in_this_database() -> int:
    """Sessions of this test database currently waiting on a lock (other suites share the server, so
    `tests.concurrency.backend_pid_waiting`, which counts the whole cluster, could see their waits)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                       "WHERE NOT l.granted AND a.datname = current_database()")
        return cursor.fetchone()[0]
