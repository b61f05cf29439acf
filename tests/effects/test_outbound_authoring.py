"""Outbound authoring: the application transaction takes the serving guard and authors one OutboundCommand with
its complete FrozenDispatchBinding and exactly one RemoteEffect; retries converge; replay, halting gates and
conflicting intents write nothing; dispatch resolves only the frozen credential generation's exact secret."""
from __future__ import annotations


import pytest
from django.db import IntegrityError, transaction

from connector.errors import FenceStale, GateNotServing
from connector.models import (
    AccountServingGate,
    CredentialGeneration,
    PackGeneration,
    ServingEpochCredentialProof,
)
from connector.secrets import secret_backend
from connector.services import owners
from connector.services.guard import lock_serving
from effects.errors import OutboundConflict, OutboundRefused
from effects.models import OutboundCommand, RemoteEffect, RemoteEffectAttempt
from effects.services import worker
from effects.services.outbound import idempotency_key, outbound_command_author
from tests.concurrency import raised, run_concurrently
from tests.effects.helpers import (
    ACTOR,
    acquire,
    author,
    build_keyless_push_world,
    build_push_world,
    claim,
    demo_secret,
    gate_action,
    outbound_generation,
    send,
)


@pytest.fixture
def tx_push_world(transactional_db):
    return build_push_world()


@pytest.fixture
def keyless_push_world(db, monkeypatch):
    return build_keyless_push_world(monkeypatch)


def _nothing_written() -> bool:
    return OutboundCommand.objects.count() == 0 and RemoteEffect.objects.count() == 0


@pytest.mark.django_db
def test_frozen_binding_is_the_exact_epoch_pack_definition_policy_configuration_and_credential(push_world):
    """The command stores the exact facts of the epoch serving the account when it was authored: epoch ID,
    digest, profile and gate fence; the push contract's PackGeneration and payload digest; the effect definition
    and version; the policy; the configuration generation; the account's own outbound CredentialGeneration; the
    canonical request bytes and digest; the one provider idempotency key (the canonical logical-effect digest);
    EffectRoot/EffectGeneration with no predecessor; and no secret bytes. Its one RemoteEffect repeats the
    logical-effect digest, and a claimed attempt carries the same frozen references.
    Proves: CV2-10-006, CV2-10-007, CV2-10-008, CV2-10-009, CV2-10-010, CV2-10-011, CV2-10-014, CV2-15-020"""
    acme, globex = push_world.accounts
    epoch = push_world.active_epoch
    command = author(acme, root="order-7", record_id="r7", body={"record_key": "r7", "name": "Ann"})
    stored = OutboundCommand.objects.get(pk=command.pk)

    assert (stored.account_id, stored.application_scope, stored.effect_root_id, stored.effect_slot_id,
            stored.effect_generation_id) == (acme.pk, "runtime.records", "order-7", "push:records.push", "g1")
    assert (stored.epoch_id, bytes(stored.epoch_digest), stored.profile_id) == (
        epoch.pk, bytes(epoch.digest), epoch.profile_id)
    assert stored.gate_fence == AccountServingGate.objects.get(account=acme).fence
    pack = PackGeneration.objects.get(generation_id="p-callout-pack.g1")
    assert (stored.pack_generation_id, bytes(stored.pack_payload_digest)) == (pack.pk, bytes(pack.payload_digest))
    assert (stored.effect_definition, stored.effect_version) == ("records.push", 1)
    assert len(bytes(stored.route_policy_digest)) == 32 and stored.max_attempts == 3
    assert stored.configuration_id == push_world.configuration.pk
    assert stored.credential_generation.generation_id == f"{acme.account_key}.crm-api.g1"
    assert (stored.method, stored.path, bytes(stored.request_body)) == (
        "POST", "/v1/records/r7", b'{"name":"Ann","record_key":"r7"}')
    key = idempotency_key(profile_id=epoch.profile_id, account_key=acme.account_key,
                          application_scope="runtime.records", effect_root_id="order-7",
                          effect_slot_id="push:records.push", effect_generation_id="g1")
    assert bytes(stored.idempotency_key) == key
    assert stored.provider_idempotency_key == key.hex()
    assert stored.predecessor_id is None and stored.predecessor_digest is None
    # The request digest covers the request bytes: another body digests differently.
    other = author(acme, root="order-8", record_id="r7", body={"record_key": "r7", "name": "Bob"})
    assert len(bytes(stored.request_digest)) == 32 and bytes(other.request_digest) != bytes(stored.request_digest)
    assert bytes(other.route_policy_digest) == bytes(stored.route_policy_digest)
    # The other account's command binds that account's own generation, never acme's.
    assert author(globex).credential_generation.generation_id == f"{globex.account_key}.crm-api.g1"

    secret = demo_secret(stored.credential_generation.generation_id).encode()
    for f in OutboundCommand._meta.concrete_fields:
        value = getattr(stored, f.attname)
        raw = bytes(value) if isinstance(value, (bytes, memoryview)) else str(value).encode()
        assert secret not in raw, f.attname

    effect = RemoteEffect.objects.get(command=stored)
    assert (bytes(effect.logical_effect_digest), effect.account_id, effect.state) == (key, acme.pk, "prepared")

    _, c = claim("h-bind", acme)
    attempt = RemoteEffectAttempt.objects.get(pk=c.attempt_pk)
    assert (attempt.effect_id, attempt.ordinal, attempt.epoch_id, attempt.credential_generation_id,
            bytes(attempt.request_digest), attempt.provider_idempotency_key) == (
        effect.pk, 1, stored.epoch_id, stored.credential_generation_id, bytes(stored.request_digest),
        stored.provider_idempotency_key)


