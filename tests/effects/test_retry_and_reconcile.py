"""Attempt outcomes against a real loopback receiver: proven no effect retries only within the frozen policy and
then is terminal; ambiguity makes the effect `uncertain` and stops automatic retry; reconciliation repeats
byte-identically under the same provider key, or finalizes from evidence without calling the provider again;
RemoteLink conflicts fail closed."""
from __future__ import annotations

import time

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from effects.errors import ReconcileRefused
from effects.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt, RemoteLink
from effects.services import dispatch, worker
from tests.effects.helpers import (
    ACTOR,
    SimulatedCrash,
    author,
    build_keyless_push_world,
    crash_at,
    refused_by,
)
from tests.support import scaled


@pytest.fixture
def keyless_push_world(db, monkeypatch):
    return build_keyless_push_world(monkeypatch)


def _dispatch(account):
    """One worker step for the account: claim, permit, send, finalize if confirmed."""
    return worker.effect_dispatch_once(holder_name="h-worker", account_id=account.pk)


def _reconcile(effect_pk: int, decision: str, **kw) -> RemoteEffect:
    """A decision made on the effect as it is now (its current changed_at is the state token)."""
    kw.setdefault("expected_changed_at", RemoteEffect.objects.get(pk=effect_pk).changed_at)
    return dispatch.effect_reconcile(effect_pk=effect_pk, decision=decision, actor=ACTOR,
                                     evidence=f"operator checked the provider console: {decision}", **kw)


def _outcomes(effect_pk: int) -> list[tuple[int, str]]:
    return list(RemoteEffectAttempt.objects.filter(effect_id=effect_pk).order_by("ordinal")
                .values_list("ordinal", "outcome"))


@pytest.mark.django_db
def test_refusal_is_no_effect_retried_within_policy_then_terminal_and_never_reopened(push_world, receiver):
    """A 422 refusal proves no effect: the attempt records `no_effect` and the effect returns to `prepared`
    while attempts < max_attempts (3, frozen), then becomes terminal `no_effect`; nothing claims, reconciles or
    (in PostgreSQL) reopens it, and the receiver saw exactly max_attempts requests and applied nothing.
    Proves: CV2-10-021, CV2-10-022, CV2-10-028, CV2-10-050, CV2-10-056"""
    acme = push_world.accounts[0]
    command = author(acme)
    receiver.default_mode = "refuse"
    states = [_dispatch(acme).state for _ in range(command.max_attempts)]
    assert command.max_attempts == 3 and states == ["prepared", "prepared", "no_effect"]
    effect = RemoteEffect.objects.get(command=command)
    assert _outcomes(effect.pk) == [(1, "no_effect"), (2, "no_effect"), (3, "no_effect")]
    assert set(RemoteEffectAttempt.objects.values_list("response_status", flat=True)) == {422}
    assert list(DispatchPermit.objects.values_list("state", flat=True)) == ["returned"] * 3

    assert _dispatch(acme) is None
    assert worker.effects_sweep()["claimable"] == 0
    for decision in dispatch.RECONCILE_DECISIONS:
        with pytest.raises(ReconcileRefused):
            _reconcile(effect.pk, decision)
    assert refused_by("UPDATE effects_remoteeffect SET state = 'prepared' WHERE id = %s",
                      [effect.pk]) == "effects_remoteeffect_transition"
    assert RemoteEffect.objects.get(pk=effect.pk).state == "no_effect"
    assert len(receiver.requests) == 3 and receiver.applied_total() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["apply_5xx", "hang", "apply_drop"])
def test_ambiguous_outcome_is_uncertain_and_automatic_retry_stops(push_world, receiver, mode, settings):
    """When the receiver may have applied the request but the answer proves nothing (a 500 after applying, no
    answer within the client timeout, a dropped connection), the attempt and effect become `uncertain`, the
    permit returns, and no claim ever picks the effect again: one request in total.
    Proves: CV2-10-020, CV2-10-041, CV2-10-051, CV2-10-058"""
    acme = push_world.accounts[0]
    command = author(acme)
    receiver.default_mode = mode
    timeout = settings.CONNECTOR["EGRESS_TIMEOUT_SECONDS"]  # 1 s stretched by the suite's time factor
    receiver.hang_seconds = timeout + 0.5
    started = time.monotonic()
    effect = _dispatch(acme)
    assert time.monotonic() - started < timeout + scaled(4)
    assert effect.state == "uncertain"
    assert _outcomes(effect.pk) == [(1, "uncertain")]
    assert DispatchPermit.objects.get().state == "returned"
    for _ in range(2):
        assert _dispatch(acme) is None
    assert worker.effects_sweep()["claimable"] == 0
    assert RemoteEffect.objects.get(command=command).state == "uncertain"
    assert len(receiver.requests) == 1 and receiver.applied_total() == 1


