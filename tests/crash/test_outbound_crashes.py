"""Crash rows of the outbound chain, with real process kills: a child Python process runs the dispatch steps
against the committed test database and dies by SIGKILL (connector.faults, or a self-kill where no named point
exists yet); the test then recovers as a restarted worker / operator would and checks the seed's rule
("Transaction and crash rules", DispatchPermit paragraphs of "State machines").

- "Worker crashes before DispatchPermit acquisition commits" -> expire the Attempt lease, reclaim the still-prepared
  effect (CV2-10-048, CV2-10-055).
- crash after acquisition, before `sending` ("Halt begins with a granted DispatchPermit" / State machines) -> the
  permit stays open until holder isolation; abandoning it proves no I/O and returns the effect to prepared
  (CV2-10-043, CV2-10-042, CV2-10-055).
- "A sending DispatchPermit holder disappears or loses its lease" -> expiry proves nothing; after isolation the
  permit is abandoned and the effect is uncertain (CV2-10-049, CV2-10-055).
- "Worker may have completed external I/O but lacks proof" -> uncertain; repeat only with proof or the frozen
  idempotency contract (CV2-10-051, CV2-10-057, CV2-10-058).
- "Remote success is proven before RemoteLink or local finalization commits" -> finalize from attempt evidence,
  never call the provider again (CV2-10-030, CV2-10-052, CV2-10-058).

Every test measures "at most once" against the real loopback receiver (tests/effects/receiver.py), which counts
logical applications per Idempotency-Key, and ends with every effect terminal (or uncertain with evidence), no
open permit, and the audit trail of each recovery step.
"""
from __future__ import annotations

import json
import time
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from connector import hooks
from connector.actors import Actor
from connector.models import AccountServingGate, AuditRecord
from connector.services.execution import execution_claim, execution_run
from effects import egress
from effects import egress_batch
from effects.choices import EFFECT_TERMINAL, PERMIT_OPEN, AttemptOutcome, EffectState, HolderState, PermitState
from effects.errors import AbandonRefused, EgressRefused, PermitRefused
from effects.models import DispatchPermit, ProcessGeneration, RemoteEffect, RemoteEffectAttempt, RemoteLink
from effects.services import dispatch
from effects.services.worker import effect_dispatch_once, effect_finalize_from_evidence, effects_sweep
from tests.crash.support import DB, assert_killed, ready_execution
from tests.crash import egress_fixtures
from tests.effects.receiver import Receiver

OPERATOR = Actor.system("o-crash-operator")
DEAD = "o-crash-child"  # the holder generation the child process registers (and dies as)
RECOVERY = "o-recovery"  # a new process generation that takes over
LEASE_SECONDS = 1

# -- child scripts (run after django.setup() by tests/crash/conftest.py's run_child; ARGS and emit() given) -------

# Crash before DispatchPermit acquisition commits. No named fault point sits inside permit_acquire's transaction,
# so the child replaces effects.services.dispatch.audit_record — the last call inside that transaction, after the
# permit INSERT and the effect's prepared -> dispatching UPDATE — with a function that reports what its own
# uncommitted transaction sees and then SIGKILLs the process. The transaction never commits; PostgreSQL rolls it
# back when the connection drops, exactly as for a worker killed between the writes and COMMIT.
PRE_ACQUIRE_SCRIPT = """
import signal
from django.db import transaction
from effects.models import DispatchPermit, RemoteEffect
from effects.services import dispatch
holder = dispatch.holder_register(holder_id=ARGS["holder"])
claim = dispatch.effect_claim(holder=holder, lease_seconds=ARGS["lease_seconds"], account_id=ARGS["account_id"])
assert claim is not None, "nothing to claim"
def audit_then_crash(**kwargs):
    seen = {"permits": DispatchPermit.objects.filter(effect_id=claim.effect_pk).count(),
            "effect_state": RemoteEffect.objects.get(pk=claim.effect_pk).state,
            "in_atomic": transaction.get_connection().in_atomic_block}
    print("CHILD-INTX " + json.dumps(seen), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
dispatch.audit_record = audit_then_crash
dispatch.permit_acquire(claim=claim)
emit(survived=True)
"""

