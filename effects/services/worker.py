"""The dispatch worker loop, one path for one effect or many (issue 20, D-345..D-350; issue 39): a batch of up to
`n` `prepared` effects of one account whose destinations declare no limit (or of ONE limited destination, in
rotation, D-372) is claimed and granted in one transaction (`dispatch_batch.effects_claim_batch`), its `sending`
markers committed in one transaction before any byte, each effect sent once through the sole egress adapter and the
answers settled, the confirmed ones with their finalizations in one transaction (`egress_batch.send_batch`). One
effect is a batch of one (`effect_dispatch_once`). Each step is its own transaction; a crash anywhere leaves a state
the crash rules recover from (docs/architecture.md). A step that fails deterministically for the batch is tried
again on each half of it, until the effect at fault stands alone and is quarantined (or held) with
EFFECT_STEP_FAILED (D-168, D-530); a refusal or a transient failure writes nothing."""
from __future__ import annotations

import logging
import os
import socket
import uuid
from functools import partial

from django.conf import settings

from connector import logcontext
from connector.choices import SweepStep
from connector.errors import ConnectorError
from connector.faults import fault_point
from connector.services import poison
from effects import egress_batch, settlement
from effects.choices import EffectState
from effects.models import ProcessGeneration, RemoteEffect
from effects.services import dispatch, dispatch_batch, identity, liveness
from effects.services.poison import effect_quarantine

log = logging.getLogger(__name__)
_HOLDER_ID: str | None = None


def holder_id() -> str:
    """This process generation's identity: host, pid and a boot nonce (a restarted pid is a new generation; so is
    the next one after this process gave its generation up, `settlement.give_up`)."""
    global _HOLDER_ID
    if _HOLDER_ID is None or settlement.given_up(_HOLDER_ID):
        _HOLDER_ID = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return _HOLDER_ID


def _left_open(effect: RemoteEffect) -> bool:
    """The step is over and its effect is still `dispatching` without a hold: its permit is open (granted, or
    sending with its settlement lost); only giving up the generation closes it (D-425)."""
    return effect.state == EffectState.DISPATCHING and not effect.quarantine_reason


def _stranded(holder: ProcessGeneration, what: str) -> None:
    """A step left one of its own permits open: its marker, send or settlement failed (the database lost, or a
    defect), and nothing else ever closes a permit of a running generation (issue 37 item 3, D-425). The process
    gives its generation up (tried again until it lands): its permits are abandoned with that proof (`granted` ->
    prepared, `sending` -> uncertain)."""
    settlement.give_up(holder.holder_id, evidence=f"{what} failed and left its permits open")


def _isolated(step: str, effect_pk: int) -> poison.Isolated:
    return poison.isolated(step=step, item=f"effect {effect_pk}",
                           quarantine=partial(effect_quarantine, effect_pk=effect_pk, step=step))


def _holder(holder_name: str | None) -> ProcessGeneration:
    holder = dispatch.holder_register(holder_id=holder_name or holder_id())
    dispatch.holder_heartbeat(holder_id=holder.holder_id)
    return holder


@logcontext.fresh  # issue 21: the ids this step notes end with it
def effect_dispatch_once(*, holder_name: str | None = None, account_id: int | None = None,
                         holder: ProcessGeneration | None = None) -> RemoteEffect | None:
    """The worker step for a batch of one: one limited destination's due effect if any (its limiter admitting it),
    else one unlimited effect. None when nothing was claimable or the claim was refused; the effect otherwise (also
    when one of its steps failed and it was quarantined or held). `holder`: already registered and heartbeaten."""
    holder = holder or _holder(holder_name)
    for limited in (True, False):
        done = _batch_step(holder=holder, n=1, account_id=account_id, limited=limited)
        if done:
            logcontext.note(effect_id=done[0].pk)
            return done[0]
    return None


def egress_batch_size() -> int:
    """`CONNECTOR["EGRESS_BATCH"]` (default 10, at least 1): effects per worker step (a tuning knob: one path for one
    effect or many, D-531). Its multi-effect statements are not routable by account until the permits, attempts and
    audit rows carry the account column (`connector.placement.KNOWN_UNROUTABLE`)."""
    return max(1, int(settings.CONNECTOR.get("EGRESS_BATCH", 10)))


@logcontext.fresh
def effect_dispatch_batch(*, n: int | None = None, holder_name: str | None = None,
                          account_id: int | None = None) -> list[RemoteEffect]:
    """One worker step (see the module): limited batches first, while their tokens last (each stops at its
    limiter's admission, so a declared rate is a ceiling that cannot starve the unlimited destinations; taken first,
    a token due while this worker sends an unlimited batch is not lost to the bucket's small burst, D-400), then one
    batch of up to `n` unlimited effects of one account. Returns the effects the step handled ([] when nothing was
    claimable)."""
    n = egress_batch_size() if n is None else max(1, n)
    holder = _holder(holder_name)
    done: list[RemoteEffect] = []
    while len(done) < n:
        limited = _batch_step(holder=holder, n=n, account_id=account_id, limited=True)
        if not limited:
            break
        done += limited
    return done + _batch_step(holder=holder, n=n, account_id=account_id, limited=False)


