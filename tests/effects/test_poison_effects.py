"""Poison effects never wedge the dispatch worker or the effects sweep (decision D-168, CV2-13-001): a step that
fails for a non-connector reason on one effect quarantines a `prepared` effect (it never crossed the provider
boundary) or holds a later one (its open permit or attempt is settled only by the crash rules), with StepFailure
evidence, and the other effects of the same loop or sweep complete against a real loopback receiver."""
from __future__ import annotations

import pytest
from django.core.management import call_command

from connector.models import StepFailure
from effects import tasks
from effects.choices import EffectState
from effects.models import DispatchPermit, RemoteEffect
from effects.services import dispatch, worker
from tests.effects.helpers import acquire, author, send


def _failure(effect: RemoteEffect) -> StepFailure:
    return StepFailure.objects.get(entity_type="effects.RemoteEffect", entity_id=str(effect.pk))


@pytest.mark.django_db
@pytest.mark.parametrize("batch", [1, 10])
def test_a_permit_step_failure_quarantines_that_effect_and_the_worker_dispatches_the_next(push_world, receiver,
                                                                                        monkeypatch, settings, batch):
    """`effects.tasks.effect_dispatch` meets an effect whose claim + permit transaction fails (a KeyError): the
    effect, still `prepared`, is quarantined (EFFECT_STEP_FAILED, no permit, nothing sent) and the same loop
    dispatches and finalizes the next effect. With batches of 10 the poison fails the batch's claim transaction:
    it rolls back and each half is claimed again until the bad effect stands alone and is quarantined (D-530);
    with batches of one it stands alone at once.
    Proves: CV2-13-001, CV2-10-031"""
    from effects.services import dispatch_batch

    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BATCH": batch}
    acme = push_world.accounts[0]
    bad = RemoteEffect.objects.get(command=author(acme, root="order-bad", record_id="r-bad"))
    good = RemoteEffect.objects.get(command=author(acme, root="order-good", record_id="r-good"))
    real, claimed = dispatch_batch.effects_claim_batch, []

    def effects_claim_batch(*, candidates, **kwargs):  # the worker's claim + permit transaction (D-347)
        claimed.append(sorted(c.effect_pk for c in candidates))
        if bad.pk in {c.effect_pk for c in candidates}:
            raise KeyError("poison permit")
        return real(candidates=candidates, **kwargs)

    monkeypatch.setattr(dispatch_batch, "effects_claim_batch", effects_claim_batch)
    assert tasks.effect_dispatch() == 2
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.state, bad.quarantine_reason) == (EffectState.QUARANTINED, "EFFECT_STEP_FAILED")
    assert good.state == EffectState.FINALIZED
    assert [r["path"] for r in receiver.requests] == ["/v1/records/r-good"]
    assert not DispatchPermit.objects.filter(effect=bad).exists()
    assert (_failure(bad).step, _failure(bad).exception_class) == ("permit_acquire", "builtins.KeyError")
    assert worker.effect_dispatch_once(holder_name="h-2", account_id=acme.pk) is None  # nothing left to claim
    assert claimed == [sorted([bad.pk, good.pk]), [bad.pk], [good.pk]]  # the candidates read beyond the batch


@pytest.mark.django_db
def test_a_finalization_failure_holds_that_effect_and_the_sweep_finalizes_the_others(push_world, receiver,
                                                                                   monkeypatch):
    """The effects sweep meets a confirmed effect whose finalization fails: it keeps `remote_confirmed` (the
    provider's evidence stands), is held with EFFECT_STEP_FAILED and skipped by later sweeps, while the other
    confirmed effect is finalized in the same sweep; `poison_release --effect` lifts the hold after the fix.
    Proves: CV2-13-001, CV2-10-030"""
    from effects.services import dispatch_batch

    acme = push_world.accounts[0]
    with monkeypatch.context() as held:  # the finalization in the settlement fails: both left remote_confirmed
        held.setattr(dispatch_batch, "_finalize_in_savepoint", lambda **kwargs: None)
        for n in (1, 2):
            author(acme, root=f"order-{n}", record_id=f"r-{n}")
            assert send(acquire(f"h-{n}", acme)).state == EffectState.REMOTE_CONFIRMED
    bad, good = RemoteEffect.objects.order_by("pk")
    real = dispatch.effect_finalize

    def effect_finalize(*, effect_pk, owner_slot="", **kwargs):
        if effect_pk == bad.pk:
            raise TypeError("poison finalize")
        return real(effect_pk=effect_pk, owner_slot=owner_slot, **kwargs)

    monkeypatch.setattr(dispatch, "effect_finalize", effect_finalize)
    assert tasks.effects_sweep() == {"finalized": 1, "claimable": 0}
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.state, bad.quarantine_reason) == (EffectState.REMOTE_CONFIRMED, "EFFECT_STEP_FAILED")
    assert good.state == EffectState.FINALIZED
    assert _failure(bad).step == "effect_finalize"
    assert worker.effects_sweep() == {"finalized": 0, "claimable": 0}  # held: not retried
    monkeypatch.setattr(dispatch, "effect_finalize", real)
    call_command("poison_release", effect=bad.pk, reason="fix deployed")
    assert worker.effects_sweep() == {"finalized": 1, "claimable": 0}
    assert len(receiver.requests) == 2  # finalization never calls the provider again
