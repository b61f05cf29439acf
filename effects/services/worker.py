"""The dispatch worker loop: claim a prepared effect and acquire its permit (one transaction), send through the
sole egress adapter, settle and finalize a confirmed effect (one transaction). Each step is its own transaction; a
crash anywhere leaves a state the seed's crash rules recover from (docs/architecture.md). Each step runs isolated
(decision D-168): a deterministic failure quarantines (or holds) that effect with EFFECT_STEP_FAILED and the loop
moves on to the next one. The egress task's step is `effect_dispatch_batch` (issue 20, D-345..D-350): the same
three transactions for a batch of one account's unlimited effects, then one limited destination's effect alone."""
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
from effects import egress, settlement
from effects.choices import EffectState
from effects.models import ProcessGeneration, RemoteEffect
from effects import egress_batch
from effects.services import dispatch, dispatch_batch, dispatch_together, dispatch_withdraw, identity, liveness
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


@logcontext.fresh  # issue 21: the ids this claim notes end with it
def effect_dispatch_once(*, holder_name: str | None = None, account_id: int | None = None,
                         limited_only: bool = False, holder: ProcessGeneration | None = None) -> RemoteEffect | None:
    """Claim and acquire a permit (one transaction, D-335), send (the committed `sending` marker, then the one
    HTTP exchange), settle and finalize (one transaction, D-336) one effect. None when nothing was claimable or
    the permit was refused; the effect otherwise (also when one of its steps failed and it was quarantined or
    held). A destination whose limiter refuses (D-222) is passed over by the same scan, its effect left
    `prepared` and claimable, so other destinations keep moving. `limited_only` (the batched step's companion,
    D-350): only effects of destinations that declare a limit; `holder` (the batched step's): already registered
    and heartbeaten."""
    if holder is None:
        holder = dispatch.holder_register(holder_id=holder_name or holder_id())
        dispatch.holder_heartbeat(holder_id=holder.holder_id)
    granted = dispatch_together.effect_claim_and_permit(
        holder=holder, lease_seconds=settings.CONNECTOR["LEASE_SECONDS"], account_id=account_id,
        limited_only=limited_only)
    if granted is None:
        return None
    logcontext.note(effect_id=granted.effect_pk)
    if granted.failed:
        return RemoteEffect.objects.get(pk=granted.effect_pk)
    claim, permit = granted.claim, granted.permit
    effect = None
    with _isolated(SweepStep.EFFECT_SEND, claim.effect_pk):
        effect = egress.send(permit_pk=permit.pk, holder_id=holder.holder_id, holder_fence=permit.holder_fence,
                             credential_gate_fence=permit.credential_gate_fence, effect_pk=permit.effect_id,
                             account_id=claim.account_id, finalize=True,
                             credential_generation_pk=permit.credential_gate.credential_generation_id,
                             limiter_pk=permit.limiter_id)
    if effect is None:  # refused or failed before any byte: withdrawn while its destination is deferred (D-402),
        # abandoned with its proof after a revocation (D-399); a permit still open then is given up (D-425)
        try:
            withdrawn = permit.limiter_id is not None and dispatch_withdraw.permits_withdraw(permits=[
                dispatch_batch.BatchPermit(permit.pk, permit.effect_id, permit.attempt_id, claim.account_id,
                                           permit.holder_fence, permit.credential_gate_fence,
                                           permit.credential_gate.credential_generation_id, permit.limiter_id)],
                holder_id=holder.holder_id)
            if not withdrawn:
                dispatch_withdraw.permits_abandon_fenced_out([permit.pk])
            effect = RemoteEffect.objects.get(pk=claim.effect_pk)
        except settlement.LOST:
            effect = None
        if effect is None or _left_open(effect):
            _stranded(holder, f"the send of effect #{claim.effect_pk}")
            effect = RemoteEffect.objects.get(pk=claim.effect_pk)
        return effect
    if effect.state == EffectState.REMOTE_CONFIRMED and not effect.quarantine_reason:
        # The finalization inside the settlement's transaction failed (its savepoint rolled back, D-336): the
        # settlement committed; finalize again from the attempt evidence (the sweeper would too).
        fault_point("dispatch.after_confirmed")
        effect = effect_finalize_from_evidence(effect.pk, account_id=effect.account_id)
    return effect


def egress_batch_size() -> int:
    """`CONNECTOR["EGRESS_BATCH"]` (default 10): effects per batched worker step; 0 or 1 keeps the one-by-one step.
    The Citus configuration (`CLAIM_SCOPE` "account", D-264) keeps the one-by-one step: the batch's statements name
    several effects' permits and attempts, tables that reach their shard only through one parent row until they
    carry the account column (`connector.placement.SINGLE_NODE_ONLY`, D-396)."""
    if settings.CONNECTOR.get("CLAIM_SCOPE") == "account":
        return 1
    return int(settings.CONNECTOR.get("EGRESS_BATCH", 10))