def _batch_step(*, holder: ProcessGeneration, n: int, account_id: int | None,
                limited: bool) -> list[RemoteEffect]:
    """One batch: claim + permits, send, settle (see the module). Returns the effects handled, those quarantined
    by the claim included."""
    try:
        candidates = dispatch_batch.claim_candidates(n=n, account_id=account_id, limited=limited)
    except settlement.LOST as exc:
        log.info("claim candidates not read: %s: %s", type(exc).__name__, exc)
        return []
    permits, failed = _claim(holder, candidates, n)
    done = [RemoteEffect.objects.get(pk=pk) for pk in failed]
    if not permits:
        return done
    settled = _send(holder, permits)
    try:
        read = {p.effect_pk: settled.get(p.effect_pk) or RemoteEffect.objects.get(pk=p.effect_pk,
                                                                                account_id=p.account_id)
                for p in permits}
    except settlement.LOST:
        read = {}
    if not read or any(_left_open(e) for e in read.values()):
        _stranded(holder, "a batch's send")  # its permits are closed now; read them again
        read = {p.effect_pk: RemoteEffect.objects.get(pk=p.effect_pk, account_id=p.account_id) for p in permits}
    for p in permits:
        effect = read[p.effect_pk]
        if effect.state == EffectState.REMOTE_CONFIRMED and not effect.quarantine_reason:
            fault_point("dispatch.after_confirmed")  # finalization held in the settlement: again (D-336)
            effect = effect_finalize_from_evidence(effect.pk, account_id=effect.account_id)
        done.append(effect)
    return done


def _claim(holder: ProcessGeneration, candidates: list[dispatch_batch.Candidate],
           n: int) -> tuple[list[dispatch_batch.BatchPermit], list[int]]:
    """Up to `n` of the candidates claimed and granted in one transaction (see the module). A claim that fails
    deterministically rolled back: each half is claimed again (the second for what the first did not take), until
    the effect at fault stands alone and is quarantined (EFFECT_STEP_FAILED, D-530). Returns the permits granted
    and the effects quarantined; a refusal or a transient failure of the claim writes nothing and grants nothing."""
    if not candidates or n <= 0:
        return [], []
    try:
        return dispatch_batch.effects_claim_batch(holder=holder, n=n, candidates=candidates,
                                                  lease_seconds=settings.CONNECTOR["LEASE_SECONDS"]), []
    except Exception as exc:  # noqa: BLE001 - classified: a defect is split until the effect at fault stands alone
        if poison.classify(exc) != poison.FAILED:
            log.info("effects_claim_batch deferred: %s: %s", type(exc).__name__, exc)
            return [], []
        if len(candidates) == 1:
            with _isolated(SweepStep.PERMIT_ACQUIRE, candidates[0].effect_pk) as step:
                raise exc
            return [], ([candidates[0].effect_pk] if step.failure == poison.FAILED else [])
        poison.log_fallback(log, exc, "the claim of %d effects failed; claiming each half again", len(candidates))
    half = len(candidates) // 2
    first = _claim(holder, candidates[:half], n)
    second = _claim(holder, candidates[half:], n - len(first[0]))
    return first[0] + second[0], first[1] + second[1]


def _send(holder: ProcessGeneration, permits: list[dispatch_batch.BatchPermit]) -> dict[int, RemoteEffect]:
    """The batch's markers, exchanges and settlements (`egress_batch.send_batch`). A failure outside the per-item
    isolation: the database lost around the markers gives the generation up (nothing more is sent by it); any other
    sends each half again (a permit already marked `sending` is refused by its marker: nothing is sent twice), until
    the permit at fault stands alone and is held. Returns the settled effects by pk (the others are read back)."""
    try:
        return egress_batch.send_batch(permits=permits, holder_id=holder.holder_id)
    except settlement.LOST:
        _stranded(holder, "a batch's sending markers")
        return {}
    except Exception as exc:  # noqa: BLE001 - split until the permit at fault stands alone
        if len(permits) == 1:
            with _isolated(SweepStep.EFFECT_SEND, permits[0].effect_pk):
                raise exc
            return {}
        poison.log_fallback(log, exc, "the send of %d permits failed; sending each half again", len(permits))
    half = len(permits) // 2
    return _send(holder, permits[:half]) | _send(holder, permits[half:])


def effect_finalize_from_evidence(effect_pk: int, *, account_id: int | None = None) -> RemoteEffect:
    """`account_id` (the worker's, from the effect it settled) names the effect's shard in the first read too."""
    effects = RemoteEffect.objects.select_related("command")
    if account_id is not None:
        effects = effects.filter(account_id=account_id, command__account_id=account_id)
    effect = effects.get(pk=effect_pk)
    slot = identity.effect_slot(effect)
    with _isolated(SweepStep.EFFECT_FINALIZE, effect_pk) as step:
        try:
            return dispatch.effect_finalize(effect_pk=effect_pk, owner_slot=slot, account_id=effect.account_id)
        except ConnectorError as exc:
            log.warning("finalization held for an operator", extra={"effect": effect_pk, "code": exc.code})
    return RemoteEffect.objects.get(pk=effect_pk) if step.failure != poison.TRANSIENT else effect


def effects_sweep() -> dict[str, int]:
    """Due outbound work from PostgreSQL: confirmed effects to finalize (never redispatched; held ones
    excepted) and the count of claimable prepared effects (free or expired lease, heading their owner slot,
    D-441)."""
    from django.db.models import Q
    from django.utils import timezone

    finalized = 0
    for pk, account_pk in RemoteEffect.objects.filter(state=EffectState.REMOTE_CONFIRMED, quarantine_reason="") \
            .values_list("pk", "account_id")[:200]:  # each item is then its account's single-shard step
        if effect_finalize_from_evidence(pk, account_id=account_pk).state == EffectState.FINALIZED:
            finalized += 1
    liveness.dead_holders_isolate()  # a worker that died on this host leaves nothing dispatching for good
    now = timezone.now()
    claimable = identity.slot_heads(RemoteEffect.objects.filter(  # a push waiting behind its slot's earlier one
        Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now), dispatch.due(now),
        state=EffectState.PREPARED)).count()
    return {"finalized": finalized, "claimable": claimable}