# Crash after `granted`, before `sending`. No named point exists between permit_acquire returning and the egress
# adapter's granted -> sending CAS, so the child SIGKILLs itself right after permit_acquire returned (committed).
GRANTED_SCRIPT = """
import signal
from effects.services import dispatch
holder = dispatch.holder_register(holder_id=ARGS["holder"])
claim = dispatch.effect_claim(holder=holder, lease_seconds=ARGS["lease_seconds"], account_id=ARGS["account_id"])
assert claim is not None, "nothing to claim"
permit = dispatch.permit_acquire(claim=claim)
print("CHILD-PERMIT " + json.dumps({"permit": permit.pk, "state": permit.state}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
emit(survived=True)
"""

# The real worker step (claim, permit, egress send, finalize); CONNECTOR_FAULT_POINT picks where it dies.
DISPATCH_SCRIPT = """
from effects.services.worker import effect_dispatch_once
effect = effect_dispatch_once(holder_name=ARGS["holder"], account_id=ARGS["account_id"])
emit(effect=effect.pk if effect else None, state=effect.state if effect else None)
"""

# The same worker step whose finalization inside the settlement's transaction fails (connector.faults raises at
# "dispatch.finalize_in_settlement"; the savepoint rolls back, the settlement commits, D-336).
FINALIZE_FAILS_SCRIPT = """
os.environ["CONNECTOR_FAULT_RAISE"] = "dispatch.finalize_in_settlement"
""" + DISPATCH_SCRIPT


# -- fixtures: the receiver, and the child's environment pointed at it ------------------------------------

receiver = egress_fixtures.receiver
child_env = egress_fixtures.child_env


# -- helpers ------------------------------------------------------------------------------------------------------

def _author_effect(world) -> RemoteEffect:
    """Admit, materialize and run one inbound event so Runtime authors one OutboundCommand and its RemoteEffect."""
    account = world.accounts[0]
    ready_execution(account.account_key, "rec-o1")
    token = execution_claim(holder="o-inbound", account_id=account.pk)
    assert execution_run(token=token).state == "completed"
    effect = RemoteEffect.objects.select_related("command").get(account=account)
    assert effect.state == EffectState.PREPARED and effect.command.provider_idempotency_key
    return effect


def _child_line(run, tag: str) -> dict:
    for line in run.stdout.splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1:])
    raise AssertionError(f"child printed no {tag}:\n{run.stdout}\n{run.stderr}")


def _attempts(effect: RemoteEffect) -> list[tuple]:
    return list(RemoteEffectAttempt.objects.filter(effect=effect).order_by("ordinal").values_list(
        "ordinal", "holder__holder_id", "outcome"))


def _actions(entity_type: str, pk) -> list[str]:
    return list(AuditRecord.objects.filter(entity_type=entity_type, entity_id=str(pk)).order_by("pk")
                .values_list("action", flat=True))


def _open_permits(permit: DispatchPermit) -> list[str]:
    """The account gate's open-permit set (as its halt blocker reports it); while non-empty the gate's halt
    blockers include it, so `halting_v2` cannot become `v2_halted`."""
    gate = AccountServingGate.objects.get(pk=permit.gate_id)
    reasons = dispatch.open_permit_reasons(gate)
    assert set(reasons) <= set(hooks.halt_blockers(gate))
    return reasons


