"""DispatchPermit acquisition, the open-permit set and halting, credential revocation racing acquisition and
`granted -> sending`, re-enablement fences, and abandonment, which needs durable proof and never follows from
elapsed time. Race tests use real threads on separate PostgreSQL connections."""
from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from connector.errors import GateNotServing, TransitionRefused
from connector.models import AccountServingGate, AuditRecord, CredentialGenerationDispatchGate
from effects import egress
from effects import egress_batch
from effects import locks as effect_locks
from effects.errors import AbandonRefused, EgressRefused, PermitRefused
from effects.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt
from effects.services import dispatch, worker
from tests.concurrency import start, wait_until
from tests.effects.helpers import (
    ACTOR,
    Gate,
    SimulatedCrash,
    acquire,
    author,
    build_push_world,
    claim,
    crash_at,
    force,
    gate_action,
    outbound_generation,
    reenable,
    revoke,
    send,
    waiting_here,
)
from tests.support import scaled


@pytest.fixture
def tx_push_world(transactional_db):
    return build_push_world()

SERVING_FENCE = 6  # the demo world's gate fence once v2_serving


def _open_permits(account) -> list[int]:
    return list(DispatchPermit.objects.filter(gate__account=account, state__in=("granted", "sending"))
                .values_list("pk", flat=True))


def _gate(account) -> AccountServingGate:
    return AccountServingGate.objects.get(account=account)


def _effect(ready) -> RemoteEffect:
    return RemoteEffect.objects.get(pk=ready.claim.effect_pk)


def _permit(ready) -> DispatchPermit:
    return DispatchPermit.objects.get(pk=ready.permit.pk)


def _paused(fn, pause: Gate):
    """Run `fn` inside a transaction that stays open (its locks held) until the test releases `pause`."""
    def run():
        with transaction.atomic():
            result = fn()
            pause.pause()
            return result
    return run


def _assert_waits(thread) -> None:
    assert wait_until(lambda: waiting_here() >= 1), f"{thread.name} never waited for the lock"
    assert thread.is_alive()


# -- acquisition ----------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_acquisition_grants_one_permit_moves_the_effect_to_dispatching_and_joins_the_open_set(push_world):
    """A claim alone authorizes nothing (the effect stays `prepared`, no permit). Acquisition records one
    `granted` permit with no I/O started, binding the account gate and its fence, the exact credential
    generation's dispatch gate and its fence, and the holder and lease fence; the effect is `dispatching` and
    the permit is in the gate's open-permit set. A second acquisition for the effect is refused and no other
    holder can claim it. Proves: CV2-10-031, CV2-10-037, CV2-04-006, CV2-15-021"""
    acme = push_world.accounts[0]
    command = author(acme)
    holder, c = claim("h-acq", acme)
    assert RemoteEffect.objects.get(pk=c.effect_pk).state == "prepared"
    assert DispatchPermit.objects.count() == 0

    permit = dispatch.permit_acquire(claim=c)
    credential_gate = CredentialGenerationDispatchGate.objects.get(credential_generation=command.credential_generation)
    assert (permit.state, permit.io_may_have_started, permit.attempt_id, permit.effect_id) == (
        "granted", False, c.attempt_pk, c.effect_pk)
    assert (permit.gate_id, permit.gate_fence) == (_gate(acme).pk, SERVING_FENCE)
    assert (permit.credential_gate_id, permit.credential_gate_fence) == (credential_gate.pk, credential_gate.fence)
    assert (permit.holder_id, permit.holder_fence) == (holder.pk, c.lease_fence)
    assert RemoteEffect.objects.get(pk=c.effect_pk).state == "dispatching"
    assert _open_permits(acme) == [permit.pk]
    assert dispatch.open_permit_reasons(_gate(acme)) != []

    with pytest.raises(PermitRefused):
        dispatch.permit_acquire(claim=c)
    assert claim("h-other", acme)[1] is None
    assert DispatchPermit.objects.count() == 1 and RemoteEffectAttempt.objects.count() == 1