@pytest.mark.django_db
def test_idempotent_repeat_reuses_the_exact_bytes_and_provider_key_and_keeps_the_uncertain_attempt(
        push_world, receiver):
    """Reconciling an `uncertain` effect as an idempotent repeat returns it to `prepared`; the next attempt sends
    byte-identical request bytes with the same frozen provider idempotency key, the first attempt keeps its
    `uncertain` outcome and evidence unchanged, and the receiver applied the logical effect once.
    Proves: CV2-10-008, CV2-10-026, CV2-10-029, CV2-10-057"""
    acme = push_world.accounts[0]
    command = author(acme)
    receiver.modes = ["apply_5xx"]
    effect = _dispatch(acme)
    assert effect.state == "uncertain"
    first = RemoteEffectAttempt.objects.get(effect=effect, ordinal=1)
    before = (first.outcome, first.response_status, first.evidence, first.settled_at, bytes(first.request_digest))

    assert _reconcile(effect.pk, "idempotent_repeat").state == "prepared"
    assert _dispatch(acme).state == "finalized"

    one, two = receiver.requests
    assert one["body"] == two["body"] == bytes(command.request_body)
    assert one["key"] == two["key"] == command.provider_idempotency_key
    assert one["path"] == two["path"] == command.path
    assert receiver.applied == {command.provider_idempotency_key: 1}
    first.refresh_from_db()
    assert before[:2] == ("uncertain", 500)
    assert (first.outcome, first.response_status, first.evidence, first.settled_at,
            bytes(first.request_digest)) == before
    second = RemoteEffectAttempt.objects.get(effect=effect, ordinal=2)
    assert (second.outcome, second.provider_idempotency_key, bytes(second.request_digest)) == (
        "remote_confirmed", command.provider_idempotency_key, bytes(command.request_digest))


@pytest.mark.django_db
def test_idempotent_repeat_without_a_frozen_provider_key_is_refused(keyless_push_world, receiver):
    """Without a frozen provider idempotency contract an exact repeat is not provably safe: the reconciliation
    is refused, the effect stays `uncertain` and nothing is sent again. Proves: CV2-10-029, CV2-10-051"""
    acme = keyless_push_world.accounts[0]
    author(acme)
    receiver.modes = ["apply_5xx"]
    effect = _dispatch(acme)
    assert effect.state == "uncertain" and receiver.requests[0]["key"] == effect.command.path  # no key header
    with pytest.raises(ReconcileRefused, match="idempotency"):
        _reconcile(effect.pk, "idempotent_repeat")
    assert RemoteEffect.objects.get(pk=effect.pk).state == "uncertain"
    assert _dispatch(acme) is None and len(receiver.requests) == 1


@pytest.mark.django_db
def test_reconciled_no_effect_retries_within_policy_and_is_terminal_after(push_world, receiver):
    """Reconciliation proving no effect on an `uncertain` effect returns it to `prepared` while the frozen policy
    permits another attempt, and makes it terminal `no_effect` once attempts are exhausted.
    Proves: CV2-10-024, CV2-10-026, CV2-10-050, CV2-10-056"""
    acme = push_world.accounts[0]
    author(acme)
    receiver.modes = ["fail_before", "refuse", "fail_before"]
    effect = _dispatch(acme)
    assert effect.state == "uncertain"  # a 503 proves nothing by itself
    assert _reconcile(effect.pk, "no_effect").state == "prepared"
    assert _dispatch(acme).state == "prepared"  # attempt 2: refused, proven no effect
    assert _dispatch(acme).state == "uncertain"  # attempt 3 of 3
    assert _reconcile(effect.pk, "no_effect").state == "no_effect"
    assert _dispatch(acme) is None and len(receiver.requests) == 3
    assert _outcomes(effect.pk) == [(1, "uncertain"), (2, "no_effect"), (3, "uncertain")]


