"""The batched egress worker step (issue 20, D-345..D-350): a batch of one account's unlimited effects claimed
and granted in one transaction, their `sending` markers in one, their confirmed settlements and finalizations in
one; every per-effect check of the one-by-one path still holds, and whatever the batch cannot take goes through
the one-by-one path."""
from __future__ import annotations

import pytest

from connector.models import AuditRecord
from effects import egress_batch
from effects.choices import EffectState, PermitState
from effects.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt, RemoteLink
from effects.services import dispatch, dispatch_batch, worker
from tests.effects.helpers import ACTOR, author, build_push_world, outbound_generation, revoke


@pytest.fixture
def tx_world(transactional_db):
    return build_push_world()


def _author(account, count: int, prefix: str = "b") -> list[int]:
    return [author(account, root=f"{prefix}-{i}", record_id=f"{prefix}{i}").effect.pk for i in range(count)]


def test_batch_step_dispatches_ten_effects_once_each_in_three_transactions(tx_world, receiver, monkeypatch):
    """Ten effects of one account: one claim transaction grants ten permits (one Attempt each, fence + 1), one
    transaction commits the ten `sending` markers before any request, each effect is sent once, one transaction
    settles and finalizes all ten with their RemoteLinks and audit rows.
    Proves: CV2-10-036, CV2-10-037, CV2-10-048, CV2-10-055"""
    acme = tx_world.accounts[0]
    pks = _author(acme, 10)
    commits = []
    from django.db.backends.base.base import BaseDatabaseWrapper
    real_commit = BaseDatabaseWrapper.commit

    def counting_commit(self):
        commits.append(len(receiver.requests))
        return real_commit(self)
    monkeypatch.setattr(BaseDatabaseWrapper, "commit", counting_commit)
    done = worker.effect_dispatch_batch(n=10, holder_name="h-batch", account_id=acme.pk)
    monkeypatch.undo()
    assert sorted(e.pk for e in done) == pks and {e.state for e in done} == {EffectState.FINALIZED}
    # holder register + heartbeat, then claim, sending markers (before any request), settlement
    assert commits[-3:] == [0, 0, 10], commits
    assert receiver.applied_total() == 10 and set(receiver.applied.values()) == {1}
    assert RemoteLink.objects.filter(effect_id__in=pks, state="active").count() == 10
    for pk in pks:
        attempt = RemoteEffectAttempt.objects.get(effect_id=pk)
        assert (attempt.ordinal, attempt.lease_fence, attempt.outcome) == (1, 1, "remote_confirmed")
        permit = DispatchPermit.objects.get(effect_id=pk)
        assert (permit.state, permit.io_may_have_started, permit.holder_fence) == (PermitState.RETURNED, True, 1)
        assert list(AuditRecord.objects.filter(entity_id=str(pk), entity_type="effects.RemoteEffect")
                    .order_by("pk").values_list("action", flat=True)) == ["permit_settle", "effect_finalize"]
        assert AuditRecord.objects.filter(entity_id=str(permit.pk), action="permit_acquire",
                                          fence=permit.credential_gate_fence).exists()


def test_batch_takes_one_account_in_rotation_oldest_first(tx_world, receiver):
    """Two accounts with work: consecutive batch claims serve one account each, alternating, oldest first.
    Proves: CV2-07-016"""
    a, b = tx_world.accounts[0], tx_world.accounts[1]
    a_pks, b_pks = _author(a, 4, "a"), _author(b, 4, "b")
    holder = dispatch.holder_register(holder_id="h-rot")
    first = dispatch_batch.effects_claim_batch(holder=holder, n=2)
    second = dispatch_batch.effects_claim_batch(holder=holder, n=2)
    third = dispatch_batch.effects_claim_batch(holder=holder, n=2)
    assert {p.account_id for p in first} != {p.account_id for p in second}
    assert len({p.account_id for p in first}) == len({p.account_id for p in second}) == 1
    assert {p.account_id for p in third} == {p.account_id for p in first}
    taken = {p.account_id: [] for p in first + second}
    for p in first + second + third:
        taken[p.account_id].append(p.effect_pk)
    assert taken[a.pk] == a_pks[:len(taken[a.pk])] and taken[b.pk] == b_pks[:len(taken[b.pk])]