# -- halting ----------------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_open_permit_blocks_v2_halted_until_it_settles(push_world, receiver):
    """With a `granted` permit open, `v2_serving -> halting_v2` commits but `halting_v2 -> v2_halted` is refused
    naming the open permit set, however long it waits; in `halting_v2` no new claim or permit is possible, while
    the open permit still makes its one call and settles; then `v2_halted` commits. The permit settles under its
    own permit and holder fences although the gate's fence moved past the one it was granted under (a stale gate
    token is not what settlement checks). Proves: CV2-03-010, CV2-10-040, CV2-11-004, CV2-11-007, CV2-11-008,
    CV2-11-048, CV2-03-018"""
    acme = push_world.accounts[0]
    author(acme, root="order-1")
    ready = acquire("h-halt", acme)
    author(acme, root="order-2")
    gate_action(acme, "halt_v2")
    force("UPDATE effects_dispatchpermit SET granted_at = now() - interval '30 days' WHERE id = %s",
          [ready.permit.pk])
    with pytest.raises(TransitionRefused, match="open dispatch permit"):
        gate_action(acme, "confirm_halted")
    assert _gate(acme).mode == "halting_v2"
    assert claim("h-halt", acme)[1] is None  # the second effect is not claimable while halting
    assert _permit(ready).gate_fence < _gate(acme).fence  # the gate drains its open-permit set on a new fence

    effect = send(ready)
    assert effect.state == "finalized" and len(receiver.requests) == 1
    assert _permit(ready).state == "returned" and _open_permits(acme) == []
    assert gate_action(acme, "confirm_halted").mode == "v2_halted"
    assert RemoteEffect.objects.get(command__effect_root_id="order-2").state == "prepared"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("order", ["acquisition_first", "halt_first", "unsynchronized"])
def test_halt_racing_acquisition_never_grants_a_permit_after_halting(tx_push_world, order):
    """Acquisition and `v2_serving -> halting_v2` serialize on the gate row. Acquisition first: the halt waits,
    then commits, the permit carries the pre-halt fence and keeps the gate `halting_v2` until holder isolation
    abandons it. Halt first: the acquisition waits, then sees `halting_v2` and writes nothing. Released together:
    one of those two outcomes, never a permit granted under the halting fence.
    Proves: CV2-11-004, CV2-11-007, CV2-11-008, CV2-11-054, CV2-15-024"""
    acme = tx_push_world.accounts[0]
    author(acme)
    _, c = claim("h-race", acme)

    def acquire_fn():
        return dispatch.permit_acquire(claim=c)

    def halt_fn():
        return gate_action(acme, "halt_v2")

    if order == "acquisition_first":
        pause = Gate()
        acquirer = start(_paused(acquire_fn, pause), "acquirer")
        assert pause.reached.wait(scaled(10))
        halter = start(halt_fn, "halter")
        _assert_waits(halter)
        pause.go.set()
    elif order == "halt_first":
        pause = Gate()
        halter = start(_paused(halt_fn, pause), "halter")
        assert pause.reached.wait(scaled(10))
        acquirer = start(acquire_fn, "acquirer")
        _assert_waits(acquirer)
        pause.go.set()
    else:
        barrier = threading.Barrier(2)
        acquirer = start(lambda: (barrier.wait(scaled(5)), acquire_fn())[1], "acquirer")
        halter = start(lambda: (barrier.wait(scaled(5)), halt_fn())[1], "halter")
    acquirer.join(scaled(15))
    halter.join(scaled(15))
    assert halter.error is None, halter.error
    gate = _gate(acme)
    assert (gate.mode, gate.fence) == ("halting_v2", SERVING_FENCE + 1)
    permits = list(DispatchPermit.objects.all())
    if acquirer.error is None:
        assert order != "halt_first"
        assert [(p.state, p.gate_fence) for p in permits] == [("granted", SERVING_FENCE)]
        with pytest.raises(TransitionRefused, match="open dispatch permit"):
            gate_action(acme, "confirm_halted")
        dispatch.holder_terminate(holder_id="h-race", evidence="supervisor: generation stopped, egress cut",
                                  actor=ACTOR)
        assert dispatch.permit_abandon(permit_pk=permits[0].pk, actor=ACTOR).state == "prepared"
    else:
        assert order != "acquisition_first"
        assert isinstance(acquirer.error, GateNotServing), acquirer.error
        assert permits == [] and RemoteEffect.objects.get().state == "prepared"
    assert gate_action(acme, "confirm_halted").mode == "v2_halted"