def _assert_time_proves_nothing(effect: RemoteEffect, permit: DispatchPermit) -> None:
    """A day later (every lease long expired) the still-running dead holder's permit cannot be abandoned, the
    effect cannot be reclaimed, and the sweep finds nothing claimable: expiry proves nothing (CV2-10-040)."""
    recovery = dispatch.holder_register(holder_id=RECOVERY)
    later = timezone.now() + timedelta(days=1)
    with mock.patch("django.utils.timezone.now", return_value=later):
        with pytest.raises(AbandonRefused, match="no proof"):
            dispatch.permit_abandon(permit_pk=permit.pk, actor=OPERATOR)
        assert dispatch.effect_claim(holder=recovery, account_id=effect.account_id) is None
        assert effects_sweep()["claimable"] == 0
    assert DispatchPermit.objects.get(pk=permit.pk).state in PERMIT_OPEN
    assert ProcessGeneration.objects.get(holder_id=DEAD).state == HolderState.RUNNING


def _terminate_dead_holder(run) -> None:
    holder = dispatch.holder_terminate(
        holder_id=DEAD, actor=OPERATOR,
        evidence=f"supervisor: child process exited by signal (returncode {run.returncode}); egress revoked")
    assert holder.state == HolderState.TERMINATED
    assert _actions("effects.ProcessGeneration", holder.pk) == ["holder_terminate"]


def _assert_settled_world(effect: RemoteEffect, receiver: Receiver) -> None:
    """Every effect terminal (or uncertain with evidence), no permit open, the receiver applied each logical
    effect at most once."""
    for e in RemoteEffect.objects.all():
        assert e.state in EFFECT_TERMINAL, f"{e} is not terminal"
        assert RemoteEffectAttempt.objects.filter(effect=e).exclude(outcome="").exists()
    assert not DispatchPermit.objects.filter(state__in=PERMIT_OPEN).exists()
    assert not _open_permits(DispatchPermit.objects.filter(effect=effect).first())
    assert receiver.applied_total() <= 1
    assert all(count == 1 for count in receiver.applied.values()), receiver.applied


# -- tests --------------------------------------------------------------------------------------------------------

@pytest.mark.django_db(**DB)
def test_crash_before_permit_acquisition_commits_reclaims_prepared_effect(run_child, receiver):
    """Crash row "Worker crashes before DispatchPermit acquisition commits": the child claims the effect (Attempt
    1, lease of 1 s) and is SIGKILLed inside permit_acquire's transaction after its permit INSERT and effect
    UPDATE but before COMMIT (self-kill from a patched audit_record, the transaction's last call: no named fault
    point exists there). Nothing of the acquisition survives: no permit, the effect is still `prepared`, the
    receiver saw nothing. The lease is held until it expires; then a new holder reclaims the same effect as
    Attempt 2 with a higher fence (the dead generation's Attempt 1 claim is fenced out of permit acquisition)
    and dispatches it exactly once, to `finalized`.
    Proves: CV2-10-048, CV2-10-055"""
    from connector.demo import build_world

    effect = _author_effect(build_world("o-", push=True))
    run = run_child(PRE_ACQUIRE_SCRIPT, account_id=effect.account_id, holder=DEAD, lease_seconds=LEASE_SECONDS)
    assert_killed(run)
    # the child died with its acquisition written but uncommitted
    assert _child_line(run, "CHILD-INTX") == {"permits": 1, "effect_state": "dispatching", "in_atomic": True}

    crashed = RemoteEffect.objects.get(pk=effect.pk)
    assert not DispatchPermit.objects.exists()
    assert (crashed.state, crashed.attempt_count, crashed.lease_holder) == (EffectState.PREPARED, 1, DEAD)
    assert _attempts(effect) == [(1, DEAD, "")]
    assert receiver.requests == []
    assert not AuditRecord.objects.filter(action="permit_acquire").exists()

    recovery = dispatch.holder_register(holder_id=RECOVERY)
    assert dispatch.effect_claim(holder=recovery, account_id=effect.account_id) is None  # lease still held
    time.sleep(LEASE_SECONDS + 0.2)
    claim = dispatch.effect_claim(holder=recovery, account_id=effect.account_id)
    assert claim is not None and claim.effect_pk == effect.pk and claim.lease_fence == crashed.lease_fence + 1
    # the dead generation's claim (Attempt 1) is fenced out should it ever resume
    first = RemoteEffectAttempt.objects.get(effect=effect, ordinal=1)
    stale = dispatch.EffectClaim(effect.pk, first.pk, crashed.lease_fence, first.holder_id)
    with pytest.raises(PermitRefused):
        dispatch.permit_acquire(claim=stale)
    permit = dispatch.permit_acquire(claim=claim)
    sent = egress_batch.send(permit_pk=permit.pk, holder_id=RECOVERY, holder_fence=permit.holder_fence,
                       credential_gate_fence=permit.credential_gate_fence)
    assert sent.state == EffectState.FINALIZED
    assert effect_finalize_from_evidence(effect.pk).state == EffectState.FINALIZED
    done = RemoteEffect.objects.get(pk=effect.pk)
    assert done.attempt_count == 2 and done.state == EffectState.FINALIZED
    assert _attempts(effect) == [(1, DEAD, ""), (2, RECOVERY, AttemptOutcome.REMOTE_CONFIRMED)]
    permit = DispatchPermit.objects.get()
    assert (permit.attempt.ordinal, permit.holder.holder_id, permit.state) == (2, RECOVERY, PermitState.RETURNED)
    assert len(receiver.requests) == 1 and receiver.applied == {effect.command.provider_idempotency_key: 1}
    assert _actions("effects.RemoteEffect", effect.pk) == ["permit_settle", "effect_finalize"]
    _assert_settled_world(effect, receiver)