def test_batch_claim_checks_each_effect_gate_secret_and_holder(tx_world, receiver, settings, tmp_path):
    """Per effect, as the one-by-one claim: a revoked credential gate leaves its effects `prepared` with nothing
    written; a missing frozen secret version quarantines the effect (CREDENTIAL_MATERIAL_MISSING); a holder that
    is not running is refused and nothing of the claim survives.
    Proves: CV2-10-013, CV2-10-036, CV2-10-037"""
    acme, other = tx_world.accounts[0], tx_world.accounts[1]
    pks = _author(acme, 3)
    revoke(outbound_generation(acme).generation_id)
    holder = dispatch.holder_register(holder_id="h-checks")
    assert dispatch_batch.effects_claim_batch(holder=holder, n=10, account_id=acme.pk) == []
    assert set(RemoteEffect.objects.filter(pk__in=pks).values_list("state", "attempt_count")) == {("prepared", 0)}
    assert not DispatchPermit.objects.exists()

    other_pks = _author(other, 2, "o")
    dispatch.holder_terminate(holder_id="h-checks", evidence="test", actor=ACTOR)
    with pytest.raises(Exception, match="terminated"):
        dispatch_batch.effects_claim_batch(holder=holder, n=10, account_id=other.pk)
    assert not DispatchPermit.objects.exists() and not RemoteEffectAttempt.objects.exists()

    settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": str(tmp_path / "empty")}
    (tmp_path / "empty").mkdir()
    live = dispatch.holder_register(holder_id="h-live")
    assert dispatch_batch.effects_claim_batch(holder=live, n=10, account_id=other.pk) == []
    assert set(RemoteEffect.objects.filter(pk__in=other_pks).values_list("state", "quarantine_reason")) == {
        ("quarantined", "CREDENTIAL_MATERIAL_MISSING")}
    assert receiver.requests == []


def test_batch_sending_marker_refuses_a_terminated_holder_before_any_byte(tx_world, receiver):
    """The batch's markers check each permit as `_win_sending` does: once the holder is terminated, no permit of
    its batch moves to `sending` and the receiver sees nothing; the refused permits, still `granted`, are abandoned
    with the termination as their proof and their effects are `prepared` again (D-399).
    Proves: CV2-10-038, CV2-10-039, CV2-10-040"""
    acme = tx_world.accounts[0]
    pks = _author(acme, 3)
    holder = dispatch.holder_register(holder_id="h-dead")
    permits = dispatch_batch.effects_claim_batch(holder=holder, n=10, account_id=acme.pk)
    assert len(permits) == 3
    dispatch.holder_terminate(holder_id="h-dead", evidence="test", actor=ACTOR)
    back = egress_batch.send_batch(permits=permits, holder_id="h-dead")
    assert sorted(back) == pks and {e.state for e in back.values()} == {EffectState.PREPARED}
    assert set(DispatchPermit.objects.values_list("state", flat=True)) == {PermitState.ABANDONED}
    assert all("terminated" in p for p in DispatchPermit.objects.values_list("abandonment_proof", flat=True))
    assert receiver.requests == []


