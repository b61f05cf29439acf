"""Crash rows of the batched egress step (issue 20, D-345..D-350), with real process kills: a child process runs
`effect_dispatch_batch` over three effects of one account against the committed test database and dies by SIGKILL
at a named fault point of one of the batch's transactions; the test then recovers as a restarted worker and an
operator would, and counts at the real loopback receiver: 0 duplicated applications, 0 lost effects, and an
effect whose `sending` marker committed is never sent again blindly (only reconciliation decides).

- "dispatch.batch_claim_before_commit": nothing of the claim survives; a new holder dispatches the three at once.
- "dispatch.batch_sending_before_commit": the claim committed (three `granted` permits), no marker, no byte; after
  holder isolation the permits are abandoned as `granted` (proof of no I/O) and the effects go back to `prepared`.
- "egress.after_sending": the three markers committed, no byte sent; after isolation they are abandoned to
  `uncertain`, never redispatched until an operator decides (here: the receiver's log shows no request).
- "dispatch.batch_settle_before_commit": the receiver applied all three, no settlement committed; after isolation
  `uncertain`; an idempotent repeat under the frozen keys lands them with ONE application each.
- "dispatch.withdraw_before_commit" (a limited batch, D-373): the first request answered 429 and its deferral
  committed; the two refused permits' withdrawal did not: they stay `granted`, nothing more was sent; after
  isolation they are abandoned as `granted` and, once the deferral passed, each effect lands once.
"""
from __future__ import annotations

import pytest

from connector.actors import Actor
from connector.models import AuditRecord
from effects.choices import EFFECT_TERMINAL, PERMIT_OPEN, AttemptOutcome, EffectState, HolderState, PermitState
from effects.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt, RemoteLink
from effects.services import dispatch
from effects.services.worker import effect_dispatch_batch
from tests.crash.support import DB, assert_killed
from tests.effects.helpers import author
from tests.crash import egress_fixtures
from tests.effects.receiver import Receiver
from tests.support import scaled

OPERATOR = Actor.system("ob-crash-operator")
DEAD = "ob-crash-child"
RECOVERY = "ob-recovery"

BATCH_SCRIPT = """
from effects.services.worker import effect_dispatch_batch
done = effect_dispatch_batch(n=10, holder_name=ARGS["holder"], account_id=ARGS["account_id"])
emit(effects=[e.pk for e in done])
"""

receiver = egress_fixtures.receiver  # the receiver, and the child's environment pointed at it
child_env = egress_fixtures.child_env


def _three_effects() -> tuple[int, list[RemoteEffect]]:
    from connector.demo import build_world

    account = build_world("ob-", push=True).accounts[0]
    effects = [RemoteEffect.objects.select_related("command").get(
        command=author(account, root=f"order-{i}", record_id=f"r{i}")) for i in range(3)]
    return account.pk, effects


def _crash(run_child, point: str) -> tuple[int, list[RemoteEffect], list[str]]:
    account_id, effects = _three_effects()
    run = run_child(BATCH_SCRIPT, point, account_id=account_id, holder=DEAD)
    assert_killed(run)
    return account_id, effects, [e.command.provider_idempotency_key for e in effects]


def _isolate_dead_holder() -> None:
    holder = dispatch.holder_terminate(holder_id=DEAD, actor=OPERATOR,
                                       evidence="supervisor: child process exited by SIGKILL; egress revoked")
    assert holder.state == HolderState.TERMINATED


def _abandon_all() -> set[str]:
    return {dispatch.permit_abandon(permit_pk=p.pk, actor=OPERATOR).state
            for p in DispatchPermit.objects.filter(state__in=PERMIT_OPEN).order_by("pk")}


def _assert_landed_once(effects: list[RemoteEffect], receiver: Receiver, keys: list[str]) -> None:
    """0 duplicated, 0 lost: every effect finalized with its link, each key applied exactly once."""
    for e in effects:
        e.refresh_from_db()
        assert e.state == EffectState.FINALIZED and e.state in EFFECT_TERMINAL
    assert RemoteLink.objects.filter(effect__in=effects, state="active").count() == len(effects)
    assert receiver.applied == {key: 1 for key in keys}
    assert not DispatchPermit.objects.filter(state__in=PERMIT_OPEN).exists()