# -- credential revocation ------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("order", ["revocation_first", "acquisition_first"])
def test_revocation_racing_acquisition(tx_push_world, receiver, order):
    """Acquisition and revocation serialize on the exact credential dispatch gate. Revocation first: the
    acquisition waits, then is refused and writes no permit. Acquisition first: revocation waits, then commits a
    new fence; the permit keeps the old fence, the egress adapter refuses it before any byte (the receiver sees no
    request), and it is abandoned without holder isolation (the fence mismatch is the proof, decision 5), the
    effect back to `prepared`. Proves: CV2-04-006, CV2-04-007, CV2-04-009, CV2-04-012, CV2-04-013, CV2-15-024"""
    acme = tx_push_world.accounts[0]
    author(acme)
    generation = outbound_generation(acme)
    _, c = claim("h-rev", acme)

    def acquire_fn():
        return dispatch.permit_acquire(claim=c)

    def revoke_fn():
        return revoke(generation.generation_id, fence=1)

    pause = Gate()
    if order == "revocation_first":
        first, second = start(_paused(revoke_fn, pause), "revoker"), None
        assert pause.reached.wait(scaled(10))
        second = start(acquire_fn, "acquirer")
    else:
        first = start(_paused(acquire_fn, pause), "acquirer")
        assert pause.reached.wait(scaled(10))
        second = start(revoke_fn, "revoker")
    _assert_waits(second)
    pause.go.set()
    first.join(scaled(15))
    second.join(scaled(15))
    assert first.error is None, first.error
    credential_gate = CredentialGenerationDispatchGate.objects.get(credential_generation=generation)
    assert (credential_gate.mode, credential_gate.fence) == ("revoked", 2)
    if order == "revocation_first":
        assert isinstance(second.error, PermitRefused), second.error
        assert DispatchPermit.objects.count() == 0
        assert RemoteEffect.objects.get().state == "prepared"
    else:
        assert second.error is None, second.error
        permit = DispatchPermit.objects.get()
        assert (permit.state, permit.credential_gate_fence) == ("granted", 1)
        with pytest.raises(EgressRefused, match="revoked"):
            egress_batch.send(permit_pk=permit.pk, holder_id="h-rev", holder_fence=permit.holder_fence,
                        credential_gate_fence=permit.credential_gate_fence)
        assert DispatchPermit.objects.get().state == "granted"
        effect = dispatch.permit_abandon(permit_pk=permit.pk, actor=ACTOR)
        assert effect.state == "prepared"
        assert DispatchPermit.objects.get().state == "abandoned"
        assert RemoteEffectAttempt.objects.get().outcome == "no_effect"
        assert dispatch.holder_register(holder_id="h-rev").state == "running"  # no isolation was needed
    assert receiver.requests == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("order", ["revocation_first", "sending_first"])