def test_permits_a_revocation_fenced_out_are_abandoned_by_the_step_and_the_halt_drains(tx_world, receiver):
    """Permits granted, then the credential revoked and re-enabled (its fence moved) before their markers: the
    batch's markers refuse them, the step abandons them with the revocation as proof (nothing was sent), so the
    open-permit set is empty and a halt confirms without an operator; after the resume the next step sends each
    effect once with a new permit. Before D-399 they stayed `granted` until an operator abandoned them.
    Proves: CV2-04-009, CV2-10-040, CV2-10-042"""
    from tests.effects.helpers import gate_action, reenable

    acme = tx_world.accounts[0]
    pks = _author(acme, 3)
    holder = dispatch.holder_register(holder_id="h-rev")
    permits = dispatch_batch.effects_claim_batch(holder=holder, n=10, account_id=acme.pk)
    generation = outbound_generation(acme).generation_id
    revoke(generation)
    reenable(generation)
    back = egress_batch.send_batch(permits=permits, holder_id="h-rev")
    assert sorted(back) == pks and {e.state for e in back.values()} == {EffectState.PREPARED}
    assert receiver.requests == []
    assert not DispatchPermit.objects.filter(state__in=(PermitState.GRANTED, PermitState.SENDING)).exists()
    assert all("credential dispatch gate moved" in p
               for p in DispatchPermit.objects.values_list("abandonment_proof", flat=True))
    gate_action(acme, "halt_v2")
    gate_action(acme, "confirm_halted")  # refused while any permit of the account were open
    gate_action(acme, "resume_predecessor")
    done = worker.effect_dispatch_batch(n=10, holder_name="h-rev", account_id=acme.pk)
    assert sorted(e.pk for e in done) == pks and {e.state for e in done} == {EffectState.FINALIZED}
    assert receiver.applied_total() == 3 and set(receiver.applied.values()) == {1}


def test_batch_settles_other_answers_one_by_one_and_keeps_each_outcome(tx_world, receiver):
    """A refused answer (422) in the batch is settled alone (proven no effect: `prepared` again for another
    attempt); the confirmed ones are settled and finalized together.
    Proves: CV2-10-028, CV2-10-030"""
    acme = tx_world.accounts[0]
    pks = _author(acme, 3)
    receiver.modes = ["ok", "refuse", "ok"]
    done = {e.pk: e.state for e in worker.effect_dispatch_batch(n=10, holder_name="h-mixed", account_id=acme.pk)}
    assert done == {pks[0]: EffectState.FINALIZED, pks[1]: EffectState.PREPARED, pks[2]: EffectState.FINALIZED}
    assert not DispatchPermit.objects.filter(state__in=("granted", "sending")).exists()


def test_finalization_failure_in_the_batch_never_loses_the_settlement(tx_world, receiver, monkeypatch):
    """The batch's finalization fails inside its savepoint: the settlements commit (`remote_confirmed`, permits
    `returned`), and the worker finalizes each from the attempt evidence without a new request.
    Proves: CV2-10-030, CV2-10-052"""
    acme = tx_world.accounts[0]
    pks = _author(acme, 2)
    monkeypatch.setenv("CONNECTOR_FAULT_RAISE", "dispatch.finalize_in_settlement")
    holder = dispatch.holder_register(holder_id="h-fin")
    settled = egress_batch.send_batch(permits=dispatch_batch.effects_claim_batch(holder=holder, n=10),
                                      holder_id="h-fin")
    monkeypatch.delenv("CONNECTOR_FAULT_RAISE")
    assert {e.state for e in settled.values()} == {EffectState.REMOTE_CONFIRMED}
    assert set(DispatchPermit.objects.values_list("state", flat=True)) == {PermitState.RETURNED}
    assert not RemoteLink.objects.exists()
    for pk in pks:
        assert worker.effect_finalize_from_evidence(pk).state == EffectState.FINALIZED
    assert len(receiver.requests) == 2


