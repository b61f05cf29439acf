"""Provider I/O stays disabled between the first activation's commit and its exact readback (CV2-12-071, D-321):
the activation transaction marks the epoch `provider_io_held`; a DispatchPermit acquisition on it is refused with
PROVIDER_IO_NOT_ENABLED and writes nothing; only the readback's own transaction enables it, and V1 is retired at
the `v2_committed` that follows. A coordinator SIGKILLed between the commit and the readback leaves provider I/O
disabled until the resumed coordinator reads the activation back."""
from __future__ import annotations

import pytest
from django.db import IntegrityError, connections, transaction

from connector.models import ServingEpoch
from cutover.choices import DecisionState
from cutover.models import AttemptOutcome, ServiceCutoverAttempt
from cutover.services import decision as decisions
from cutover.services import first_activation as fa
from effects.choices import EffectState
from effects.errors import ProviderIoHeld
from effects.models import DispatchPermit, RemoteEffect
from effects.services import dispatch_batch
from effects.services.worker import effect_dispatch_once
from tests.cutover.v1_world import ACTOR, V1World, approve_activation, to_validating
from tests.effects import helpers

TX = pytest.mark.django_db(databases=["default", "journal"], transaction=True)


pytestmark = pytest.mark.usefixtures("cutover_env")  # tests/cutover/conftest.py


def push_v1_world(prefix: str = "c-") -> V1World:
    """tests.cutover.v1_world.build_v1_world with the push route (an outbound callout) in the packs."""
    from connector.demo import build_owners
    from connector.services import serving
    from v1 import runtime

    owners_world = build_owners(prefix, actor=ACTOR, push=True)
    world = V1World(prefix, accounts=owners_world.accounts, configuration=owners_world.configuration)
    epoch = serving.epoch_prepare_from_owners(epoch_id=f"{prefix}v2-epoch-1",
                                              configuration_generation_id=world.configuration.generation_id,
                                              actor=ACTOR)
    world.epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    world.generation_id = runtime.generation_start(started_by="test").generation_id
    return world


def held_push_world() -> V1World:
    world = push_v1_world()
    world.accept(0, "k1", 1)
    to_validating(world)
    fa.first_activation_acquire(attempt_key="att-1", actor=ACTOR)
    fa.first_activation_hold(attempt_key="att-1", actor=ACTOR)
    approve_activation(world.epoch.epoch_id)
    return world


def refused_and_nothing_written(world: V1World) -> None:
    """An outbound command authored (admission and authoring are open on the serving gates), claimed, and its
    permit acquisition refused with the stable code: no permit, the effect still `prepared`."""
    account = world.accounts[0]
    helpers.author(account, record_id="early")
    effect = RemoteEffect.objects.get(account_id=account.pk)
    holder, claim = helpers.claim("h-early", account)
    assert claim is not None
    before = RemoteEffect.objects.filter(pk=effect.pk).values("state", "changed_at").get()
    with pytest.raises(ProviderIoHeld) as info:
        helpers.dispatch.permit_acquire(claim=claim)
    assert info.value.code == "PROVIDER_IO_NOT_ENABLED"
    assert DispatchPermit.objects.count() == 0
    assert RemoteEffect.objects.filter(pk=effect.pk).values("state", "changed_at").get() == before
    assert before["state"] == EffectState.PREPARED
    # the worker's claim + permit in one transaction (D-347) refuses on the same flag and keeps nothing of its claim
    helpers.author(account, root="order-early-2", record_id="early-2")
    second = RemoteEffect.objects.get(account_id=account.pk, command__effect_root_id="order-early-2")
    holder = helpers.dispatch.holder_register(holder_id="h-early-2")
    with pytest.raises(ProviderIoHeld):
        dispatch_batch.effects_claim_batch(holder=holder, n=1, account_id=account.pk)
    assert effect_dispatch_once(holder_name="h-early-2", account_id=account.pk) is None
    second = RemoteEffect.objects.get(pk=second.pk)
    assert (second.state, second.attempt_count, second.lease_holder, second.lease_expires_at) == (
        EffectState.PREPARED, 0, "", None)
    assert DispatchPermit.objects.count() == 0
    return claim


