"""Admitted facts bind one exact serving generation: typed foreign keys, the epoch's own pack generation and
configuration, never a newer pack or configuration; epochs addressed by exact ID and digest; the L2 reader is
exact-generation. Real PostgreSQL, through the services."""
from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
from django.db import models

from connector.actors import Actor
from connector.choices import BindingKind
from connector.errors import EpochNotFound, OwnerFactInvalid
from connector.models import CrmRecord, Event, Execution, OrderingLane, Projection, Receipt, ServingEpoch
from connector.selectors import owners as owner_readers
from connector.selectors.epoch_candidate import candidate_from_owners
from connector.selectors.routes import clear_caches, route_for
from connector.selectors.serving import epoch_get
from connector.services import owners
from connector.services.materialize import command_id_for
from effects.models import OutboundCommand, RemoteEffect
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import build_inbound_world, deliver, drain, webhook_body, webhook_event

ACTOR = Actor.system("test")
ROOT = Path(__file__).resolve().parents[2]
ROUTE = "records.webhook"


@pytest.fixture
def world(db):
    return build_inbound_world("xg-", [PACK_A])


def _install_newer_pack_and_configuration(world):
    """A newer generation of the same pack whose mapping writes a different target field, and a newer
    configuration that enables no route: mutable current state that an active epoch must never read."""
    changed = copy.deepcopy(PACK_A)
    changed["mappings"]["records.webhook.fields"]["fields"][0]["target"] = "renamed_by_newer_pack"
    owners.pack_generation_install(
        generation_id="xg-acme-hooks.g2", owner_pack="acme-hooks", pack_installation_id="xg-acme-hooks.inst",
        actor=ACTOR, definitions=[
            *({"kind": BindingKind.INBOUND_ROUTE, "business_key": k, "version": 1, "definition": d}
              for k, d in changed["routes"].items()),
            *({"kind": BindingKind.FIELD_MAPPING, "business_key": k, "version": 1, "definition": d}
              for k, d in changed["mappings"].items())])
    owners.service_configuration_create(
        generation_id="xg-config.g2", catalog_view_key=world.view.view_key, catalog_revision=world.view.revision,
        accounts=[{"account_key": world.account.account_key, "enabled_routes": [], "mapping_selections": {},
                   "policy_values": {}}], actor=ACTOR,
        credential_relation=[(k, "acme-hooks-signing", f"{k}.acme-hooks-signing.g1")
                             for k in [world.account.account_key]])
    clear_caches()


def test_every_admitted_fact_binds_the_exact_epoch_and_never_a_newer_pack_or_configuration(world):
    """With a newer pack generation (a changed mapping) and a newer configuration (the route disabled) installed
    beside the active epoch, a delivery is still admitted under the active epoch, routed by the epoch's own pack
    generation and mapped by its frozen mapping; Receipt, Event, Projection, lane and Execution all name that one
    epoch. Proves: CV2-02-002, CV2-02-004"""
    _install_newer_pack_and_configuration(world)
    program = route_for(epoch_pk=world.epoch.pk, epoch_digest=bytes(world.epoch.digest),
                        account_id=world.account.pk, channel=ROUTE)
    assert program.pack_generation_id == "xg-acme-hooks.g1"

    deliver(world, ROUTE, webhook_body(webhook_event("E-1", "rec-1", 1, full_name="Ada")))
    drain()
    epochs = {m.__name__: set(m.objects.values_list("epoch_id", flat=True))
              for m in (Receipt, Event, Projection, OrderingLane, Execution)}
    assert epochs == {name: {world.epoch.pk} for name in epochs}
    record = CrmRecord.objects.get(record_key="rec-1")
    assert record.fields.get("display_name") == "Ada" and "renamed_by_newer_pack" not in record.fields


def test_work_identity_is_typed_columns_and_foreign_keys_not_a_concatenated_id(world):
    """Account, epoch, receipt, event, projection, lane and execution relations are typed foreign keys; the
    execution generation is its own integer column; the Runtime command ID is an opaque digest of the projection
    identity and generation that encodes no account, route, epoch or generation text.
    Proves: CV2-01-001"""
    deliver(world, ROUTE, webhook_body(webhook_event("E-1", "rec-1", 1)))
    drain()
    related = {"account", "epoch", "receipt", "event", "projection", "lane", "execution", "window",
               "replay_request", "predecessor", "command", "effect", "source_execution", "credential_generation",
               "pack_generation", "configuration"}
    for model in (Receipt, Event, Projection, OrderingLane, Execution, OutboundCommand, RemoteEffect):
        for f in model._meta.concrete_fields:
            if f.name in related:
                assert isinstance(f, models.ForeignKey), f"{model.__name__}.{f.name} is not a foreign key"
    assert isinstance(Execution._meta.get_field("generation"), models.PositiveIntegerField)
    execution = Execution.objects.select_related("projection", "account", "epoch").get()
    assert execution.command_id == command_id_for(bytes(execution.projection.identity_digest), execution.generation)
    for part in (execution.account.account_key, ROUTE, execution.epoch.epoch_id, "rec-1", f":{execution.generation}"):
        assert part not in execution.command_id