def test_a_deterministic_batch_claim_failure_is_split_until_the_effect_at_fault_stands_alone(tx_world, receiver,
                                                                                             monkeypatch):
    """D-168, D-530: a batch claim that fails deterministically rolls back; the step claims each half again, until
    the effect at fault stands alone and is quarantined (EFFECT_STEP_FAILED, nothing sent); every other effect of
    the batch is granted, sent once and finalized in the same step.
    Proves: CV2-10-048, CV2-13-001"""
    acme = tx_world.accounts[0]
    pks = _author(acme, 5)
    real, claimed = dispatch_batch.effects_claim_batch, []

    def broken(*, candidates, **kwargs):
        claimed.append([c.effect_pk for c in candidates])
        if pks[3] in claimed[-1]:
            raise ValueError("a poisoned row")
        return real(candidates=candidates, **kwargs)
    monkeypatch.setattr(dispatch_batch, "effects_claim_batch", broken)
    done = {e.pk: (e.state, e.quarantine_reason) for e in worker.effect_dispatch_batch(
        n=5, holder_name="h-split", account_id=acme.pk)}
    assert done == {**{pk: (EffectState.FINALIZED, "") for pk in pks if pk != pks[3]},
                    pks[3]: (EffectState.QUARANTINED, "EFFECT_STEP_FAILED")}
    assert claimed == [pks, pks[:2], pks[2:], [pks[2]], pks[3:], [pks[3]], [pks[4]]]
    assert receiver.applied_total() == 4 and not DispatchPermit.objects.filter(effect_id=pks[3]).exists()


def test_limited_destinations_take_their_own_batch_after_the_unlimited_one(transactional_db, receiver, monkeypatch):
    """An effect whose destination declares a limit is never in an unlimited batch; the batched step then takes a
    batch of that limited destination, admitted under its limiter's row lock (D-372; tests/effects/
    test_rate_limits_batch.py proves the limited batch itself).
    Proves: CV2-10-037"""
    from connector import demo

    monkeypatch.setattr(demo, "CALLOUT_DEFINITION", {**demo.CALLOUT_DEFINITION, "rate_limit": {
        "requests_per_second": 50, "max_in_flight": 2, "burst": 5}})
    acme = demo.build_world("rl-", push=True).accounts[0]
    pks = _author(acme, 2)
    assert RemoteEffect.objects.get(pk=pks[0]).command.limiter_id is not None
    holder = dispatch.holder_register(holder_id="h-lim")
    assert dispatch_batch.effects_claim_batch(holder=holder, n=10) == []
    done = worker.effect_dispatch_batch(n=10, holder_name="h-lim")
    assert sorted((e.pk, e.state) for e in done) == [(pk, EffectState.FINALIZED) for pk in pks]
    assert DispatchPermit.objects.filter(effect_id__in=pks).exclude(limiter_id=None).count() == 2
    assert receiver.applied_total() == 2


def test_a_failing_batch_send_is_split_and_never_sends_twice(tx_world, receiver, monkeypatch):
    """D-350, D-530: the batch's send fails after the markers committed for the first permit (a defect in the send
    path): the step sends each half again, whose committed CAS refuses every permit already marked `sending`:
    nothing is sent twice, and the unmarked ones land once. The marked permit is never left open under a live
    holder (issue 37 item 3, D-425): the step gives its generation up, so it is abandoned with that proof and its
    effect is `uncertain` for reconciliation.
    Proves: CV2-10-038, CV2-13-001"""
    acme = tx_world.accounts[0]
    pks = _author(acme, 3)
    real = egress_batch.win_sending_batch

    def marks_one_then_fails(*, permits, holder_id, **kwargs):
        if len(permits) < 3:
            return real(permits=permits, holder_id=holder_id, **kwargs)
        real(permits=permits[:1], holder_id=holder_id)
        raise ValueError("a defect after the first marker committed")
    monkeypatch.setattr(egress_batch, "win_sending_batch", marks_one_then_fails)
    done = {e.pk: e.state for e in worker.effect_dispatch_batch(n=10, holder_name="h-send", account_id=acme.pk)}
    assert done == {pks[0]: EffectState.UNCERTAIN, pks[1]: EffectState.FINALIZED, pks[2]: EffectState.FINALIZED}
    permit = DispatchPermit.objects.get(effect_id=pks[0])
    assert permit.state == PermitState.ABANDONED and "gave up its generation" in permit.abandonment_proof
    assert receiver.applied_total() == 2 and set(receiver.applied.values()) == {1}
