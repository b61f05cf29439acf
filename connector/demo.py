"""A small, complete world built only through the services: two accounts, two pack generations, a Catalog
view with one binding of each of the four kinds, credential generations whose secrets live in the secret
backend, one L2 configuration generation, an active ServingEpoch (gates walked to v2_serving) and a second,
verified candidate. Used by `manage.py demo_load` and by the tests (with a distinct prefix)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from connector.actors import Actor
from connector.choices import BindingKind, GateMode
from connector.models import (
    ConnectorAccount,
    IntegrationBindingView,
    PackGeneration,
    ServiceConfigurationGeneration,
    ServingEpoch,
)
from connector.services import gates as gate_services
from connector.services import owners, serving

ROUTE_DEFINITION = {
    "ordering_contract": "latest_source_position",
    "extract": {"format": "json", "components": "/events"},
    "normalize": {"event_kind": "/type", "source_event_key": "/id", "source_locator": "/record_id",
                  "occurred_at": "/occurred_at", "payload": "/data"},
    "ordering": {"partition": "/record_id", "position": "/sequence", "position_kind": "integer",
                 "tie_breaker": "/id"},
    "projection": {"record_key": "/record_id"},
    "mapping": "records.mapping",
    "terminal_disposition": {"applied": "advance", "noop": "advance", "rejected": "advance", "failed": "quarantine"},
}
# The strict-sequence channel of the same webhook shape (D-196): sequence numbers must arrive without gaps; a
# gap waits 30 s (the route's frozen deadline), then halts the record's partition until an operator resumes it.
SEQUENCED_CHANNEL = "records.sequenced"
SEQUENCED_ROUTE_DEFINITION = {
    **ROUTE_DEFINITION,
    "ordering_contract": "strict_source_sequence",
    "ordering": {**ROUTE_DEFINITION["ordering"], "first_position": 1, "gap_deadline_seconds": 30,
                 "gap_disposition": "quarantine_partition"},
}
# Runtime pushes every applied record change to the remote system through this contract and callout.
PUSH = {"push": {"contract": "records.push", "callout": "records.callout"}}
MAPPING_DEFINITION = {"fields": [{"source": "/name", "target": "display_name"},
                                 {"source": "/email", "target": "email"}]}
# A record without a RemoteLink is created (upsert by its external key); a linked record is updated at its remote
# identity (D-190): the `update` variant, addressed with the link's `{remote_id}`, never a pushed field.
CALLOUT_DEFINITION = {"method": "POST", "path_template": "/v1/records/{record_key}", "timeout_ms": 5000,
                      "update": {"method": "PATCH", "path_template": "/v1/records/by-id/{remote_id}"}}
PUSH_DEFINITION = {"effect_definition": "record-upsert", "effect_version": 1, "idempotency": "provider_key"}
# The demo CRM's promise (demo/crm.py: each mutation applied once per Idempotency-Key, a repeat answered with the
# first answer): an uncertain push is repeated by the product itself under the same key (issue 37 item 2, D-430).
# `make run`'s world declares it; the test worlds only when they ask (`idempotency_contract=True`).
CALLOUT_IDEMPOTENCY_CONTRACT = {"key_header": "Idempotency-Key", "guarantee": "byte_identical_repeat_is_one_effect",
                                "retention_seconds": 86400, "automatic_repeats": 3, "repeat_backoff_seconds": 15}


@dataclass
class World:
    prefix: str
    accounts: list[ConnectorAccount] = field(default_factory=list)
    packs: list[PackGeneration] = field(default_factory=list)
    view: IntegrationBindingView | None = None
    configuration: ServiceConfigurationGeneration | None = None
    credential_generation_ids: list[str] = field(default_factory=list)
    active_epoch: ServingEpoch | None = None
    verified_epoch: ServingEpoch | None = None


CREDENTIAL_REFS = {"inbound": "webhook-signing", "outbound": "crm-api"}


def build_owners(prefix: str, *, account_keys: tuple[str, ...] = ("acme-eu", "globex-us"),
                 actor: Actor | None = None, push: bool = False, sequenced: bool = False,
                 extra_routes: dict | None = None, disabled_routes: tuple[str, ...] = (),
                 idempotency_contract: dict | bool = False) -> World:
    """Accounts, packs, Catalog view, credential generations and one configuration generation. `sequenced` adds
    the strict-sequence channel beside the latest-position one; `extra_routes` ({business key: definition}) adds
    more inbound routes of the webhook pack, each bound and enabled unless named in `disabled_routes`.
    `idempotency_contract`: the callout profile declares CALLOUT_IDEMPOTENCY_CONTRACT (True) or the given one."""
    extra_routes = extra_routes or {}
    actor = actor or Actor.system("demo")
    callout_definition = CALLOUT_DEFINITION
    if idempotency_contract:
        callout_definition = {**CALLOUT_DEFINITION, "idempotency_contract": (
            CALLOUT_IDEMPOTENCY_CONTRACT if idempotency_contract is True else idempotency_contract)}
    world = World(prefix=prefix)
    for key in account_keys:
        world.accounts.append(owners.account_create(account_key=f"{prefix}{key}", provider_scope="demo-provider",
                                                    display_name=key.replace("-", " ").title(), actor=actor))
    world.packs.append(owners.pack_generation_install(
        generation_id=f"{prefix}webhook-pack.g1", owner_pack="webhook-pack", pack_installation_id=f"{prefix}inst-1",
        definitions=[
            {"kind": BindingKind.INBOUND_ROUTE, "business_key": "records.webhook", "version": 1,
             "definition": {**ROUTE_DEFINITION, **(PUSH if push else {})}},
            {"kind": BindingKind.FIELD_MAPPING, "business_key": "records.mapping", "version": 1,
             "definition": MAPPING_DEFINITION},
            *([{"kind": BindingKind.INBOUND_ROUTE, "business_key": SEQUENCED_CHANNEL, "version": 1,
                "definition": {**SEQUENCED_ROUTE_DEFINITION, **(PUSH if push else {})}}] if sequenced else []),
            *({"kind": BindingKind.INBOUND_ROUTE, "business_key": key, "version": 1, "definition": definition}
              for key, definition in extra_routes.items()),
        ], actor=actor))
    world.packs.append(owners.pack_generation_install(
        generation_id=f"{prefix}callout-pack.g1", owner_pack="callout-pack", pack_installation_id=f"{prefix}inst-2",
        definitions=[
            {"kind": BindingKind.CALLOUT_PROFILE, "business_key": "records.callout", "version": 1,
             "definition": callout_definition},
            {"kind": BindingKind.PUSH_CONTRACT, "business_key": "records.push", "version": 1,
             "definition": PUSH_DEFINITION},
        ], actor=actor))
    webhook, callout = world.packs
    world.view = owners.catalog_view_publish(
        view_key=f"{prefix}catalog-view", organization="demo-org", application_installation="crm-app-install-1",
        authorized_workload="connector-v2", lineage_revision="1.0",
        source_snapshot_digest=hashlib.sha256(f"{prefix}snapshot-1".encode()).digest(), security_epoch=1,
        capability_version="cap.v1", actor=actor, bindings=[
            {"kind": BindingKind.INBOUND_ROUTE, "pack_generation_id": webhook.generation_id,
             "business_key": "records.webhook", "definition_version": 1,
             "credential_refs": [CREDENTIAL_REFS["inbound"]], "runtime": ("runtime.records.apply", 1)},
            *([{"kind": BindingKind.INBOUND_ROUTE, "pack_generation_id": webhook.generation_id,
                "business_key": SEQUENCED_CHANNEL, "definition_version": 1,
                "credential_refs": [CREDENTIAL_REFS["inbound"]], "runtime": ("runtime.records.apply", 1)}]
              if sequenced else []),
            *({"kind": BindingKind.INBOUND_ROUTE, "pack_generation_id": webhook.generation_id, "business_key": key,
               "definition_version": 1, "credential_refs": [CREDENTIAL_REFS["inbound"]],
               "runtime": ("runtime.records.apply", 1)} for key in extra_routes),
            {"kind": BindingKind.FIELD_MAPPING, "pack_generation_id": webhook.generation_id,
             "business_key": "records.mapping", "definition_version": 1, "credential_refs": []},
            {"kind": BindingKind.CALLOUT_PROFILE, "pack_generation_id": callout.generation_id,
             "business_key": "records.callout", "definition_version": 1,
             "credential_refs": [CREDENTIAL_REFS["outbound"]]},
            {"kind": BindingKind.PUSH_CONTRACT, "pack_generation_id": callout.generation_id,
             "business_key": "records.push", "definition_version": 1,
             "credential_refs": [CREDENTIAL_REFS["outbound"]], "runtime": ("runtime.records.push", 1)},
        ])
    relation = []
    for account in world.accounts:
        for ref in sorted(CREDENTIAL_REFS.values()):
            generation_id = f"{account.account_key}.{ref}.g1"
            owners.credential_generation_create(
                generation_id=generation_id, credential_identity=ref, account_key=account.account_key,
                secret=hashlib.sha256(f"demo-secret:{generation_id}".encode()).hexdigest().encode(),
                transport_config={"base_url": "http://127.0.0.1:8900", "auth": "bearer", "timeout_ms": 5000},
                actor=actor)
            world.credential_generation_ids.append(generation_id)
            relation.append((account.account_key, ref, generation_id))
    world.configuration = owners.service_configuration_create(
        generation_id=f"{prefix}config.g1", catalog_view_key=world.view.view_key, catalog_revision=world.view.revision,
        accounts=[{"account_key": a.account_key,
                   "enabled_routes": ["records.webhook", *([SEQUENCED_CHANNEL] if sequenced else []),
                                      *(k for k in extra_routes if k not in disabled_routes)],
                   "mapping_selections": {"records.mapping": "default"},
                   "policy_values": {"max_batch": 100, "retry_limit": 5}} for a in world.accounts],
        credential_relation=relation, actor=actor)
    return world


def walk_gates_to_validating(world: World, actor: Actor) -> None:
    """The demo has no V1 to drain: it walks each gate through the V1 modes with audited, evidence-free
    transitions. A real cutover reaches v2_validating only with certificates (cutover app)."""
    for account in world.accounts:
        for action in ("halt_v1", "stop_v1", "certify_drained", "begin_validation"):
            gate_services.gate_transition(account_id=account.pk, action=action, expected_fence=None, actor=actor,
                                          reason="demo world: no V1 deployment to drain")


def build_world(prefix: str = "", *, actor: Actor | None = None, push: bool = False,
                sequenced: bool = False, idempotency_contract: dict | bool = False) -> World:
    actor = actor or Actor.system("demo")
    world = build_owners(prefix, actor=actor, push=push, sequenced=sequenced,
                         idempotency_contract=idempotency_contract)
    epoch = serving.epoch_prepare_from_owners(epoch_id=f"{prefix}epoch-1",
                                              configuration_generation_id=world.configuration.generation_id,
                                              actor=actor)
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=actor)
    walk_gates_to_validating(world, actor)
    world.active_epoch = serving.epoch_activate_first(epoch_pk=epoch.pk, actor=actor)
    candidate = serving.epoch_prepare_from_owners(epoch_id=f"{prefix}epoch-2",
                                                  configuration_generation_id=world.configuration.generation_id,
                                                  actor=actor)
    world.verified_epoch = serving.epoch_verify(epoch_pk=candidate.pk, actor=actor)
    return world


def gates_serving(world: World) -> bool:
    return all(a.serving_gate.mode == GateMode.V2_SERVING for a in world.accounts)


# -- demo traffic (used by `manage.py bench`; L0 holds no pack literal, so the demo route's shapes live here) --
DEMO_CHANNEL = "records.webhook"

# SQL expression of one demo delivery body for history row `g` (psycopg paramstyle: `%%` escapes `%`).
HISTORY_BODY_SQL = (
    "'{\"events\":[{\"data\":{\"email\":\"r' || (g %% %(parts)s) || '@example.com\",\"name\":\"Record '"
    " || (g %% %(parts)s) || ' v' || (g / %(parts)s + 1) || '\"},\"id\":\"hist-ev-' || g"
    " || '\",\"occurred_at\":\"2025-01-01T00:00:00Z\",\"record_id\":\"hist-r' || (g %% %(parts)s)"
    " || '\",\"sequence\":' || (g / %(parts)s + 1) || ',\"type\":\"record.updated\"}]}'"
)


def demo_event_body(tag: str, *, sequence: int = 1) -> bytes:
    """One demo webhook delivery with a single event for record `bench-r-<tag>`."""
    import json

    return json.dumps({"events": [{"id": f"bench-ev-{tag}", "type": "record.updated", "record_id": f"bench-r-{tag}",
                                   "sequence": sequence, "occurred_at": "2025-01-01T00:00:00Z",
                                   "data": {"name": f"Bench {tag}", "email": f"{tag}@example.com"}}]},
                      sort_keys=True).encode()