def test_revocation_racing_granted_to_sending(tx_push_world, receiver, monkeypatch, order):
    """The adapter's `granted -> sending` compare-and-swap and revocation serialize on the exact credential
    dispatch gate. Revocation first: the adapter waits, then refuses; no request reaches the receiver and the
    permit is abandoned without holder isolation (decision 5). Sending first: revocation waits for the swap,
    then commits at once (decision 4); the one authorized request reaches the receiver exactly once and settles.
    Proves: CV2-04-008, CV2-04-009, CV2-04-012, CV2-04-013, CV2-10-038, CV2-15-024"""
    acme = tx_push_world.accounts[0]
    author(acme)
    generation = outbound_generation(acme)
    ready = acquire("h-send", acme)

    def revoke_fn():
        return revoke(generation.generation_id, fence=1)

    pause = Gate()
    if order == "revocation_first":
        revoker = start(_paused(revoke_fn, pause), "revoker")
        assert pause.reached.wait(scaled(10))
        sender = start(lambda: send(ready), "sender")
        _assert_waits(sender)
        pause.go.set()
    else:
        original = effect_locks.permits_for_update

        def permits_for_update(pks, **kwargs):
            # Inside the adapter's marker transaction, after it locked the credential gate: pause once.
            rows = original(pks, **kwargs)
            if threading.current_thread().name == "sender" and not pause.reached.is_set():
                pause.pause()
            return rows

        monkeypatch.setattr(effect_locks, "permits_for_update", permits_for_update)
        sender = start(lambda: send(ready), "sender")
        assert pause.reached.wait(scaled(10))
        revoker = start(revoke_fn, "revoker")
        _assert_waits(revoker)
        pause.go.set()
    sender.join(scaled(15))
    revoker.join(scaled(15))
    assert revoker.error is None, revoker.error
    credential_gate = CredentialGenerationDispatchGate.objects.get(credential_generation=generation)
    assert (credential_gate.mode, credential_gate.fence) == ("revoked", 2)
    permit = _permit(ready)
    if order == "revocation_first":
        assert isinstance(sender.error, EgressRefused), sender.error
        assert receiver.requests == [] and permit.state == "granted" and not permit.io_may_have_started
        assert dispatch.permit_abandon(permit_pk=permit.pk, actor=ACTOR).state == "prepared"
    else:
        assert sender.error is None, sender.error
        assert len(receiver.requests) == 1 and receiver.applied_total() == 1
        assert (permit.state, permit.io_may_have_started) == ("returned", True)
        assert _effect(ready).state == "finalized"
        revoked_at = AuditRecord.objects.get(action="credential_gate_revoke").at
        assert permit.sending_at <= revoked_at
    assert _open_permits(acme) == []


@pytest.mark.django_db
def test_revocation_record_lists_the_permits_already_sending(push_world, receiver, monkeypatch):
    """A revocation committed while a permit is `sending` lists that permit in its record, so an operator can
    see which calls were still authorized and when they settled (decision 4). Proves: CV2-04-009"""
    acme = push_world.accounts[0]
    author(acme)
    generation = outbound_generation(acme)
    ready = acquire("h-rec", acme)
    original = egress_batch.fault_point

    def revoke_while_sending(name):
        if name == "egress.after_sending":
            revoke(generation.generation_id)
        original(name)

    monkeypatch.setattr(egress_batch, "fault_point", revoke_while_sending)
    assert send(ready).state == "finalized" and len(receiver.requests) == 1
    record = AuditRecord.objects.get(action="credential_gate_revoke")
    assert "permit" in record.reason and str(ready.permit.pk) in record.reason


@pytest.mark.django_db
def test_reenablement_uses_a_new_fence_and_the_stale_permit_never_revives(push_world, receiver):
    """After revoke (new fence) and explicit re-enablement (another new fence) the stale permit is refused by
    the adapter with its old fence and with the current one, is abandoned without holder isolation and stays
    abandoned; its attempt stays `no_effect`. A new claim acquires a permit under the re-enabled fence and makes
    the one request. Proves: CV2-04-010, CV2-04-013, CV2-10-039"""
    acme = push_world.accounts[0]
    author(acme)
    generation = outbound_generation(acme)
    stale = acquire("h-re", acme)
    assert stale.permit.credential_gate_fence == 1
    revoke(generation.generation_id, fence=1)
    assert reenable(generation.generation_id, fence=2).fence == 3
    for fence in (1, 3):
        with pytest.raises(EgressRefused):
            send(stale, credential_gate_fence=fence)
    assert receiver.requests == [] and _permit(stale).state == "granted"
    assert dispatch.permit_abandon(permit_pk=stale.permit.pk, actor=ACTOR).state == "prepared"
    for fence in (1, 3):
        with pytest.raises(EgressRefused, match="abandoned"):
            send(stale, credential_gate_fence=fence)
    fresh = acquire("h-re", acme)
    assert fresh.permit.credential_gate_fence == 3 and fresh.claim.attempt_pk != stale.claim.attempt_pk
    assert send(fresh).state == "finalized"
    assert len(receiver.requests) == 1
    assert _permit(stale).state == "abandoned"
    assert RemoteEffectAttempt.objects.get(pk=stale.claim.attempt_pk).outcome == "no_effect"