@pytest.mark.django_db(**DB)
def test_crash_after_granted_needs_holder_isolation_then_returns_to_prepared(run_child, receiver):
    """Crash after acquisition but before `sending` (State machines; crash row "Halt begins with a granted
    DispatchPermit"): the child acquires the permit (committed) and SIGKILLs itself before calling the egress
    adapter (self-kill: no named point between acquisition and the granted -> sending CAS). The permit stays
    `granted` in the gate's open-permit set (the halt blocker sees it) and the effect `dispatching`; however much
    time passes, abandonment is refused and nothing is reclaimable while the holder generation is running. After
    holder_terminate with evidence the dead holder's egress is refused, the permit abandons with the holder
    proof, Attempt 1 records `no_effect` (proved no I/O) and the effect is `prepared`; a new holder dispatches
    it exactly once. The receiver never saw a request from the dead holder.
    Proves: CV2-10-043, CV2-10-042, CV2-10-040, CV2-10-055"""
    from connector.demo import build_world

    effect = _author_effect(build_world("o-", push=True))
    run = run_child(GRANTED_SCRIPT, account_id=effect.account_id, holder=DEAD, lease_seconds=LEASE_SECONDS)
    assert_killed(run)
    granted = _child_line(run, "CHILD-PERMIT")
    permit = DispatchPermit.objects.get(pk=granted["permit"])
    assert (permit.state, permit.io_may_have_started, permit.holder.holder_id) == (PermitState.GRANTED, False, DEAD)
    assert RemoteEffect.objects.get(pk=effect.pk).state == EffectState.DISPATCHING
    assert _open_permits(permit) == [f"open dispatch permit #{permit.pk} (granted)"]
    assert receiver.requests == []

    _assert_time_proves_nothing(effect, permit)

    _terminate_dead_holder(run)
    with pytest.raises(EgressRefused, match="terminated"):  # the dead generation can never send this permit
        egress_batch.send(permit_pk=permit.pk, holder_id=DEAD, holder_fence=permit.holder_fence,
                    credential_gate_fence=permit.credential_gate_fence)
    assert DispatchPermit.objects.get(pk=permit.pk).state == PermitState.GRANTED
    back = dispatch.permit_abandon(permit_pk=permit.pk, actor=OPERATOR)
    assert back.state == EffectState.PREPARED
    permit.refresh_from_db()
    assert permit.state == PermitState.ABANDONED and not permit.io_may_have_started
    assert not _open_permits(permit)
    first = RemoteEffectAttempt.objects.get(effect=effect, ordinal=1)
    assert first.outcome == AttemptOutcome.NO_EFFECT and "abandoned before sending" in first.evidence
    assert DEAD in first.evidence
    assert receiver.requests == []

    done = effect_dispatch_once(holder_name=RECOVERY, account_id=effect.account_id)
    assert done.pk == effect.pk and done.state == EffectState.FINALIZED
    assert _attempts(effect) == [(1, DEAD, AttemptOutcome.NO_EFFECT), (2, RECOVERY, AttemptOutcome.REMOTE_CONFIRMED)]
    assert len(receiver.requests) == 1 and receiver.applied == {effect.command.provider_idempotency_key: 1}
    assert _actions("effects.DispatchPermit", permit.pk) == ["permit_acquire", "permit_abandon"]
    _assert_settled_world(effect, receiver)