def test_an_epoch_is_addressed_only_by_its_exact_id_and_digest(world):
    """The serving-epoch repository returns an epoch for its exact ID and digest; the right ID with any other
    digest, or an unknown ID, is EPOCH_NOT_FOUND. Proves: CV2-02-025"""
    epoch = world.epoch
    assert epoch_get(epoch_id=epoch.epoch_id, digest=bytes(epoch.digest)).pk == epoch.pk
    wrong = bytes([bytes(epoch.digest)[0] ^ 1]) + bytes(epoch.digest)[1:]
    for epoch_id, digest in ((epoch.epoch_id, wrong), (epoch.epoch_id, b""), ("xg-nope", bytes(epoch.digest))):
        with pytest.raises(EpochNotFound) as caught:
            epoch_get(epoch_id=epoch_id, digest=digest)
        assert caught.value.code == "EPOCH_NOT_FOUND"


def test_the_configuration_reader_is_exact_generation(world):
    """L2's one reader returns the exact generation asked for, not the newest: the epoch candidate built from
    the older generation carries the older receipt while a newer generation exists; an absent generation is
    OWNER_FACT_INVALID, never a fallback. Proves: CV2-02-014"""
    _install_newer_pack_and_configuration(world)
    old = owner_readers.service_configuration_read(generation_id="xg-config.g1")
    new = owner_readers.service_configuration_read(generation_id="xg-config.g2")
    assert (old.generation_id, new.generation_id) == ("xg-config.g1", "xg-config.g2")
    assert bytes(old.receipt) != bytes(new.receipt)
    candidate = candidate_from_owners(epoch_id="xg-again", configuration_generation_id="xg-config.g1")
    assert candidate.configuration.generation_id == "xg-config.g1"
    assert bytes(candidate.configuration.owner_receipt) == bytes(old.receipt)
    assert bytes(candidate.configuration.owner_receipt) == bytes(
        ServingEpoch.objects.get(pk=world.epoch.pk).configuration_receipt)
    with pytest.raises(OwnerFactInvalid, match="absent"):
        owner_readers.service_configuration_read(generation_id="xg-config.g3")


def test_l0_never_imports_an_l1_pack():
    """L1 packs reach the product only as frozen definitions interpreted by the neutral L0 interpreters: no
    module of the product apps imports the conformance packs or anything under tests/. Proves: CV2-02-004"""
    offenders = []
    for app in ("connector", "effects", "cutover", "governance", "observability"):
        for path in (ROOT / app).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "tests"]
    assert offenders == []


def test_a_changed_catalog_lineage_alone_needs_an_exact_successor_epoch(world):
    """After first activation, a new Catalog revision whose binding rows are identical and whose only change is
    its lineage revision is not absorbed by the active epoch: its bytes stay as they were and the gate keeps
    serving it, and the change can be served only through a new, separately verified epoch whose preimage and
    digest differ. Proves: CV2-11-001"""
    from connector.models import AccountServingGate, CatalogBinding
    from connector.services import serving

    active = ServingEpoch.objects.get(pk=world.epoch.pk)
    frozen = (bytes(active.preimage), bytes(active.digest), active.state)
    v = world.view
    bindings = [{"kind": b.kind, "pack_generation_id": b.pack_generation.generation_id, "business_key": b.business_key,
                 "definition_version": b.definition_version, "credential_refs": b.credential_refs,
                 **({"runtime": (b.runtime_command_definition_id, b.runtime_command_version)}
                    if b.runtime_command_definition_id else {})}
                for b in v.bindings.order_by("ordinal")]
    newer = owners.catalog_view_publish(
        view_key=v.view_key, organization=v.organization, application_installation=v.application_installation,
        authorized_workload=v.authorized_workload, lineage_revision="1.1",
        source_snapshot_digest=bytes(v.source_snapshot_digest), security_epoch=v.security_epoch,
        capability_version=v.capability_version, bindings=bindings, actor=ACTOR)
    same_rows = [list(CatalogBinding.objects.filter(view=view).order_by("ordinal").values_list(
        "kind", "business_key", "identity_digest", "pack_generation_id")) for view in (v, newer)]
    assert same_rows[0] == same_rows[1]
    key = world.account.account_key
    owners.service_configuration_create(
        generation_id="xg-config.lineage", catalog_view_key=v.view_key, catalog_revision=newer.revision,
        accounts=[{"account_key": key, "enabled_routes": [ROUTE], "mapping_selections": {
            "records.webhook.fields": "default"}, "policy_values": {}}], actor=ACTOR,
        credential_relation=[(key, "acme-hooks-signing", f"{key}.acme-hooks-signing.g1")])
    successor = serving.epoch_prepare_from_owners(epoch_id="xg-successor",
                                                  configuration_generation_id="xg-config.lineage", actor=ACTOR)
    successor = serving.epoch_verify(epoch_pk=successor.pk, actor=ACTOR)
    assert successor.state == "verified" and bytes(successor.digest) != frozen[1]
    assert bytes(successor.preimage) != frozen[0]
    active.refresh_from_db()
    assert (bytes(active.preimage), bytes(active.digest), active.state) == frozen
    assert AccountServingGate.objects.get(account=world.account).epoch_id == active.pk
