"""Every owner write in scope locks its owner barrier and fails while an activation attempt holds it (the inventory
in docs/locking.md, "Owner barriers"; D-284): refused while a first-activation or a successor barrier set is held,
allowed after the release, nothing written when refused; an owner write already past its barrier holds the set's
transition back until it commits; a publication racing the hold either commits first (and the hold sees the
drift) or is refused, never both. The urgent-revocation abort while rollback is open is proven in
tests/cutover/test_first_activation.py
(`test_a_held_set_refuses_publications_and_an_urgent_revocation_aborts_only_while_rollback_is_open`); its refusal
once activation won is proven here."""
from __future__ import annotations

import json
import threading

import pytest
from django.db import connections

from connector import hooks
from connector.models import (
    AccountServingGate,
    AuditRecord,
    BindingDefinition,
    CatalogBinding,
    ConnectorAccount,
    CredentialGeneration,
    CredentialGenerationDispatchGate,
    IntegrationBindingView,
    PackGeneration,
    ServiceConfigurationAccount,
    ServiceConfigurationCredentialMapping,
    ServiceConfigurationGeneration,
)
from connector.services import gates as gate_services
from connector.services import owners, serving
from cutover.choices import BarrierSetState
from cutover.errors import PublicationBarrierHeld, SuccessorActivationRefused, SuccessorDrifted
from cutover.models import ServiceCutoverAttempt, ServingPublicationBarrierSet
from cutover.services import first_activation as fa
from cutover.services import succession
from tests.concurrency import backend_pid_waiting, run_concurrently, start, wait_until
from tests.cutover.succession_helpers import ACTOR, build_succession_world, halt_all, held_barrier
from tests.cutover.test_first_activation import held_world, stop_after_commit
from tests.cutover.v1_world import approve_activation, build_v1_world, to_validating
from tests.support import scaled

pytestmark = pytest.mark.usefixtures("cutover_env")  # the V1 world's settings and receiver (tests/cutover/conftest.py)
TX = pytest.mark.django_db(databases=["default", "journal"], transaction=True)
OWNER_TABLES = (ConnectorAccount, AccountServingGate, PackGeneration, BindingDefinition, IntegrationBindingView,
                CatalogBinding, CredentialGeneration, CredentialGenerationDispatchGate, ServiceConfigurationGeneration,
                ServiceConfigurationAccount, ServiceConfigurationCredentialMapping, AuditRecord)


# -- the owner writes of the inventory, each authored from whatever owners the world holds ---------------------

def account_create(tag: str):
    return owners.account_create(account_key=f"late-{tag}", provider_scope="conformance", actor=ACTOR)


def pack_generation_install(tag: str):
    d = BindingDefinition.objects.order_by("pk").first()
    return owners.pack_generation_install(
        generation_id=f"late-pack.{tag}", owner_pack="late-pack", pack_installation_id=f"late-inst-{tag}",
        definitions=[{"kind": d.kind, "business_key": d.business_key, "version": d.definition_version,
                      "definition": json.loads(bytes(d.definition))}], actor=ACTOR)


def current_view() -> IntegrationBindingView:
    key = ServiceConfigurationGeneration.objects.order_by("pk").first().catalog_view.view_key
    return IntegrationBindingView.objects.filter(view_key=key).order_by("-revision").first()


def catalog_view_args() -> dict:
    """The next revision of the configuration's Catalog view: the current-selector write."""
    view = current_view()
    bindings = [{"kind": b.kind, "pack_generation_id": b.pack_generation.generation_id,
                 "business_key": b.business_key, "definition_version": b.definition_version,
                 "credential_refs": list(b.credential_refs),
                 "runtime": ((b.runtime_command_definition_id, b.runtime_command_version)
                             if b.runtime_command_definition_id else None)}
                for b in view.bindings.select_related("pack_generation").order_by("ordinal")]
    return dict(view_key=view.view_key, organization=view.organization,
                application_installation=view.application_installation,
                authorized_workload=view.authorized_workload, lineage_revision=view.lineage_revision,
                source_snapshot_digest=bytes(view.source_snapshot_digest), security_epoch=view.security_epoch,
                capability_version=view.capability_version, bindings=bindings, actor=ACTOR)


def catalog_view_publish(tag: str):
    return owners.catalog_view_publish(**catalog_view_args())


def credential_generation_create(tag: str):
    account = ConnectorAccount.objects.order_by("pk").first()
    return owners.credential_generation_create(
        generation_id=f"late-cred.{tag}", credential_identity="crm-api", account_key=account.account_key,
        secret=b"s" * 16, transport_config={"base_url": "http://127.0.0.1:1", "auth": "bearer"}, actor=ACTOR)