@pytest.mark.django_db
def test_proven_remote_success_finalizes_without_calling_the_provider_again(push_world, receiver, monkeypatch):
    """Remote success proven by reconciliation of an `uncertain` effect, or recorded by the adapter just before
    the worker crashed, is finalized by the sweep from attempt evidence: no new request reaches the receiver and
    the effect is never redispatched. Proves: CV2-10-023, CV2-10-027, CV2-10-030, CV2-10-052, CV2-10-058"""
    acme = push_world.accounts[0]
    author(acme, root="order-reconciled", record_id="r1")
    receiver.modes = ["apply_5xx"]
    reconciled = _dispatch(acme)
    assert _reconcile(reconciled.pk, "remote_confirmed", remote_id="remote-from-console").state == "remote_confirmed"

    author(acme, root="order-crashed", record_id="r2")
    # the finalization inside the settlement's transaction fails (its savepoint rolls back, D-336), the
    # settlement commits `remote_confirmed`, then the worker crashes before its own finalization retry
    monkeypatch.setenv("CONNECTOR_FAULT_RAISE", "dispatch.finalize_in_settlement")
    crash_at(monkeypatch, worker, "dispatch.after_confirmed")
    with pytest.raises(SimulatedCrash):
        _dispatch(acme)
    crashed = RemoteEffect.objects.get(command__effect_root_id="order-crashed")
    assert crashed.state == "remote_confirmed"
    monkeypatch.undo()
    assert len(receiver.requests) == 2

    assert worker.effects_sweep()["finalized"] == 2
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {"finalized"}
    assert _dispatch(acme) is None and len(receiver.requests) == 2
    assert set(RemoteLink.objects.values_list("owner_slot", "remote_identity")) == {
        ("r1", "remote-from-console"), ("r2", crashed.remote_id)}


def _confirmed_uncertain(account, *, root: str, record_id: str, remote_id: str) -> RemoteEffect:
    """An effect whose request answered 500, then reconciled as confirmed with the given remote identity."""
    author(account, root=root, record_id=record_id)
    return _reconcile(_dispatch(account).pk, "remote_confirmed", remote_id=remote_id)


@pytest.mark.django_db
def test_remote_link_conflicts_fail_closed(push_world, receiver):
    """Finalizing an effect whose proven remote identity is already actively linked to another owner slot, or
    whose owner slot is already linked to another remote identity, is refused (ReconcileRefused): the effect
    stays `remote_confirmed`, no link is written, the existing link is untouched and the provider is not called.
    Proves: CV2-10-045, CV2-10-059 (conflicts fail closed), CV2-15-022"""
    acme = push_world.accounts[0]
    author(acme, root="order-a", record_id="r1")
    a = _dispatch(acme)
    assert a.state == "finalized"
    link = RemoteLink.objects.get()
    assert (link.owner_slot, link.remote_identity, link.effect_id) == ("r1", a.remote_id, a.pk)

    receiver.modes = ["apply_5xx", "apply_5xx"]
    same_remote = _confirmed_uncertain(acme, root="order-b", record_id="r2", remote_id=a.remote_id)
    same_slot = _confirmed_uncertain(acme, root="order-c", record_id="r1", remote_id="remote-other")
    for effect, slot in ((same_remote, "r2"), (same_slot, "r1")):
        with pytest.raises(ReconcileRefused, match="linked elsewhere"):
            dispatch.effect_finalize(effect_pk=effect.pk, owner_slot=slot)
        assert RemoteEffect.objects.get(pk=effect.pk).state == "remote_confirmed"
    assert list(RemoteLink.objects.values_list("pk", "state")) == [(link.pk, "active")]
    assert len(receiver.requests) == 3


@pytest.mark.django_db
def test_remote_link_uniqueness_is_enforced_by_postgres(push_world, receiver):
    """Around the services, PostgreSQL refuses a second active link for one remote identity or one owner slot
    of the account; a retired link no longer blocks. Proves: CV2-15-022"""
    acme = push_world.accounts[0]
    author(acme)
    effect = _dispatch(acme)
    link = RemoteLink.objects.get()
    for slot, remote, constraint in (("r9", link.remote_identity, "effects_link_one_active_per_remote"),
                                     (link.owner_slot, "remote-9", "effects_link_one_active_per_slot")):
        with pytest.raises(IntegrityError) as info, transaction.atomic():
            RemoteLink.objects.create(account=acme, owner_slot=slot, remote_identity=remote, effect=effect)
        assert info.value.__cause__.diag.constraint_name == constraint
    link.retire(at=timezone.now())
    link.save()
    RemoteLink.objects.create(account=acme, owner_slot=link.owner_slot, remote_identity=link.remote_identity,
                              effect=effect)
    assert RemoteLink.objects.filter(state="active").count() == 1


@pytest.mark.django_db
def test_remote_link_conflict_is_durably_marked_for_the_operator(push_world, receiver):
    """A refused finalization because of a RemoteLink conflict durably marks the effect REMOTE_LINK_CONFLICT
    (held for an operator), so the sweep stops retrying it. Proves: CV2-10-059"""
    acme = push_world.accounts[0]
    author(acme, root="order-a", record_id="r1")
    a = _dispatch(acme)
    receiver.modes = ["apply_5xx"]
    b = _confirmed_uncertain(acme, root="order-b", record_id="r2", remote_id=a.remote_id)
    with pytest.raises(ReconcileRefused):
        dispatch.effect_finalize(effect_pk=b.pk, owner_slot="r2")
    assert RemoteEffect.objects.get(pk=b.pk).quarantine_reason == "REMOTE_LINK_CONFLICT"