@pytest.mark.django_db(**DB)
def test_crash_after_sending_before_request_is_uncertain_until_reconciled(run_child, receiver):
    """Crash row "A sending DispatchPermit holder disappears or loses its lease": the worker is SIGKILLed at
    "egress.after_sending" — granted -> sending committed (io_may_have_started), no byte sent. The receiver saw
    nothing, yet the permit is `sending` and, however much time passes, neither abandonment nor a reclaim is
    possible while the holder runs. After holder isolation the abandonment makes the effect `uncertain` (Attempt
    1 `uncertain`), never `prepared`: no automatic retry. An operator reconciles with evidence (`no_effect`:
    "receiver log shows no request"); the frozen policy allows another attempt, so the effect is `prepared` and a
    new holder dispatches it exactly once.
    Proves: CV2-10-049, CV2-10-055, CV2-10-050, CV2-10-056, CV2-10-040"""
    from connector.demo import build_world

    effect = _author_effect(build_world("o-", push=True))
    run = run_child(DISPATCH_SCRIPT, "egress.after_sending", account_id=effect.account_id, holder=DEAD)
    assert_killed(run)
    permit = DispatchPermit.objects.get(effect=effect)
    assert (permit.state, permit.io_may_have_started) == (PermitState.SENDING, True)
    assert RemoteEffect.objects.get(pk=effect.pk).state == EffectState.DISPATCHING
    assert _open_permits(permit)
    assert receiver.requests == []

    _assert_time_proves_nothing(effect, permit)

    _terminate_dead_holder(run)
    assert dispatch.permit_abandon(permit_pk=permit.pk, actor=OPERATOR).state == EffectState.UNCERTAIN
    permit.refresh_from_db()
    assert permit.state == PermitState.ABANDONED and not _open_permits(permit)
    first = RemoteEffectAttempt.objects.get(effect=effect, ordinal=1)
    assert first.outcome == AttemptOutcome.UNCERTAIN and "abandoned while sending" in first.evidence
    # uncertain is never retried automatically
    assert effect_dispatch_once(holder_name=RECOVERY, account_id=effect.account_id) is None
    assert effects_sweep() == {"finalized": 0, "claimable": 0}
    assert receiver.requests == []

    effect.refresh_from_db()
    reconciled = dispatch.effect_reconcile(effect_pk=effect.pk, decision="no_effect", actor=OPERATOR,
                                           expected_changed_at=effect.changed_at, evidence="receiver log shows no request for this Idempotency-Key")
    assert reconciled.state == EffectState.PREPARED  # attempt 1 of max 3: policy permits another attempt
    done = effect_dispatch_once(holder_name=RECOVERY, account_id=effect.account_id)
    assert done.pk == effect.pk and done.state == EffectState.FINALIZED
    assert _attempts(effect) == [(1, DEAD, AttemptOutcome.UNCERTAIN), (2, RECOVERY, AttemptOutcome.REMOTE_CONFIRMED)]
    assert RemoteEffectAttempt.objects.get(pk=first.pk).evidence == first.evidence  # never rewritten
    assert len(receiver.requests) == 1 and receiver.applied == {effect.command.provider_idempotency_key: 1}
    assert _actions("effects.RemoteEffect", effect.pk) == ["effect_reconcile_no_effect", "permit_settle",
                                                            "effect_finalize"]
    assert _actions("effects.DispatchPermit", permit.pk) == ["permit_acquire", "permit_abandon"]
    _assert_settled_world(effect, receiver)