@logcontext.fresh
def effect_dispatch_batch(*, n: int | None = None, holder_name: str | None = None,
                          account_id: int | None = None) -> list[RemoteEffect]:
    """One batched worker step (issue 20, D-345..D-350): up to `n` `prepared` effects of one account whose
    destinations declare no limit are claimed and granted in one transaction
    (`dispatch_batch.effects_claim_batch`), their `sending` markers committed in one transaction before any byte,
    each sent once through the sole egress adapter, and their confirmed settlements and finalizations committed in
    one transaction (`egress_batch.send_batch`); then a batch of ONE limited destination (in rotation, D-372): its
    effects claimed with the limiter `FOR UPDATE` admitting at most min(tokens, half the free slots), each sent behind its
    own marker that refuses while the receiver deferred the destination (D-371). A batch claim that fails
    deterministically rolled back: its effects then take the one-by-one step, whose isolation (D-168)
    quarantines the one at fault; a refusal or a transient failure of the claim writes nothing. Returns the effects
    the step handled ([] when nothing was claimable)."""
    n = egress_batch_size() if n is None else n
    holder = dispatch.holder_register(holder_id=holder_name or holder_id())
    dispatch.holder_heartbeat(holder_id=holder.holder_id)
    done: list[RemoteEffect] = []
    while len(done) < n:  # limited batches first, while their tokens last (each stops at its limiter's admission,
        # so a declared rate is a ceiling that cannot starve the unlimited destinations; taken first, a token due
        # while this worker sends an unlimited batch is not lost to the bucket's small burst, D-400)
        limited = _batch_step(holder=holder, n=n, account_id=account_id, limited=True)
        if limited is None:
            limited = _one_by_one(holder=holder, n=1, account_id=account_id, limited_only=True)
        if not limited:
            break
        done += limited
    unlimited = _batch_step(holder=holder, n=n, account_id=account_id, limited=False)
    if unlimited is None:
        return done + _one_by_one(holder=holder, n=n, account_id=account_id, limited_only=False)
    return done + unlimited


def _one_by_one(*, holder: ProcessGeneration, n: int, account_id: int | None,
                limited_only: bool) -> list[RemoteEffect]:
    """After a batch claim failed deterministically (rolled back): its effects take the one-by-one step, whose
    isolation (D-168) quarantines the one at fault."""
    done = []
    for _ in range(max(n, 1)):
        one = effect_dispatch_once(holder=holder, account_id=account_id, limited_only=limited_only)
        if one is None:
            break
        done.append(one)
    return done


def _batch_step(*, holder: ProcessGeneration, n: int, account_id: int | None,
                limited: bool) -> list[RemoteEffect] | None:
    """One batch: claim + permits, send, settle (see effect_dispatch_batch). None: the claim failed
    deterministically and rolled back (the caller falls back to the one-by-one step)."""
    try:
        permits = dispatch_batch.effects_claim_batch(holder=holder, n=n, account_id=account_id, limited=limited,
                                                     lease_seconds=settings.CONNECTOR["LEASE_SECONDS"])
    except Exception as exc:  # noqa: BLE001 - classified below; the one-by-one path isolates the item at fault
        if poison.classify(exc) == poison.FAILED:
            log.exception("effects_claim_batch failed; falling back to the one-by-one step")
            return None
        log.info("effects_claim_batch deferred: %s: %s", type(exc).__name__, exc)
        return []
    done: list[RemoteEffect] = []
    if permits:
        try:
            settled = egress_batch.send_batch(permits=permits, holder_id=holder.holder_id)
        except settlement.LOST:  # the database failed around the markers: nothing more is sent by this generation
            _stranded(holder, "a batch's sending markers")
            settled = {}
        except Exception:  # noqa: BLE001 - each permit takes the one-by-one send, whose committed CAS is the guard
            log.exception("the batched send failed; sending each permit alone")
            settled = {p.effect_pk: e for p in permits if (e := _send_one(p, holder.holder_id)) is not None}
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


def _send_one(p: dispatch_batch.BatchPermit, holder_id: str) -> RemoteEffect | None:
    """A batch's permit through `egress.send` under isolation (D-350): a permit the batch already moved to
    `sending` is refused there (only the one caller that won the CAS sends), so nothing is ever sent twice."""
    with _isolated(SweepStep.EFFECT_SEND, p.effect_pk):
        return egress.send(permit_pk=p.permit_pk, holder_id=holder_id, holder_fence=p.holder_fence,
                           credential_gate_fence=p.credential_gate_fence, effect_pk=p.effect_pk,
                           account_id=p.account_id, finalize=True, credential_generation_pk=p.credential_generation_pk)
    return None


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