@pytest.mark.django_db
def test_contract_without_provider_idempotency_records_its_absence(keyless_push_world):
    """When the frozen push contract declares no remote idempotency, the command records the absence explicitly
    (NULL, never an empty or invented key) and PostgreSQL refuses a blank key. Proves: CV2-10-008"""
    command = author(keyless_push_world.accounts[0])
    assert command.provider_idempotency_key is None
    assert OutboundCommand.objects.get(pk=command.pk).provider_idempotency_key is None
    fields = {f.attname: getattr(command, f.attname) for f in OutboundCommand._meta.concrete_fields
              if f.attname not in ("id", "created_at")}
    fields.update(effect_root_id="order-blank", idempotency_key=b"\x01" * 32, provider_idempotency_key="")
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        OutboundCommand.objects.create(**fields)
    assert info.value.__cause__.diag.constraint_name == "effects_command_provider_key_not_blank"


@pytest.mark.django_db(transaction=True)
def test_32_concurrent_authorings_converge_on_one_command_and_one_effect(tx_push_world):
    """32 application transactions (threads, each on its own connection, released together) author the same
    logical effect: each takes the serving guard and authors; all return the same OutboundCommand, no error or
    deadlock, and exactly one OutboundCommand and one RemoteEffect exist. A later retry returns it again.
    Proves: CV2-10-004, CV2-10-015, CV2-10-047, CV2-10-053, CV2-15-018, CV2-15-019, CV2-15-024"""
    account = tx_push_world.accounts[0]
    results = run_concurrently([lambda: author(account, root="order-race").pk] * 32)
    assert raised(results) == []
    assert len(set(results)) == 1
    assert OutboundCommand.objects.count() == 1 and RemoteEffect.objects.count() == 1
    command = OutboundCommand.objects.get()
    assert RemoteEffect.objects.get().command_id == command.pk == results[0]
    assert author(account, root="order-race").pk == command.pk
    assert OutboundCommand.objects.count() == 1 and RemoteEffect.objects.count() == 1


@pytest.mark.django_db
def test_replay_context_cannot_author(push_world):
    """An execution context with `suppress_external_effects` (replay) is refused and writes nothing.
    Proves: CV2-10-001"""
    with pytest.raises(OutboundRefused, match="replay"):
        author(push_world.accounts[0], suppress=True)
    assert _nothing_written()


@pytest.mark.django_db
@pytest.mark.parametrize("actions", [("halt_v2",), ("halt_v2", "confirm_halted")])
def test_authoring_on_a_halting_or_halted_gate_is_refused(push_world, actions):
    """Once the account gate leaves `v2_serving` (halting_v2, v2_halted), the application transaction's guard
    refuses (GateNotServing) and no command or effect is written; the other account still serves.
    Proves: CV2-10-005, CV2-11-004"""
    acme, globex = push_world.accounts
    for action in actions:
        gate_action(acme, action)
    with pytest.raises(GateNotServing):
        author(acme)
    assert _nothing_written()
    assert author(globex).account_id == globex.pk


@pytest.mark.django_db
def test_authoring_with_a_context_from_an_earlier_transaction_is_refused(push_world):
    """A ServingContext is only proof inside the transaction that took the guard: authoring with one taken
    before the gate moved to `halting_v2` is refused and writes nothing. Proves: CV2-10-005"""
    acme = push_world.accounts[0]
    with transaction.atomic():
        ctx = lock_serving(account_id=acme.pk)
    gate_action(acme, "halt_v2")
    with pytest.raises((GateNotServing, FenceStale)), transaction.atomic():
        outbound_command_author(
            ctx=ctx, account_key=acme.account_key, application_scope="runtime.records",
            effect_root_id="order-stale", effect_slot_id="push:records.push", effect_generation_id="g1",
            push_contract="records.push", callout="records.callout",
            path_params={"record_id": "r1", "record_key": "r1"}, body={"record_key": "r1"},
            suppress_external_effects=False)
    assert _nothing_written()