@pytest.mark.django_db(**DB)
def test_crash_after_request_before_settlement_repeats_idempotently(run_child, receiver):
    """Crash row "Worker may have completed external I/O but lacks proof": the worker is SIGKILLed at
    "egress.after_request" — the receiver applied the effect and answered, settlement never committed. The
    permit is still `sending`, Attempt 1 has no outcome. After holder isolation and abandonment the effect is
    `uncertain` and automatic retry stops. The operator chooses `idempotent_repeat` (the push contract froze a
    provider idempotency key); the new Attempt reuses the byte-identical request and the same key, the receiver
    sees that key again and still counts ONE logical application, and the effect ends `finalized` with the prior
    uncertain Attempt preserved.
    Proves: CV2-10-051, CV2-10-057, CV2-10-058, CV2-10-049"""
    from connector.demo import build_world

    effect = _author_effect(build_world("o-", push=True))
    key = effect.command.provider_idempotency_key
    run = run_child(DISPATCH_SCRIPT, "egress.after_request", account_id=effect.account_id, holder=DEAD)
    assert_killed(run)
    assert receiver.applied == {key: 1} and len(receiver.requests) == 1
    permit = DispatchPermit.objects.get(effect=effect)
    assert permit.state == PermitState.SENDING and _open_permits(permit)
    assert RemoteEffect.objects.get(pk=effect.pk).state == EffectState.DISPATCHING
    assert _attempts(effect) == [(1, DEAD, "")]
    assert dispatch.effect_claim(holder=dispatch.holder_register(holder_id=RECOVERY)) is None

    _terminate_dead_holder(run)
    assert dispatch.permit_abandon(permit_pk=permit.pk, actor=OPERATOR).state == EffectState.UNCERTAIN
    first = RemoteEffectAttempt.objects.get(effect=effect, ordinal=1)
    assert first.outcome == AttemptOutcome.UNCERTAIN and first.evidence
    assert effect_dispatch_once(holder_name=RECOVERY, account_id=effect.account_id) is None
    assert len(receiver.requests) == 1

    effect.refresh_from_db()
    assert dispatch.effect_reconcile(
        effect_pk=effect.pk, decision="idempotent_repeat", actor=OPERATOR, expected_changed_at=effect.changed_at,
        evidence="push contract freezes a provider Idempotency-Key; exact repeat cannot create a second effect",
    ).state == EffectState.PREPARED
    done = effect_dispatch_once(holder_name=RECOVERY, account_id=effect.account_id)
    assert done.pk == effect.pk and done.state == EffectState.FINALIZED

    assert len(receiver.requests) == 2
    assert [r["key"] for r in receiver.requests] == [key, key]
    assert receiver.requests[0]["body"] == receiver.requests[1]["body"]  # byte-identical request
    assert receiver.applied_total() == 1 and receiver.applied == {key: 1}
    assert _attempts(effect) == [(1, DEAD, AttemptOutcome.UNCERTAIN), (2, RECOVERY, AttemptOutcome.REMOTE_CONFIRMED)]
    a1, a2 = RemoteEffectAttempt.objects.filter(effect=effect).order_by("ordinal")
    assert (a1.evidence, a1.response_status) == (first.evidence, first.response_status)  # preserved
    assert bytes(a1.request_digest) == bytes(a2.request_digest)
    assert a1.provider_idempotency_key == a2.provider_idempotency_key == key
    assert a2.response_status == 200  # the receiver recognised the repeat
    assert _actions("effects.RemoteEffect", effect.pk) == ["effect_reconcile_idempotent_repeat", "permit_settle",
                                                            "effect_finalize"]
    _assert_settled_world(effect, receiver)