@TX
def test_a_permit_between_activation_commit_and_readback_is_refused_then_granted_after_it(monkeypatch):
    """After the activation COMMIT (epoch active, every gate v2_serving) and before the readback, a permit
    acquisition on the epoch is refused (PROVIDER_IO_NOT_ENABLED) and writes nothing; the same claim's permit is
    granted once the readback's transaction has enabled provider I/O, and V1 is retired (v2_committed) at the same
    point. Proves: CV2-12-071"""
    from tests.cutover.test_first_activation import stop_after_commit

    world = held_push_world()
    stop_after_commit(monkeypatch)
    epoch = ServingEpoch.objects.get(pk=world.epoch.pk)
    assert epoch.state == "active" and epoch.provider_io_held
    assert ServiceCutoverAttempt.objects.get(attempt_key="att-1").outcome == AttemptOutcome.OPEN  # V1 not retired
    claim = refused_and_nothing_written(world)

    fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert not ServingEpoch.objects.get(pk=world.epoch.pk).provider_io_held
    assert decisions.decision_read("att-1").state == DecisionState.V2_COMMITTED
    assert ServiceCutoverAttempt.objects.get(attempt_key="att-1").outcome == AttemptOutcome.V2_COMMITTED
    permit = helpers.dispatch.permit_acquire(claim=claim)
    assert permit.state == "granted"
    assert RemoteEffect.objects.get(pk=claim.effect_pk).state == EffectState.DISPATCHING


@TX
def test_a_failed_readback_keeps_provider_io_disabled(monkeypatch):
    """A resume whose readback does not see the exact epoch on every gate (one gate's digest damaged) enables
    nothing: the epoch stays `provider_io_held` and a permit is still refused. Proves: CV2-12-071"""
    from tests import dbroles
    from tests.cutover.test_first_activation import stop_after_commit

    from connector.models import AccountServingGate
    from cutover.errors import CutoverPhaseRefused

    world = held_push_world()
    stop_after_commit(monkeypatch)
    gate = AccountServingGate.objects.filter(account__in=world.accounts).order_by("pk").last()
    good = bytes(gate.epoch_digest)
    with connections["default"].cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE connector_accountservinggate SET epoch_digest = %s WHERE id = %s",
                       [bytes([good[0] ^ 1]) + good[1:], gate.pk])
        cursor.execute("SET session_replication_role = origin")
        dbroles.admin_off(cursor)
    with pytest.raises(CutoverPhaseRefused, match="readback"):
        fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert ServingEpoch.objects.get(pk=world.epoch.pk).provider_io_held
    refused_and_nothing_written(world)


@TX
def test_a_coordinator_killed_between_commit_and_readback_leaves_provider_io_disabled_until_recovery(run_child):
    """The coordinator process is SIGKILLed at `activation.after_commit` (committed, not read back): provider I/O
    stays disabled (a permit is refused, nothing written) until the resumed coordinator's readback enables it.
    Proves: CV2-12-071"""
    world = held_push_world()
    child = run_child("""
        from connector.actors import Actor
        from cutover.services import first_activation
        first_activation.first_activation_commit(attempt_key="att-1", actor=Actor.system("coordinator"))
        emit(done=True)
    """, "activation.after_commit")
    assert child.killed, child.stderr
    epoch = ServingEpoch.objects.get(pk=world.epoch.pk)
    assert epoch.state == "active" and epoch.provider_io_held
    claim = refused_and_nothing_written(world)
    fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert helpers.dispatch.permit_acquire(claim=claim).state == "granted"


@TX
def test_provider_io_is_held_only_by_a_first_activation():
    """The database refuses holding provider I/O on any UPDATE but the epoch's `verified -> active` (constraint
    `connector_servingepoch_provider_io_held`): once the readback cleared it, nothing sets it again.
    Proves: CV2-12-071"""
    from tests import dbroles

    world = push_v1_world()
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        with connections["default"].cursor() as cursor:
            dbroles.admin_on(cursor)
            cursor.execute("UPDATE connector_servingepoch SET provider_io_held = true WHERE id = %s",
                           [world.epoch.pk])
    assert info.value.__cause__.diag.constraint_name == "connector_servingepoch_provider_io_held"