@pytest.mark.django_db(**DB)
def test_crash_inside_the_batch_claim_leaves_nothing_and_each_effect_lands_once(run_child, receiver):
    """Killed at "dispatch.batch_claim_before_commit" (three Attempts, leases, permits, audit rows written, not
    committed): nothing survives, no lease to wait out; a new holder's batch lands each effect once.
    Proves: CV2-10-048, CV2-10-055"""
    account_id, effects, keys = _crash(run_child, "dispatch.batch_claim_before_commit")
    assert set(RemoteEffect.objects.values_list("state", "attempt_count", "lease_holder")) == {("prepared", 0, "")}
    assert not DispatchPermit.objects.exists() and not RemoteEffectAttempt.objects.exists()
    assert not AuditRecord.objects.filter(action="permit_acquire").exists()
    assert receiver.requests == []
    done = effect_dispatch_batch(n=10, holder_name=RECOVERY, account_id=account_id)
    assert sorted(e.pk for e in done) == sorted(e.pk for e in effects)
    _assert_landed_once(effects, receiver, keys)
    assert len(receiver.requests) == 3


@pytest.mark.django_db(**DB)
def test_crash_inside_the_batch_sending_markers_abandons_granted_permits_to_prepared(run_child, receiver):
    """Killed at "dispatch.batch_sending_before_commit": the claim committed (three `granted` permits), the
    markers did not; no byte left. Expiry proves nothing (the dead holder still runs: nothing claimable); after
    holder isolation each `granted` permit is abandoned (no I/O possible), the effects are `prepared` again and a
    new holder lands each once.
    Proves: CV2-10-042, CV2-10-043, CV2-10-055"""
    account_id, effects, keys = _crash(run_child, "dispatch.batch_sending_before_commit")
    assert set(DispatchPermit.objects.values_list("state", "io_may_have_started")) == {(PermitState.GRANTED, False)}
    assert receiver.requests == []
    assert effect_dispatch_batch(n=10, holder_name=RECOVERY, account_id=account_id) == []
    _isolate_dead_holder()
    assert _abandon_all() == {EffectState.PREPARED}
    effect_dispatch_batch(n=10, holder_name=RECOVERY, account_id=account_id)
    _assert_landed_once(effects, receiver, keys)
    assert len(receiver.requests) == 3


@pytest.mark.django_db(**DB)
def test_crash_after_the_batch_sending_markers_is_uncertain_never_sent_blindly(run_child, receiver):
    """Killed at "egress.after_sending" after the batch's markers committed: three `sending` permits, no byte
    sent. After isolation the permits are abandoned to `uncertain` and no worker sends them again; only the
    operator's decision (the receiver's log shows no request: no effect) makes them claimable; each lands once.
    Proves: CV2-10-049, CV2-10-051, CV2-10-055"""
    account_id, effects, keys = _crash(run_child, "egress.after_sending")
    assert set(DispatchPermit.objects.values_list("state", "io_may_have_started")) == {(PermitState.SENDING, True)}
    assert receiver.requests == []
    _isolate_dead_holder()
    assert _abandon_all() == {EffectState.UNCERTAIN}
    assert effect_dispatch_batch(n=10, holder_name=RECOVERY, account_id=account_id) == []
    assert receiver.requests == []
    for e in effects:
        e.refresh_from_db()
        dispatch.effect_reconcile(effect_pk=e.pk, decision="no_effect", actor=OPERATOR,
                                  expected_changed_at=e.changed_at,
                                  evidence="receiver log shows no request for this Idempotency-Key")
    effect_dispatch_batch(n=10, holder_name=RECOVERY, account_id=account_id)
    _assert_landed_once(effects, receiver, keys)
    assert len(receiver.requests) == 3