@pytest.mark.django_db(**DB)
def test_crash_after_remote_confirmation_finalizes_without_redispatch(run_child, receiver):
    """Crash row "Remote success is proven before RemoteLink or local finalization commits": the worker is
    SIGKILLed at "dispatch.after_confirmed" (effects/services/worker.py) after the finalization inside the
    settlement's transaction failed (injected at "dispatch.finalize_in_settlement": its savepoint rolled back,
    D-336) — the permit settled `returned`, the effect is `remote_confirmed` with Attempt 1's evidence, no
    RemoteLink, not finalized. Recovery never
    redispatches: nothing is claimable, and effects_sweep() finalizes it from the attempt evidence (creating the
    RemoteLink to the proven remote identity) with no new request to the receiver; a second sweep is a no-op.
    Proves: CV2-10-030, CV2-10-052, CV2-10-058"""
    from connector.demo import build_world

    effect = _author_effect(build_world("o-", push=True))
    key = effect.command.provider_idempotency_key
    run = run_child(FINALIZE_FAILS_SCRIPT, "dispatch.after_confirmed", account_id=effect.account_id, holder=DEAD)
    assert_killed(run)
    confirmed = RemoteEffect.objects.get(pk=effect.pk)
    assert confirmed.state == EffectState.REMOTE_CONFIRMED and confirmed.remote_id
    assert DispatchPermit.objects.get(effect=effect).state == PermitState.RETURNED
    first = RemoteEffectAttempt.objects.get(effect=effect)
    assert (first.outcome, first.response_status) == (AttemptOutcome.REMOTE_CONFIRMED, 201) and first.evidence
    assert not RemoteLink.objects.exists()
    assert len(receiver.requests) == 1 and receiver.applied == {key: 1}

    assert effect_dispatch_once(holder_name=RECOVERY, account_id=effect.account_id) is None
    assert effects_sweep() == {"finalized": 1, "claimable": 0}
    assert effects_sweep() == {"finalized": 0, "claimable": 0}
    done = RemoteEffect.objects.get(pk=effect.pk)
    assert done.state == EffectState.FINALIZED and done.remote_id == confirmed.remote_id
    link = RemoteLink.objects.get()
    assert (link.remote_identity, link.effect_id, link.state) == (confirmed.remote_id, effect.pk, "active")
    assert len(receiver.requests) == 1 and receiver.applied_total() == 1  # no new request
    assert _attempts(effect) == [(1, DEAD, AttemptOutcome.REMOTE_CONFIRMED)]
    assert _actions("effects.RemoteEffect", effect.pk) == ["permit_settle", "effect_finalize"]
    _assert_settled_world(effect, receiver)