def service_configuration_create(tag: str):
    config = ServiceConfigurationGeneration.objects.order_by("pk").first()
    accounts = [{"account_key": a.account.account_key, "enabled_routes": a.enabled_routes,
                 "mapping_selections": a.mapping_selections, "policy_values": a.policy_values}
                for a in config.accounts.select_related("account").order_by("ordinal")]
    relation = [(m.account.account_key, m.credential_ref, m.credential_generation.generation_id)
                for m in config.credential_mappings.select_related("account", "credential_generation")]
    view = config.catalog_view
    return owners.service_configuration_create(
        generation_id=f"late-config.{tag}", catalog_view_key=view.view_key, catalog_revision=view.revision,
        accounts=accounts, credential_relation=relation, actor=ACTOR)


WRITES = {fn.__name__: fn for fn in (account_create, pack_generation_install, catalog_view_publish,
                                     credential_generation_create, service_configuration_create)}

GROWS = {"account_create": "ConnectorAccount", "pack_generation_install": "PackGeneration",
         "catalog_view_publish": "IntegrationBindingView", "credential_generation_create": "CredentialGeneration",
         "service_configuration_create": "ServiceConfigurationGeneration"}


def owner_rows() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in OWNER_TABLES}


def first_activation_held():
    """A held first-activation set and its release by the completed activation (readback, v2_committed)."""
    world = held_world()

    def release():
        approve_activation(world.epoch.epoch_id)
        fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
        assert fa.barrier_set_of(ServiceCutoverAttempt.objects.get()).state == BarrierSetState.RELEASED
    return world, release


def successor_held():
    """A held successor set (every gate halted) and its fenced release before any handoff."""
    world = build_succession_world("ob-")
    halt_all(world)
    row = held_barrier(world)

    def release():
        succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence, reason="test", actor=ACTOR)
    return world, release


HOLDERS = {"first_activation": first_activation_held, "successor": successor_held}


@TX
@pytest.mark.parametrize("holder", sorted(HOLDERS))
@pytest.mark.parametrize("write", sorted(WRITES))
def test_every_owner_write_fails_while_a_barrier_set_is_held_and_runs_after_release(write, holder):
    """While a first-activation or a successor barrier set is held, the owner write is refused with
    PUBLICATION_BARRIER_HELD and writes nothing (no owner row, no gate, no audit row); after the set's release the
    same write commits. Proves: CV2-11-034, CV2-11-055"""
    _world, release = HOLDERS[holder]()
    before = owner_rows()
    with pytest.raises(PublicationBarrierHeld) as refused:
        WRITES[write]("x")
    assert refused.value.code == "PUBLICATION_BARRIER_HELD"
    assert owner_rows() == before
    release()
    released = owner_rows()
    WRITES[write]("x")
    after = owner_rows()
    assert after[GROWS[write]] == released[GROWS[write]] + 1 and after["AuditRecord"] > released["AuditRecord"]


@TX
def test_a_revocation_under_a_held_successor_set_aborts_the_succession_then_applies():
    """A credential revocation is the design's urgent revocation (D-290): under a held successor set, before the
    successor's activation transaction, it does not wait for the barriers: it releases the set (the succession
    aborts, no gate moves) and commits, with the credential gate's fence advanced by one; a credential
    publication stays refused while a set is held (the test above). Before D-290 this test proved the opposite
    (refused until the release). Proves: CV2-11-042, CV2-11-055"""
    world, _release = successor_held()
    generation_id = world.configuration.credential_mappings.first().credential_generation.generation_id
    gate = CredentialGenerationDispatchGate.objects.get(credential_generation__generation_id=generation_id)
    modes = sorted(AccountServingGate.objects.filter(account__in=world.accounts).values_list("mode", "fence"))
    revoked = gate_services.credential_gate_transition(generation_id=generation_id, action="revoke",
                                                       expected_fence=None, actor=ACTOR, reason="key leaked")
    assert revoked.mode != gate.mode and revoked.fence == gate.fence + 1
    assert ServingPublicationBarrierSet.objects.get(holder="coord-1").state == BarrierSetState.RELEASED
    assert sorted(AccountServingGate.objects.filter(account__in=world.accounts)
                  .values_list("mode", "fence")) == modes


@TX
def test_an_urgent_revocation_no_longer_aborts_once_the_activation_won(monkeypatch):
    """Once the activation transaction committed (decision `activating_v2`, set `activation_committed`), an urgent
    revocation no longer aborts: it is refused (PUBLICATION_BARRIER_HELD, retryable), the set stays committed and
    the credential gate unchanged; after the resumed activation read back and released the set, the same
    revocation commits. Proves: CV2-11-034, CV2-11-055"""
    world = held_world()
    approve_activation(world.epoch.epoch_id)
    stop_after_commit(monkeypatch)
    attempt = ServiceCutoverAttempt.objects.get()
    generation_id = world.configuration.credential_mappings.first().credential_generation.generation_id
    gate = CredentialGenerationDispatchGate.objects.get(credential_generation__generation_id=generation_id)
    with pytest.raises(PublicationBarrierHeld):
        gate_services.credential_gate_transition(generation_id=generation_id, action="revoke", expected_fence=None,
                                                 actor=ACTOR, reason="key leaked")
    assert fa.barrier_set_of(attempt).state == BarrierSetState.ACTIVATION_COMMITTED
    assert CredentialGenerationDispatchGate.objects.get(pk=gate.pk).fence == gate.fence
    fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert fa.barrier_set_of(attempt).state == BarrierSetState.RELEASED
    revoked = gate_services.credential_gate_transition(generation_id=generation_id, action="revoke",
                                                       expected_fence=None, actor=ACTOR, reason="key leaked")
    assert revoked.fence == gate.fence + 1


