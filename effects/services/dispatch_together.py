"""The worker's fused outbound transactions (issue 20, decisions D-335..D-337).

- `effect_claim_and_permit`: the claim and the DispatchPermit in ONE transaction, in the canonical lock order
  (docs/locking.md): the serving guard (epoch, account gate FOR SHARE), the credential dispatch gate (FOR SHARE),
  the effect (FOR UPDATE SKIP LOCKED), the destination limiter (FOR UPDATE, a limited destination only), then
  the holder (FOR SHARE) and the inserts (Attempt, permit). The checks are those of `effect_claim` and
  `permit_acquire` together; a limiter refusal writes the limiter's refusal and nothing else (no Attempt, no
  lease: the effect stays `prepared` and claimable, nothing granted), and the scan passes that destination over.
- `permit_settle_and_finalize`: a `sending` permit's settlement and, when it proves `remote_confirmed`, the
  effect's finalization (RemoteLink to the proven identity, `remote_confirmed -> finalized`) in ONE
  transaction; the finalization runs in a savepoint, so its refusal or failure never loses the settlement: the
  settlement commits whatever happens to it, a RemoteLink conflict is marked as `effect_finalize` marks it, and
  any other failure leaves the effect `remote_confirmed` for the worker's retry or the sweeper.

The committed `granted -> sending` marker (effects.egress._win_sending) stays its own transaction before any byte.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.db import transaction
from django.utils import timezone

from connector import stage_metrics
from connector.choices import SweepStep
from connector.errors import ConnectorError
from connector.faults import fault_point
from connector.selectors import locks as connector_locks
from connector.services import poison
from connector.services.audit import audit_record
from connector.services.guard import lock_serving
from connector.services.secrets import secret_version_exists
from effects import locks
from effects.choices import EffectState, HolderState
from effects.errors import PermitRefused, ProviderIoHeld, ReconcileRefused
from effects.models import DispatchPermit, OutboundCommand, ProcessGeneration, RemoteEffect, RemoteEffectAttempt
from effects.services import dispatch
from effects.services.limiter import limiter_admit, limiter_granted, limiter_refused
from effects.services.poison import effect_quarantine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Granted:
    """What `effect_claim_and_permit` took: the claim and its `granted` permit; or (failed) the effect whose
    step failed deterministically and was quarantined (EFFECT_STEP_FAILED), with neither."""
    effect_pk: int
    claim: dispatch.EffectClaim | None = None
    permit: DispatchPermit | None = None
    failed: bool = False


_STOP = object()  # a refusal (gate, holder, provider I/O held): end the scan with nothing, as permit_acquire did


def effect_claim_and_permit(*, holder: ProcessGeneration, lease_seconds: int = 60,
                            account_id: int | None = None, limited_only: bool = False) -> Granted | None:
    """Claim one `prepared` effect and grant its permit in one transaction (see the module). None when nothing
    was claimable, or a refusal (credential gate not `enabled`, holder not running, provider I/O held, a
    transient error) ended the scan; every refusal rolls back, so nothing of the claim survives it. Each
    candidate runs isolated (D-168): a deterministic failure quarantines that effect and is returned `failed`."""
    def take(pk: int, acct: int, generation_pk: int):
        with poison.isolated(step=SweepStep.PERMIT_ACQUIRE, item=f"effect {pk}",
                             quarantine=partial(effect_quarantine, effect_pk=pk,
                                                step=SweepStep.PERMIT_ACQUIRE)) as step:
            return _claim_and_permit_one(holder=holder, pk=pk, acct=acct, generation_pk=generation_pk,
                                         lease_seconds=lease_seconds)
        return Granted(pk, failed=True) if step.failure == poison.FAILED else _STOP

    answer = dispatch.claim_scan(account_id=account_id, take=take, limited_only=limited_only)
    return None if answer is _STOP else answer


def _claim_and_permit_one(*, holder: ProcessGeneration, pk: int, acct: int, generation_pk: int,
                          lease_seconds: int):
    deferred = None
    with transaction.atomic():
        ctx = lock_serving(account_id=acct)
        if ctx.provider_io_held:  # read with the epoch row the guard holds FOR SHARE (D-321)
            raise ProviderIoHeld(f"epoch {ctx.epoch_id} is active but its first activation is not read back yet; "
                                 "provider I/O is disabled")
        credential_gate = connector_locks.credential_gate_for_share(generation_pk)
        effect = locks.effect_for_update(pk, skip_locked=True, account_id=acct)
        now = timezone.now()
        if (effect is None or effect.state != EffectState.PREPARED or dispatch.not_due(effect, now)
                or (effect.lease_expires_at is not None and effect.lease_expires_at >= now)):
            return None
        command = OutboundCommand.objects.select_related("credential_generation").get(
            pk=effect.command_id, account_id=acct)
        if command.credential_generation_id != generation_pk:  # frozen on the command: never moves
            return None
        if not secret_version_exists(command.credential_generation.secret_version_ref):
            effect.quarantine(reason="CREDENTIAL_MATERIAL_MISSING")
            effect.save()
            audit_record(actor=dispatch.DISPATCHER, entity=effect, action="effect_quarantine",
                         from_state=EffectState.PREPARED, to_state=effect.state,
                         reason="frozen credential secret version is absent; never falls forward")
            return None
        if credential_gate.mode != "enabled":
            raise PermitRefused(f"credential generation dispatch gate is {credential_gate.mode}")
        limiter = locks.limiter_for_update(command.limiter_id) if command.limiter_id is not None else None
        holder_row = locks.holder_for_share(holder.pk)
        if holder_row.state != HolderState.RUNNING:
            raise PermitRefused(f"holder generation {holder_row.holder_id} is {holder_row.state}")
        if limiter is not None:
            admitted, retry_at, reason, cause = limiter_admit(limiter, command, now)
            if not admitted:  # the refusal's limiter writes only: no Attempt, no lease, nothing granted
                limiter_refused(limiter=limiter, retry_at=retry_at, now=now)
                stage_metrics.rate_limit_deferred(callout=limiter.callout, cause=cause)  # counted after the commit
                deferred = reason
        if deferred is None:
            permit = _grant(ctx=ctx, credential_gate=credential_gate, effect=effect, command=command,
                            holder=holder_row, limiter=limiter, now=now, lease_seconds=lease_seconds)
            fault_point("dispatch.claim_permit_before_commit")
    if deferred is not None:
        log.info("destination deferred the claim", extra={"effect": pk, "reason": deferred})
        return dispatch.CLOSED
    return Granted(pk, dispatch.EffectClaim(pk, permit.attempt_id, permit.holder_fence, holder_row.pk, acct), permit)


def _grant(*, ctx, credential_gate, effect: RemoteEffect, command: OutboundCommand, holder: ProcessGeneration,
           limiter, now: datetime, lease_seconds: int) -> DispatchPermit:
    """The claim's Attempt and lease and the `granted` permit; one UPDATE of the effect (lease and
    `prepared -> dispatching`)."""
    ordinal, fence = effect.attempt_count + 1, effect.lease_fence + 1
    expires = now + timedelta(seconds=lease_seconds)
    attempt = RemoteEffectAttempt.objects.create(
        effect=effect, ordinal=ordinal, holder=holder, lease_fence=fence, epoch_id=command.epoch_id,
        credential_generation_id=command.credential_generation_id, request_digest=bytes(command.request_digest),
        provider_idempotency_key=command.provider_idempotency_key, lease_expires_at=expires)
    permit = DispatchPermit.objects.create(
        attempt=attempt, effect=effect, gate_id=ctx.gate_pk, gate_fence=ctx.fence, credential_gate=credential_gate,
        credential_gate_fence=credential_gate.fence, holder=holder, holder_fence=fence, limiter=limiter)
    if limiter is not None:
        limiter_granted(limiter=limiter, command=command)
    effect.attempt_count, effect.lease_fence = ordinal, fence
    effect.lease_holder, effect.lease_expires_at = holder.holder_id, expires
    effect.dispatch()
    effect.save()
    audit_record(actor=dispatch.DISPATCHER, entity=permit, action="permit_acquire", to_state=permit.state,
                 fence=credential_gate.fence)
    return permit


def permit_settle_and_finalize(*, permit_pk: int, effect_pk: int, account_id: int, owner_slot: str,
                               commanded_at: datetime | None, callout: str, **settlement) -> RemoteEffect:
    """`permit_settle` and, for a `remote_confirmed` outcome, the finalization in the same transaction (see the
    module); `settlement` is permit_settle's outcome arguments. `commanded_at` and `callout` (the command's, for
    the command -> finalized latency metric) come from the command the caller read."""
    with transaction.atomic():
        effect = locks.effect_for_update(effect_pk, account_id=account_id)
        if effect is None:
            raise PermitRefused(f"permit #{permit_pk} does not belong to effect #{effect_pk} of that account")
        effect = dispatch.settle_locked(effect=effect, permit_pk=permit_pk, **settlement)
        if effect.state == EffectState.REMOTE_CONFIRMED:
            effect.commanded_at, effect.callout = commanded_at, callout
            try:
                with transaction.atomic():  # the savepoint: the settlement above commits whatever happens here
                    effect = dispatch.finalize_locked(effect, owner_slot)
                    fault_point("dispatch.finalize_in_settlement")
            except ReconcileRefused as exc:
                if exc.context.get("conflict"):
                    dispatch.mark_link_conflict(effect, exc.detail)
                effect = RemoteEffect.objects.get(pk=effect_pk)  # as committed: the savepoint rolled back
                log.warning("finalization held for an operator", extra={"effect": effect_pk, "code": exc.code})
            except Exception as exc:  # noqa: BLE001 - never lose the settlement: the sweeper finalizes it later
                effect = RemoteEffect.objects.get(pk=effect_pk)
                level = log.warning if isinstance(exc, ConnectorError) else log.exception
                level("finalization in the settlement failed; left remote_confirmed",
                      extra={"effect": effect_pk, "error": type(exc).__name__})
            fault_point("dispatch.settle_finalize_before_commit")
    return effect