@pytest.mark.django_db(**DB)
def test_crash_inside_claim_and_permit_transaction_leaves_nothing_and_the_effect_lands_once(run_child, receiver):
    """Issue 20 (D-335, D-347): the worker's step for a batch of one is SIGKILLed at
    "dispatch.batch_claim_before_commit", inside the one transaction that claims the effect and grants its permit (Attempt, lease, permit, `prepared -> dispatching`
    written, not committed). Nothing of it survives: no Attempt, no lease, no permit, the effect `prepared`; so
    a new holder dispatches it at once (no lease to wait out) and the receiver applies it exactly once:
    0 duplicated, 0 lost.
    Proves: CV2-10-048, CV2-10-055"""
    from connector.demo import build_world

    effect = _author_effect(build_world("o-", push=True))
    key = effect.command.provider_idempotency_key
    run = run_child(DISPATCH_SCRIPT, "dispatch.batch_claim_before_commit", account_id=effect.account_id,
                    holder=DEAD)
    assert_killed(run)
    crashed = RemoteEffect.objects.get(pk=effect.pk)
    assert (crashed.state, crashed.attempt_count, crashed.lease_holder, crashed.lease_expires_at) == (
        EffectState.PREPARED, 0, "", None)
    assert not DispatchPermit.objects.exists() and _attempts(effect) == []
    assert not AuditRecord.objects.filter(action="permit_acquire").exists()
    assert receiver.requests == []

    done = effect_dispatch_once(holder_name=RECOVERY, account_id=effect.account_id)
    assert done.pk == effect.pk and done.state == EffectState.FINALIZED
    assert _attempts(effect) == [(1, RECOVERY, AttemptOutcome.REMOTE_CONFIRMED)]
    assert len(receiver.requests) == 1 and receiver.applied == {key: 1}
    assert RemoteLink.objects.get().effect_id == effect.pk
    _assert_settled_world(effect, receiver)


@pytest.mark.django_db(**DB)
def test_crash_inside_settle_and_finalize_transaction_is_uncertain_then_lands_once(run_child, receiver):
    """Issue 20 (D-336, D-348): the receiver applied the effect and answered 201; the worker's step for a batch of
    one is SIGKILLed at "dispatch.batch_settle_before_commit", inside the one transaction that settles the permit
    and finalizes
    the effect (settlement, RemoteLink and `finalized` written, not committed). Nothing of it survives: the
    permit is still `sending` (the committed pre-I/O marker), Attempt 1 has no outcome, no RemoteLink. Recovery
    is the crash row "Worker may have completed external I/O but lacks proof": holder isolation, abandonment to
    `uncertain`, an idempotent repeat under the frozen key; the receiver still counts ONE application: 0
    duplicated, 0 lost.
    Proves: CV2-10-051, CV2-10-057, CV2-10-058"""
    from connector.demo import build_world

    effect = _author_effect(build_world("o-", push=True))
    key = effect.command.provider_idempotency_key
    run = run_child(DISPATCH_SCRIPT, "dispatch.batch_settle_before_commit", account_id=effect.account_id,
                    holder=DEAD)
    assert_killed(run)
    assert receiver.applied == {key: 1} and len(receiver.requests) == 1
    permit = DispatchPermit.objects.get(effect=effect)
    assert (permit.state, permit.io_may_have_started) == (PermitState.SENDING, True)
    assert RemoteEffect.objects.get(pk=effect.pk).state == EffectState.DISPATCHING
    assert _attempts(effect) == [(1, DEAD, "")] and not RemoteLink.objects.exists()
    assert not AuditRecord.objects.filter(action__in=("permit_settle", "effect_finalize")).exists()

    _terminate_dead_holder(run)
    assert dispatch.permit_abandon(permit_pk=permit.pk, actor=OPERATOR).state == EffectState.UNCERTAIN
    assert effect_dispatch_once(holder_name=RECOVERY, account_id=effect.account_id) is None
    effect.refresh_from_db()
    dispatch.effect_reconcile(
        effect_pk=effect.pk, decision="idempotent_repeat", actor=OPERATOR, expected_changed_at=effect.changed_at,
        evidence="push contract freezes a provider Idempotency-Key; exact repeat cannot create a second effect")
    done = effect_dispatch_once(holder_name=RECOVERY, account_id=effect.account_id)
    assert done.pk == effect.pk and done.state == EffectState.FINALIZED
    assert [r["key"] for r in receiver.requests] == [key, key]
    assert receiver.applied_total() == 1 and receiver.applied == {key: 1}
    assert _attempts(effect) == [(1, DEAD, AttemptOutcome.UNCERTAIN), (2, RECOVERY, AttemptOutcome.REMOTE_CONFIRMED)]
    assert RemoteLink.objects.get().effect_id == effect.pk
    _assert_settled_world(effect, receiver)