# -- abandonment needs proof, never elapsed time ------------------------------------------------------------

def _age(ready, days: int = 365) -> None:
    """Make the permit, its attempt lease and the effect lease look ancient (set up with triggers off)."""
    past = timezone.now() - timedelta(days=days)
    force("UPDATE effects_dispatchpermit SET granted_at = %s, sending_at = CASE WHEN sending_at IS NULL THEN NULL "
          "ELSE %s END WHERE id = %s", [past, past, ready.permit.pk])
    force("UPDATE effects_remoteeffectattempt SET claimed_at = %s, lease_expires_at = %s WHERE id = %s",
          [past, past, ready.claim.attempt_pk])
    force("UPDATE effects_remoteeffect SET lease_expires_at = %s WHERE id = %s", [past, ready.claim.effect_pk])


@pytest.mark.django_db
@pytest.mark.parametrize("state,effect_after", [("granted", "prepared"), ("sending", "uncertain")])
def test_permit_never_closes_because_time_passed(push_world, receiver, monkeypatch, state, effect_after):
    """A permit whose lease expired a year ago stays open while its holder runs: abandonment is refused, no
    sweep or other holder touches the effect, and the gate cannot reach `v2_halted`. Only after the holder's
    termination (with evidence) does it abandon: `granted` returns the effect to `prepared` (proven no I/O, then
    reclaimable), `sending` makes it `uncertain` (never reclaimed automatically).
    Proves: CV2-10-040, CV2-10-042, CV2-10-043, CV2-10-049, CV2-10-055, CV2-11-008"""
    acme = push_world.accounts[0]
    author(acme)
    ready = acquire("h-old", acme)
    if state == "sending":
        crash_at(monkeypatch, egress_batch, "egress.after_sending")
        with pytest.raises(SimulatedCrash):
            send(ready)
    permit = _permit(ready)
    assert (permit.state, permit.io_may_have_started) == (state, state == "sending")
    _age(ready)

    with pytest.raises(AbandonRefused):
        dispatch.permit_abandon(permit_pk=permit.pk, actor=ACTOR)
    worker.effects_sweep()
    assert worker.effect_dispatch_once(holder_name="h-young", account_id=acme.pk) is None
    gate_action(acme, "halt_v2")
    with pytest.raises(TransitionRefused, match="open dispatch permit"):
        gate_action(acme, "confirm_halted")
    assert (_permit(ready).state, _effect(ready).state) == (state, "dispatching")
    with pytest.raises(AbandonRefused, match="evidence"):
        dispatch.holder_terminate(holder_id="h-old", evidence=" ", actor=ACTOR)
    with pytest.raises(AbandonRefused):
        dispatch.permit_abandon(permit_pk=permit.pk, actor=ACTOR)

    dispatch.holder_terminate(holder_id="h-old", evidence="supervisor: pid 4242 exited; egress rule removed",
                              actor=ACTOR)
    effect = dispatch.permit_abandon(permit_pk=permit.pk, actor=ACTOR)
    assert effect.state == effect_after
    permit = _permit(ready)
    assert permit.state == "abandoned" and "terminated" in permit.abandonment_proof
    assert RemoteEffectAttempt.objects.get(pk=ready.claim.attempt_pk).outcome == (
        "no_effect" if state == "granted" else "uncertain")
    assert gate_action(acme, "confirm_halted").mode == "v2_halted"
    assert receiver.requests == []