@pytest.mark.django_db
def test_each_effect_slot_of_one_operation_is_a_distinct_command(push_world):
    """Two metadata-authored effect slots of the same operation (same EffectRoot) are two logical effects:
    distinct commands, idempotency keys, provider keys and effects. Proves: CV2-10-002, CV2-10-003"""
    acme = push_world.accounts[0]
    first = author(acme, root="order-9", slot="push:records.push")
    second = author(acme, root="order-9", slot="push:records.audit")
    assert first.pk != second.pk
    assert bytes(first.idempotency_key) != bytes(second.idempotency_key)
    assert first.provider_idempotency_key != second.provider_idempotency_key
    assert RemoteEffect.objects.filter(command__effect_root_id="order-9").count() == 2
    assert author(acme, root="order-9", slot="push:records.audit").pk == second.pk


@pytest.mark.django_db
def test_same_logical_effect_with_a_different_body_is_a_conflict(push_world):
    """A retry of the same logical-effect key whose request differs fails closed (OutboundConflict): nothing is
    written and the stored command keeps its original bytes. Proves: CV2-10-004, CV2-10-009"""
    acme = push_world.accounts[0]
    command = author(acme, body={"record_key": "r1", "name": "Ann"})
    with pytest.raises(OutboundConflict):
        author(acme, body={"record_key": "r1", "name": "Eve"})
    assert OutboundCommand.objects.count() == 1 and RemoteEffect.objects.count() == 1
    assert bytes(OutboundCommand.objects.get().request_body) == bytes(command.request_body)


def _rotate(account) -> CredentialGeneration:
    """Mint a newer generation of the account's outbound credential (new secret version). It is in no epoch."""
    return owners.credential_generation_create(
        generation_id=f"{account.account_key}.crm-api.g2", credential_identity="crm-api",
        account_key=account.account_key, secret=demo_secret(f"{account.account_key}.crm-api.g2").encode(),
        transport_config={"base_url": "http://127.0.0.1:8900", "auth": "bearer", "timeout_ms": 5000}, actor=ACTOR)


@pytest.mark.django_db
def test_rotation_never_changes_a_frozen_generation_and_dispatch_uses_its_exact_secret(push_world, receiver):
    """A credential rotation (a newer generation and secret version, not in the serving epoch) while one command
    is queued and another is dispatching changes neither binding; later authoring under the same epoch still
    binds the frozen generation; each request carries exactly the frozen generation's secret, never the newer
    one. Proves: CV2-10-012, CV2-10-054"""
    acme = push_world.accounts[0]
    frozen = outbound_generation(acme)
    dispatching_command = author(acme, root="order-d")
    ready = acquire("h-rot", acme)
    queued = author(acme, root="order-q")
    rotated = _rotate(acme)
    assert rotated.secret_version_ref != frozen.secret_version_ref
    assert not ServingEpochCredentialProof.objects.filter(credential_generation=rotated).exists()
    later = author(acme, root="order-later")
    for command in (dispatching_command, queued, later):
        assert OutboundCommand.objects.get(pk=command.pk).credential_generation_id == frozen.pk

    assert send(ready).state == "finalized"
    while worker.effect_dispatch_once(holder_name="h-rot", account_id=acme.pk) is not None:
        pass
    assert len(receiver.requests) == 3
    assert {r["auth"] for r in receiver.requests} == {f"Bearer {demo_secret(frozen.generation_id)}"}
    assert set(RemoteEffectAttempt.objects.values_list("credential_generation_id", flat=True)) == {frozen.pk}


@pytest.mark.django_db
def test_destroyed_frozen_secret_version_quarantines_and_never_falls_forward(push_world, receiver):
    """If the frozen generation's exact secret version is gone (even though a newer generation of the same
    credential exists), the claim quarantines the effect with CREDENTIAL_MATERIAL_MISSING: no attempt, no
    request, the binding unchanged, and it is never claimed again. Proves: CV2-10-013, CV2-04-011"""
    acme = push_world.accounts[0]
    command = author(acme)
    frozen = outbound_generation(acme)
    _rotate(acme)
    secret_backend().destroy(frozen.secret_version_ref)
    _, c = claim("h-q", acme)
    assert c is None
    effect = RemoteEffect.objects.get(command=command)
    assert (effect.state, effect.quarantine_reason) == ("quarantined", "CREDENTIAL_MATERIAL_MISSING")
    assert RemoteEffectAttempt.objects.count() == 0 and receiver.requests == []
    assert OutboundCommand.objects.get(pk=command.pk).credential_generation_id == frozen.pk
    assert claim("h-q", acme)[1] is None
    assert RemoteEffect.objects.get(pk=effect.pk).state == "quarantined"