@TX
@pytest.mark.parametrize("head_start", ["publication", "hold"])
def test_a_publication_racing_the_first_activation_hold_commits_first_or_is_refused(head_start):
    """A Catalog publication (it moves the current selector) and the hold of an acquiring first-activation set,
    on separate connections released together: either the publication commits first and the hold, rereading
    under the exclusive owner barriers, sees the drift and releases the set (the activation then refuses), or the
    set is held first and the publication is refused and the activation commits on unchanged owners. Never both
    a committed publication and a held set. `head_start`: the publication's arguments are read before the threads
    start (it usually reaches its barrier first) or inside its thread (the hold usually does); both outcomes are
    accepted either way. Proves: CV2-11-034, CV2-11-055"""
    world = build_v1_world()
    world.accept(0, "k1", 1)
    to_validating(world)
    fa.first_activation_acquire(attempt_key="att-1", actor=ACTOR)
    args = catalog_view_args() if head_start == "publication" else None
    results = run_concurrently(
        [lambda: fa.first_activation_hold(attempt_key="att-1", actor=ACTOR),
         lambda: owners.catalog_view_publish(**(args or catalog_view_args()))],
        expect=PublicationBarrierHeld, before=lambda: connections["default"].ensure_connection())
    row = fa.barrier_set_of(ServiceCutoverAttempt.objects.get())
    published = not isinstance(results[1], BaseException)
    if published:
        assert row.state == BarrierSetState.RELEASED and "owner drift" in row.release_reason
        assert serving.epoch_owner_drift(epoch_pk=world.epoch.pk) is not None
    else:
        assert row.state == BarrierSetState.HELD
        assert current_view().revision == 1 and serving.epoch_owner_drift(epoch_pk=world.epoch.pk) is None
        approve_activation(world.epoch.epoch_id)
        assert fa.first_activation_commit(attempt_key="att-1", actor=ACTOR).state == "active"


@TX
def test_an_owner_write_past_its_barrier_holds_the_successor_hold_back_until_it_commits(monkeypatch):
    """A Catalog publication that passed its barrier while the successor set was still `acquiring` stays open;
    the hold waits on the exclusive owner barriers instead of freezing and committing `held` under the open
    write; once the publication commits, the hold's final owner reread (under its locks, D-285) sees the new
    owner and refuses: the set stays `acquiring`, nothing is frozen, the activation is refused. No owner changes
    after a set is held. Proves: CV2-11-034, CV2-11-055, CV2-11-013"""
    world = build_succession_world("ob-")
    halt_all(world)
    row = succession.barrier_set_acquire(predecessor_epoch_id=world.epoch.epoch_id,
                                         successor_epoch_id=world.successor.epoch_id, holder="c", actor=ACTOR)
    passed, go = threading.Event(), threading.Event()
    original = hooks.publication_guard

    def paused(owner):
        original(owner)
        if threading.current_thread().name == "publisher":
            passed.set()
            assert go.wait(scaled(30))

    monkeypatch.setattr(hooks, "publication_guard", paused)
    publisher = start(lambda: catalog_view_publish("inflight"), name="publisher")
    assert passed.wait(scaled(30))
    holder = start(lambda: succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence,
                                                       actor=ACTOR), name="holder")
    try:
        assert wait_until(lambda: bool(backend_pid_waiting()), timeout=5), "the hold did not wait for the write"
        holder.join(0.5)
        assert holder.is_alive() and ServingPublicationBarrierSet.objects.get(pk=row.pk).state == "acquiring"
    finally:
        go.set()
        publisher.join(scaled(30))
        holder.join(scaled(30))
    assert publisher.error is None, publisher.error
    assert isinstance(holder.error, SuccessorDrifted) and "owners changed" in str(holder.error), holder.error
    assert publisher.finished_at <= holder.finished_at
    assert ServingPublicationBarrierSet.objects.get(pk=row.pk).state == BarrierSetState.ACQUIRING
    assert serving.epoch_owner_drift(epoch_pk=world.successor.pk) is not None
    with pytest.raises(SuccessorActivationRefused):
        succession.successor_activate(barrier_set_pk=row.pk, expected_fence=None, actor=ACTOR)