@pytest.mark.django_db
def test_granted_abandonment_is_reclaimable_and_sending_abandonment_is_not(push_world, receiver, monkeypatch):
    """After isolation, the effect of an abandoned `granted` permit is claimed again by another holder (a new
    attempt); when that holder dies after `granted -> sending` and is isolated, the effect is `uncertain` and no
    holder ever claims it again. Proves: CV2-10-042, CV2-10-055"""
    acme = push_world.accounts[0]
    author(acme)
    first = acquire("h-a", acme)
    dispatch.holder_terminate(holder_id="h-a", evidence="supervisor: generation stopped", actor=ACTOR)
    assert dispatch.permit_abandon(permit_pk=first.permit.pk, actor=ACTOR).state == "prepared"

    second = acquire("h-b", acme)
    assert (second.claim.effect_pk, RemoteEffectAttempt.objects.get(pk=second.claim.attempt_pk).ordinal) == (
        first.claim.effect_pk, 2)
    crash_at(monkeypatch, egress_batch, "egress.after_sending")
    with pytest.raises(SimulatedCrash):
        send(second)
    monkeypatch.undo()
    dispatch.holder_terminate(holder_id="h-b", evidence="supervisor: generation stopped", actor=ACTOR)
    assert dispatch.permit_abandon(permit_pk=second.permit.pk, actor=ACTOR).state == "uncertain"
    assert worker.effect_dispatch_once(holder_name="h-c", account_id=acme.pk) is None
    assert _effect(second).state == "uncertain" and receiver.requests == []
    assert list(RemoteEffectAttempt.objects.order_by("ordinal").values_list("outcome", flat=True)) == [
        "no_effect", "uncertain"]


@pytest.mark.django_db
def test_crash_before_acquisition_is_reclaimed_after_the_lease_expires(push_world, receiver):
    """A worker that claimed but died before acquiring a permit started no I/O: while its lease runs nobody else
    claims the effect; once the lease expires another holder reclaims the still-`prepared` effect with a new
    attempt and lease fence, the dead worker's stale claim can no longer acquire, and the new holder sends once.
    Proves: CV2-10-048, CV2-10-055"""
    acme = push_world.accounts[0]
    author(acme)
    _, stale = claim("h-crashed", acme)
    assert claim("h-next", acme)[1] is None
    RemoteEffect.objects.filter(pk=stale.effect_pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    _, fresh = claim("h-next", acme)
    assert (fresh.effect_pk, fresh.lease_fence) == (stale.effect_pk, stale.lease_fence + 1)
    assert RemoteEffect.objects.get(pk=fresh.effect_pk).state == "prepared"
    with pytest.raises(PermitRefused):
        dispatch.permit_acquire(claim=stale)
    permit = dispatch.permit_acquire(claim=fresh)
    effect = egress_batch.send(permit_pk=permit.pk, holder_id="h-next", holder_fence=permit.holder_fence,
                         credential_gate_fence=permit.credential_gate_fence)
    assert effect.state == "finalized" and len(receiver.requests) == 1
    assert list(RemoteEffectAttempt.objects.order_by("ordinal").values_list("ordinal", "outcome")) == [
        (1, ""), (2, "remote_confirmed")]


@pytest.mark.django_db
def test_terminated_holder_never_sends_and_never_registers_again(push_world, receiver):
    """Once a holder generation is terminated, the adapter refuses its granted permit before any byte, it cannot
    acquire with an earlier claim, and the same generation can never register again.
    Proves: CV2-10-038, CV2-10-042"""
    acme = push_world.accounts[0]
    author(acme, root="order-1")
    author(acme, root="order-2")
    ready = acquire("h-dead", acme)
    _, later_claim = claim("h-dead", acme)
    dispatch.holder_terminate(holder_id="h-dead", evidence="supervisor: process exited", actor=ACTOR)
    with pytest.raises(EgressRefused, match="terminated"):
        send(ready)
    with pytest.raises(PermitRefused):
        dispatch.permit_acquire(claim=later_claim)
    with pytest.raises(PermitRefused, match="terminated"):
        dispatch.holder_register(holder_id="h-dead")
    assert receiver.requests == [] and _permit(ready).state == "granted"
    assert dispatch.permit_abandon(permit_pk=ready.permit.pk, actor=ACTOR).state == "prepared"
