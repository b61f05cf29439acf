"""A limited batch's withdrawal (issue 20, goal 4, decision D-373): the `granted` permits of a destination whose
receiver deferred it (`429` / `Retry-After`) after they were granted and before their sending markers. The limited
marker (`effects.egress_batch.win_sending_batch`) refuses them while the destination is deferred; this closes them
with the proof that no I/O began, so their effects are claimable again after the deferral (not parked until their
lease expires) and the destination's in-flight count drops at once.

`permits_withdraw`: ONE transaction in the canonical lock order (docs/locking.md): the effects `FOR UPDATE`
(ascending pk), the destination limiter `FOR SHARE`, the permits `FOR UPDATE` (ascending pk), their holder `FOR
SHARE`. Each permit is withdrawn only if, under those locks, it is still `granted` (so its `granted -> sending`
marker was never committed: no byte was sent, and no marker can commit after this one), it is the caller's
(holder and fence), it names that limiter, its effect is `dispatching`, and the limiter is deferred now. Then the
permit `granted -> abandoned` with that proof, its Attempt `no_effect` ("withdrawn before sending"; it never counts
against the policy's attempts: its permit never reached `sending`, D-117) and the effect `dispatching -> prepared`
with its lease cleared, as `permit_abandon` closes a `granted` permit. Anything else is left as it is (the sweeper's
recovery and `permit_abandon` still apply). `fault_point("dispatch.withdraw_before_commit")` fires before the COMMIT.

`permits_abandon_fenced_out` (D-399): the `granted` permits a sending marker refused for another reason, closed by
`dispatch.permit_abandon` (its own transaction, lock order and proof) when it has one: a credential revocation that
moved the gate's fence after acquisition, or a terminated holder. Without a proof it refuses and the permit stays.
"""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from connector.faults import fault_point
from connector.services.audit import audit_record
from effects import locks
from effects.choices import AttemptOutcome, EffectState, PermitState
from effects.errors import AbandonRefused
from effects.models import RemoteEffect, RemoteEffectAttempt
from effects.services import dispatch


def permits_withdraw(*, permits: list, holder_id: str) -> list[int]:
    """Withdraw a limited batch's `granted` permits while their destination is deferred (see the module). `permits`:
    BatchPermits of one account and one limiter. Returns the effect pks whose permits were withdrawn."""
    if not permits:
        return []
    account_id, limiter_pk = permits[0].account_id, permits[0].limiter_pk
    if limiter_pk is None or any(p.account_id != account_id or p.limiter_pk != limiter_pk for p in permits):
        raise ValueError("a withdrawal names the permits of one account and one limited destination")
    items = sorted(permits, key=lambda p: p.effect_pk)
    effect_pks = [p.effect_pk for p in items]
    withdrawn = []
    with transaction.atomic():
        effects = {e.pk: e for e in RemoteEffect.objects.select_for_update(of=("self",))
                   .filter(account_id=account_id, pk__in=effect_pks).order_by("pk")}
        limiter = locks.limiter_for_share(limiter_pk)
        now = timezone.now()
        if limiter.deferred_until is None or limiter.deferred_until <= now:
            return []
        rows = {r.pk: r for r in locks.permits_for_update([p.permit_pk for p in items], effect_ids=effect_pks)}
        holders = {pk: locks.holder_for_share(pk) for pk in sorted({r.holder_id for r in rows.values()})}
        proof = (f"destination deferred by its receiver until {limiter.deferred_until:%Y-%m-%dT%H:%M:%S.%fZ}; the "
                 "permit was still granted under its lock: its sending marker was never committed, no byte was sent")
        for p in items:
            permit, effect = rows.get(p.permit_pk), effects.get(p.effect_pk)
            if (permit is None or effect is None or permit.effect_id != p.effect_pk
                    or permit.state != PermitState.GRANTED or permit.limiter_id != limiter_pk
                    or permit.holder_fence != p.holder_fence or holders[permit.holder_id].holder_id != holder_id
                    or effect.state != EffectState.DISPATCHING):
                continue
            permit.abandon(at=now, proof=proof)
            permit.save()
            RemoteEffectAttempt.objects.filter(pk=permit.attempt_id, effect_id=effect.pk, outcome="").update(
                outcome=AttemptOutcome.NO_EFFECT, evidence=f"withdrawn before sending: {proof}", settled_at=now)
            effect.retry()
            effect.save()
            audit_record(actor=dispatch.DISPATCHER, entity=permit, action="permit_abandon",
                         from_state=PermitState.GRANTED, to_state=permit.state, reason=proof[:500])
            withdrawn.append(effect.pk)
        fault_point("dispatch.withdraw_before_commit")
    return withdrawn


def permits_abandon_fenced_out(permit_pks: list[int]) -> list[int]:
    """The permits a sending marker refused (they stayed `granted`: no byte was sent), each closed by
    `dispatch.permit_abandon` if it has durable proof that it can never be sent (D-399): so a revocation does not
    leave open permits that only an operator could close, keeping a later halt from draining. A permit without a
    proof is left as it is. Returns the effect pks returned to `prepared`."""
    out = []
    for permit_pk in sorted(set(permit_pks)):
        try:
            out.append(dispatch.permit_abandon(permit_pk=permit_pk, actor=dispatch.DISPATCHER).pk)
        except AbandonRefused:
            continue
    return out