@pytest.mark.django_db(**DB)
def test_crash_inside_the_batch_settlement_is_uncertain_then_lands_once(run_child, receiver):
    """Killed at "dispatch.batch_settle_before_commit": the receiver applied all three and answered 201; no
    settlement committed (permits `sending`, Attempts open, no link). After isolation: `uncertain`, never
    redispatched blindly; the operator's idempotent repeat under the frozen keys sends each again and the receiver
    still counts ONE application per key: 0 duplicated, 0 lost.
    Proves: CV2-10-051, CV2-10-057, CV2-10-058"""
    account_id, effects, keys = _crash(run_child, "dispatch.batch_settle_before_commit")
    assert receiver.applied == {key: 1 for key in keys} and len(receiver.requests) == 3
    assert set(DispatchPermit.objects.values_list("state", flat=True)) == {PermitState.SENDING}
    assert set(RemoteEffectAttempt.objects.values_list("outcome", flat=True)) == {""}
    assert not RemoteLink.objects.exists()
    _isolate_dead_holder()
    assert _abandon_all() == {EffectState.UNCERTAIN}
    assert effect_dispatch_batch(n=10, holder_name=RECOVERY, account_id=account_id) == []
    assert len(receiver.requests) == 3
    for e in effects:
        e.refresh_from_db()
        dispatch.effect_reconcile(
            effect_pk=e.pk, decision="idempotent_repeat", actor=OPERATOR, expected_changed_at=e.changed_at,
            evidence="push contract freezes a provider Idempotency-Key; exact repeat cannot create a second effect")
    effect_dispatch_batch(n=10, holder_name=RECOVERY, account_id=account_id)
    _assert_landed_once(effects, receiver, keys)
    assert len(receiver.requests) == 6
    for e in effects:
        assert list(RemoteEffectAttempt.objects.filter(effect=e).order_by("ordinal").values_list(
            "outcome", flat=True)) == [AttemptOutcome.UNCERTAIN, AttemptOutcome.REMOTE_CONFIRMED]


@pytest.mark.django_db(**DB)
def test_crash_inside_a_limited_batch_withdrawal_sends_nothing_more_and_each_lands_once(run_child, receiver,
                                                                                       monkeypatch):
    """Killed at "dispatch.withdraw_before_commit": a limited destination's batch of three, the first request
    answered `429 Retry-After: 1` (its settlement recorded the deferral), the other two markers refused, and their
    withdrawal not committed: they stay `granted` with no I/O, the receiver saw one request. After holder isolation
    they are abandoned as `granted` (proof: no I/O), and once the deferral passed a new holder lands each effect
    once. Proves: CV2-10-037, CV2-10-042, CV2-10-055"""
    import time

    from connector import demo

    monkeypatch.setattr(demo, "CALLOUT_DEFINITION", {**demo.CALLOUT_DEFINITION, "rate_limit": {
        "requests_per_second": 50, "max_in_flight": 6}})
    account_id, effects = _three_effects()
    keys = [e.command.provider_idempotency_key for e in effects]
    assert effects[0].command.limiter_id is not None
    receiver.modes, receiver.retry_after = ["throttle"], "1"
    assert_killed(run_child(BATCH_SCRIPT, "dispatch.withdraw_before_commit", account_id=account_id, holder=DEAD))
    assert [r["mode"] for r in receiver.requests] == ["throttle"]
    assert sorted(DispatchPermit.objects.values_list("state", "io_may_have_started")) == [
        (PermitState.GRANTED, False), (PermitState.GRANTED, False), (PermitState.RETURNED, True)]
    _isolate_dead_holder()
    assert _abandon_all() == {EffectState.PREPARED}
    deadline = time.monotonic() + scaled(10)
    while RemoteEffect.objects.filter(pk__in=[e.pk for e in effects]).exclude(state=EffectState.FINALIZED).exists():
        assert time.monotonic() < deadline
        effect_dispatch_batch(n=10, holder_name=RECOVERY, account_id=account_id)
        time.sleep(0.05)
    _assert_landed_once(effects, receiver, keys)
    ok = [r for r in receiver.requests if r["mode"] == "ok"]
    assert len(ok) == 3 and ok[0]["at"] - receiver.requests[0]["answered_at"] >= 1.0
