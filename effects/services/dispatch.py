"""Effect claims, DispatchPermit acquisition, settlement, abandonment, finalization and reconciliation.

Lock order (docs/locking.md): epoch, account gate (the guard, FOR SHARE), credential dispatch gate (FOR SHARE —
revocation takes FOR UPDATE, so they serialize), then entity rows: effect, destination limiter (only a destination
that declares a limit), permit, holder.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.db import IntegrityError, connection, transaction
from django.db.models import F, FilteredRelation, Q
from django.utils import timezone

from connector.selectors import locks as connector_locks
from connector import stage_metrics
from connector.actors import Actor
from connector.choices import SweepStep
from connector.errors import ConnectorError, PermissionRefused, StateTokenInvalid
from connector.services.secrets import secret_version_exists
from connector.services import poison
from connector.services.audit import audit_record
from connector.services.guard import lock_serving
from effects import locks
from effects.choices import AttemptOutcome, EffectState, HolderState, NoEffectReason, PermitState
from effects.errors import AbandonRefused, DestinationDeferred, PermitRefused, ProviderIoHeld, ReconcileRefused
from effects.models import (
    DestinationLimiter,
    DispatchPermit,
    OutboundCommand,
    ProcessGeneration,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteLink,
)
from effects.services import identity
from effects.services.limiter import destination_open as _destination_open, limiter_admit as _limiter_admit
from effects.services.limiter import limiter_granted, limiter_refused
from effects.services import retry
from effects.services.poison import effect_quarantine
from effects.services.holders import holder_heartbeat, holder_register, holder_terminate  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)
DISPATCHER = Actor.system("dispatcher")


# -- claim and permit --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EffectClaim:
    effect_pk: int
    attempt_pk: int
    lease_fence: int
    holder_pk: int
    account_id: int | None = None  # the effect's account: the permit's reads name it (docs/scale-out.md)


CLAIM_ROUNDS = 3


def effect_claim(*, holder: ProcessGeneration, lease_seconds: int = 60,
                 account_id: int | None = None) -> EffectClaim | None:
    """Claim one `prepared` effect whose lease is free or expired: guard, then the effect `FOR UPDATE SKIP
    LOCKED`; append an Attempt bound to the command's frozen epoch, request and credential generation. A claim
    authorizes no I/O (CV2-10-031). Missing secret material quarantines the effect (CV2-10-013). Effects of a
    destination that cannot admit a permit now (deferred, bucket empty until `not_before`, or its in-flight
    maximum reached) are passed over without a write, so the worker moves on to other destinations (D-222)."""
    return claim_scan(account_id=account_id, take=lambda pk, acct, _generation: _claim_one(
        holder=holder, pk=pk, acct=acct, lease_seconds=lease_seconds))


def due(now: datetime) -> Q:
    """A prepared effect's scheduled next attempt (D-421) is due: claims and the sweeper's count alike."""
    return Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)


CLOSED = object()  # take()'s answer when the destination refused under its lock: pass the destination over


def claim_scan(*, account_id: int | None, take, limited_only: bool = False):
    """The claim's candidate scan (effect_claim): up to CLAIM_ROUNDS pages of 20
    claimable `prepared` effects in pk order, passing over destinations whose unlocked hint says they cannot
    admit a permit now; `take(pk, account_id, credential_generation_pk)` is tried on each and its first non-None
    answer returned (CLOSED closes that candidate's destination for the rest of the scan). `limited_only`: only
    effects of destinations that declare a limit (the batched worker step takes the others, D-350). Only the
    effect that heads its owner slot is a candidate (`identity.slot_head_sql`, D-441)."""
    now = timezone.now()
    base = identity.slot_heads(RemoteEffect.objects.filter(
        Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now), due(now), state=EffectState.PREPARED))
    if limited_only:
        base = base.filter(command__limiter__isnull=False)
    if account_id is None:
        base = base.exclude(command__limiter__not_before__gt=now)
    else:  # the joined command and limiter name the account too: the read is the account's shard's
        base = (base.filter(account_id=account_id, command__account_id=account_id)
                .annotate(routed_limiter=FilteredRelation("command__limiter",
                                                          condition=Q(command__limiter__account_id=account_id)))
                .exclude(routed_limiter__not_before__gt=now))
    closed: set[int] = set()
    for _round in range(CLAIM_ROUNDS):
        qs = base.exclude(command__limiter_id__in=closed) if closed else base
        rows = list(qs.order_by("pk").values_list("pk", "account_id", "command__limiter_id",
                                                  "command__rate_max_in_flight",
                                                  "command__credential_generation_id")[:20])
        closed_before = len(closed)
        for pk, acct, limiter_pk, max_in_flight, generation_pk in rows:
            if limiter_pk is not None and (limiter_pk in closed
                                           or not _destination_open(limiter_pk, max_in_flight, timezone.now())):
                closed.add(limiter_pk)
                continue
            answer = take(pk, acct, generation_pk)
            if answer is CLOSED:
                closed.add(limiter_pk)
            elif answer is not None:
                return answer
        if len(closed) == closed_before or len(rows) < 20:
            return None
    return None


def not_due(effect: RemoteEffect, now: datetime) -> bool:
    """The locked effect's scheduled next attempt (D-421) is still ahead: no claim takes it yet."""
    return effect.next_attempt_at is not None and effect.next_attempt_at > now


def _claim_one(*, holder: ProcessGeneration, pk: int, acct: int, lease_seconds: int) -> EffectClaim | None:
    claim = None
    # A ConnectorError (the gate moved) skips the candidate; a deterministic failure quarantines it
    # (EFFECT_STEP_FAILED) so the next claim does not meet it again (decision D-168).
    with poison.isolated(step=SweepStep.EFFECT_CLAIM, item=f"effect {pk}",
                         quarantine=partial(effect_quarantine, effect_pk=pk, step=SweepStep.EFFECT_CLAIM)):
        with transaction.atomic():
            lock_serving(account_id=acct)
            effect = locks.effect_for_update(pk, skip_locked=True, account_id=acct)
            now = timezone.now()
            if (effect is None or effect.state != EffectState.PREPARED or not_due(effect, now)
                    or (effect.lease_expires_at is not None and effect.lease_expires_at >= now)):
                return None
            command = OutboundCommand.objects.select_related("credential_generation").get(
                pk=effect.command_id, account_id=acct)
            if not secret_version_exists(command.credential_generation.secret_version_ref):
                effect.quarantine(reason="CREDENTIAL_MATERIAL_MISSING")
                effect.save()
                audit_record(actor=DISPATCHER, entity=effect, action="effect_quarantine",
                             from_state=EffectState.PREPARED, to_state=effect.state,
                             reason="frozen credential secret version is absent; never falls forward")
                return None
            ordinal, fence = effect.attempt_count + 1, effect.lease_fence + 1
            expires = now + timedelta(seconds=lease_seconds)
            attempt = RemoteEffectAttempt.objects.create(
                effect=effect, ordinal=ordinal, holder=holder, lease_fence=fence, epoch_id=command.epoch_id,
                credential_generation_id=command.credential_generation_id,
                request_digest=bytes(command.request_digest),
                provider_idempotency_key=command.provider_idempotency_key, lease_expires_at=expires)
            RemoteEffect.objects.filter(pk=pk, account_id=acct).update(attempt_count=ordinal, lease_fence=fence,
                                                      lease_holder=holder.holder_id, lease_expires_at=expires)
            claim = EffectClaim(pk, attempt.pk, fence, holder.pk, acct)
    return claim


def permit_acquire(*, claim: EffectClaim) -> DispatchPermit:
    """One transaction: the guard (gate `v2_serving`, exact active epoch, FOR SHARE), the exact credential
    dispatch gate (FOR SHARE, must be `enabled`; its fence is copied), the effect (FOR UPDATE, `prepared`, lease
    fence and holder equal to the claim's); for a destination that declares a limit, its limiter (FOR UPDATE)
    must admit the permit (D-222); record a `granted` permit (joining the gate's open-permit set) and move the
    effect to `dispatching` (CV2-10-037, CV2-04-006).

    A limiter refusal grants nothing: in the same transaction the claim's lease is released and its attempt
    closed `no_effect` ("deferred by the destination limiter, nothing sent"; it never counts against the
    policy's attempts), the limiter records the refusal and, for a time-bound refusal, `not_before`; then
    DestinationDeferred is raised after the commit. The effect stays `prepared` and claimable."""
    effects = RemoteEffect.objects.select_related("command")
    if claim.account_id is not None:  # the claim carries the account: both tables of the read name it
        effects = effects.filter(account_id=claim.account_id, command__account_id=claim.account_id)
    effect = effects.get(pk=claim.effect_pk)
    command = effect.command
    deferred = None
    with transaction.atomic():
        ctx = lock_serving(account_id=effect.account_id)
        if ctx.provider_io_held:  # read with the epoch row the guard holds FOR SHARE: no extra statement (D-321)
            raise ProviderIoHeld(f"epoch {ctx.epoch_id} is active but its first activation is not read back yet; "
                                 "provider I/O is disabled")
        credential_gate = connector_locks.credential_gate_for_share(command.credential_generation_id)
        effect = locks.effect_for_update(claim.effect_pk, account_id=effect.account_id)
        limiter = locks.limiter_for_update(command.limiter_id) if command.limiter_id is not None else None
        holder = locks.holder_for_share(claim.holder_pk)
        if credential_gate.mode != "enabled":
            raise PermitRefused(f"credential generation dispatch gate is {credential_gate.mode}")
        if effect.state != EffectState.PREPARED or effect.lease_fence != claim.lease_fence:
            raise PermitRefused(f"effect is {effect.state} with lease fence {effect.lease_fence}, not the claim's")
        if holder.state != HolderState.RUNNING or effect.lease_holder != holder.holder_id:
            raise PermitRefused("the holder no longer owns this effect's lease")
        if limiter is not None:
            now = timezone.now()
            admitted, retry_at, reason, cause = _limiter_admit(limiter, command, now)
            if not admitted:
                _defer_claim(limiter=limiter, claim=claim, retry_at=retry_at, reason=reason, now=now)
                stage_metrics.rate_limit_deferred(callout=limiter.callout, cause=cause)  # counted after the commit
                deferred = reason
        if deferred is None:
            try:
                with transaction.atomic():
                    permit = DispatchPermit.objects.create(
                        attempt_id=claim.attempt_pk, effect=effect, gate_id=ctx.gate_pk, gate_fence=ctx.fence,
                        credential_gate=credential_gate, credential_gate_fence=credential_gate.fence,
                        holder=holder, holder_fence=claim.lease_fence, limiter=limiter)
            except IntegrityError as exc:
                raise PermitRefused("this attempt or effect already holds a permit") from exc
            if limiter is not None:
                limiter_granted(limiter=limiter, command=command)
            effect.dispatch()
            effect.save()
            audit_record(actor=DISPATCHER, entity=permit, action="permit_acquire", to_state=permit.state,
                         fence=credential_gate.fence)
    if deferred is not None:
        raise DestinationDeferred(f"effect #{claim.effect_pk} deferred: {deferred}", effect=claim.effect_pk)
    return permit


def _defer_claim(*, limiter: DestinationLimiter, claim: EffectClaim, retry_at: datetime | None, reason: str,
                 now: datetime) -> None:
    """The refusal's writes (see permit_acquire): limiter state, the claim's lease released, its attempt closed."""
    assert transaction.get_connection().in_atomic_block
    limiter_refused(limiter=limiter, retry_at=retry_at, now=now)
    RemoteEffectAttempt.objects.filter(pk=claim.attempt_pk, outcome="").update(
        outcome=AttemptOutcome.NO_EFFECT, evidence=f"deferred by the destination limiter, nothing sent: {reason}",
        settled_at=now)
    RemoteEffect.objects.filter(pk=claim.effect_pk, lease_fence=claim.lease_fence).update(
        lease_holder="", lease_expires_at=None)


# -- settlement ------------------------------------------------------------------------------------------------

def permit_settle(*, permit_pk: int, outcome: str, response_status: int | None, response_digest: bytes | None,
                  remote_id: str, evidence: str, final: bool = False,
                  defer_seconds: float | None = None, effect_pk: int | None = None,
                  account_id: int | None = None) -> RemoteEffect:
    """Settle a `sending` permit with the provider's answer or the ambiguity: append the attempt's outcome, move
    the effect (`remote_confirmed`, `uncertain`, or after proven no effect `prepared`/`no_effect`), and record
    `returned`, leaving the open-permit set. Uses the permit and holder fences, not the gate's (CV2-03-018).
    `final` (no_effect only): the adapter proved that no attempt of this frozen request can ever be sent (its
    path is outside its template), so the effect becomes terminal `no_effect` instead of being retried.
    `defer_seconds` (a receiver's `429` or `Retry-After`, already capped): a destination that declares a limit gets
    no further permit before now + defer_seconds; its limiter is locked after the effect, before the permit
    (D-223). Other destinations are untouched.
    `effect_pk` and `account_id` (the egress caller knows both): the effect is locked by them at once, with no
    read of the permit before; without them, the permit is read once by its pk to find its effect."""
    if effect_pk is None or account_id is None:
        effect_pk, account_id = DispatchPermit.objects.filter(pk=permit_pk).values_list(
            "effect_id", "effect__account_id").get()
    with transaction.atomic():
        effect = locks.effect_for_update(effect_pk, account_id=account_id)
        if effect is None:
            raise PermitRefused(f"permit #{permit_pk} does not belong to effect #{effect_pk} of that account")
        effect = settle_locked(effect=effect, permit_pk=permit_pk, outcome=outcome, response_status=response_status,
                               response_digest=response_digest, remote_id=remote_id, evidence=evidence, final=final,
                               defer_seconds=defer_seconds)
    return effect


def settle_locked(*, effect: RemoteEffect, permit_pk: int, outcome: str, response_status: int | None,
                  response_digest: bytes | None, remote_id: str, evidence: str, final: bool = False,
                  defer_seconds: float | None = None) -> RemoteEffect:
    """permit_settle's writes, inside the caller's transaction, the effect already locked (FOR UPDATE)."""
    if defer_seconds is not None:  # the limiter (an immutable column of the permit) is locked before the permit
        limiter_pk = DispatchPermit.objects.filter(pk=permit_pk, effect_id=effect.pk).values_list(
            "limiter_id", flat=True).first()
        if limiter_pk is not None:
            _destination_defer(limiter=locks.limiter_for_update(limiter_pk), seconds=defer_seconds,
                               status=response_status)
    permit = locks.permit_for_update(permit_pk, effect_id=effect.pk)
    if permit.state != PermitState.SENDING:
        raise PermitRefused(f"permit is {permit.state}; only a sending permit settles")
    now = timezone.now()
    RemoteEffectAttempt.objects.filter(pk=permit.attempt_id, effect_id=effect.pk, outcome="").update(
        outcome=outcome, response_status=response_status, response_digest=response_digest, evidence=evidence,
        settled_at=now)
    permit.settle(at=now)
    permit.save()
    if outcome == AttemptOutcome.REMOTE_CONFIRMED:
        effect.confirm(remote_id=remote_id)
    elif outcome == AttemptOutcome.NO_EFFECT and final:
        retry.no_effect(effect, reason=NoEffectReason.PATH_UNSAFE)
    elif outcome == AttemptOutcome.NO_EFFECT:  # the frozen policy decides (issue 37, D-420..D-423)
        retry.after_no_effect(effect, unreached=response_status is None, now=now)
    else:
        effect.become_uncertain()
    effect.save()
    audit_record(actor=DISPATCHER, entity=effect, action="permit_settle", from_state=EffectState.DISPATCHING,
                 to_state=effect.state, reason=f"{outcome}: {evidence}"[:500])
    return effect


def _destination_defer(*, limiter: DestinationLimiter, seconds: float, status: int | None) -> None:
    """Push the destination's deferral (never earlier than one already recorded) and count it."""
    now = timezone.now()
    until = now + timedelta(seconds=max(seconds, 0.0))
    deferred_until = max(until, limiter.deferred_until) if limiter.deferred_until else until
    not_before = max(deferred_until, limiter.not_before) if limiter.not_before else deferred_until
    DestinationLimiter.objects.filter(pk=limiter.pk).update(
        deferred_until=deferred_until, not_before=not_before, deferrals_total=F("deferrals_total") + 1,
        last_deferral_status=status, updated_at=now)
    stage_metrics.receiver_deferred(callout=limiter.callout, code=status)  # counted after the settlement commits


@transaction.atomic
def permit_abandon(*, permit_pk: int, actor: Actor) -> RemoteEffect:
    """Close an open permit without settlement, only with durable proof: its holder generation is terminated
    (egress revoked), or — for a `granted` permit — a credential revocation committed after acquisition (the
    fence mismatch proves the adapter can never send it, decision 5). `granted` returns the effect to
    `prepared`; `sending` makes it `uncertain`. Elapsed time is never proof (CV2-10-040, CV2-10-042)."""
    permit = DispatchPermit.objects.get(pk=permit_pk)
    credential_gate = connector_locks.credential_gate_for_share(permit.credential_gate.credential_generation_id)
    effect = locks.effect_for_update(permit.effect_id)
    permit = locks.permit_for_update(permit_pk)
    holder = locks.holder_for_share(permit.holder_id)
    if permit.state not in (PermitState.GRANTED, PermitState.SENDING):
        raise AbandonRefused(f"permit is {permit.state}")
    if holder.state == HolderState.TERMINATED:
        proof = f"holder {holder.holder_id} terminated at {holder.terminated_at:%Y-%m-%dT%H:%M:%SZ}: " \
                f"{holder.termination_evidence}"
    elif permit.state == PermitState.GRANTED and (credential_gate.mode != "enabled"
                                                  or credential_gate.fence != permit.credential_gate_fence):
        proof = (f"credential dispatch gate moved to {credential_gate.mode} fence {credential_gate.fence} after "
                 f"acquisition at fence {permit.credential_gate_fence}: the adapter can never send this permit")
    else:
        raise AbandonRefused("no proof: the holder is still running and no revocation fenced this permit out")
    was = permit.state
    now = timezone.now()
    permit.abandon(at=now, proof=proof)
    permit.save()
    if was == PermitState.GRANTED:
        RemoteEffectAttempt.objects.filter(pk=permit.attempt_id, outcome="").update(
            outcome=AttemptOutcome.NO_EFFECT, evidence=f"abandoned before sending: {proof}", settled_at=now)
        effect.retry()
    else:
        RemoteEffectAttempt.objects.filter(pk=permit.attempt_id, outcome="").update(
            outcome=AttemptOutcome.UNCERTAIN, evidence=f"abandoned while sending: {proof}", settled_at=now)
        effect.become_uncertain()
    effect.save()
    audit_record(actor=actor, entity=permit, action="permit_abandon", from_state=was, to_state=permit.state,
                 reason=proof[:500])
    return effect


# -- finalization and reconciliation ------------------------------------------------------------------------------

def effect_finalize(*, effect_pk: int, owner_slot: str = "", account_id: int | None = None) -> RemoteEffect:
    """See `_effect_finalize`. A RemoteLink conflict is marked durably on the effect (in its own transaction,
    after the refused one rolled back) so the operator sees it and the sweeper stops retrying. `account_id`, when
    the caller read the effect already, makes the effect's lock single-shard on the scale-out path (D-241)."""
    try:
        return _effect_finalize(effect_pk=effect_pk, owner_slot=owner_slot, account_id=account_id)
    except ReconcileRefused as exc:
        if exc.context.get("conflict"):
            with transaction.atomic():
                mark_link_conflict(locks.effect_for_update(effect_pk), exc.detail)
        raise


def mark_link_conflict(effect: RemoteEffect, detail: str) -> None:
    """Mark a refused finalization's RemoteLink conflict on the locked effect (the operator's approval queue)."""
    # changed_at marks when the conflict was found: the board's time and the resolution's stale check.
    RemoteEffect.objects.filter(pk=effect.pk).update(quarantine_reason="REMOTE_LINK_CONFLICT",
                                                     changed_at=timezone.now())
    audit_record(actor=DISPATCHER, entity=effect, action="effect_link_conflict", reason=detail)


@transaction.atomic
def _effect_finalize(*, effect_pk: int, owner_slot: str = "", account_id: int | None = None) -> RemoteEffect:
    """`remote_confirmed -> finalized` from attempt evidence, never calling the provider again (CV2-10-030,
    CV2-10-052). With an owner slot, links it to the proven remote identity; a conflicting active link fails
    closed (the effect stays `remote_confirmed` for an operator). The command's time and callout ride along in the
    lock's statement (issue 21: the command -> finalized latency); the lock filters on the account the caller read
    (routable by account, docs/scale-out.md)."""
    queryset = RemoteEffect.objects.select_for_update(of=("self",)).filter(pk=effect_pk)
    if account_id is not None:  # the joined command is the same account's: both pinned to its shard
        queryset = queryset.filter(account_id=account_id, command__account_id=account_id)
    effect = queryset.annotate(commanded_at=F("command__created_at"), callout=F("command__callout")).first()
    return finalize_locked(effect, owner_slot)


_LINK_SQL = ("INSERT INTO effects_remotelink (account_id, owner_slot, remote_identity, effect_id, state, created_at) "
             "VALUES (%s, %s, %s, %s, 'active', %s) ON CONFLICT DO NOTHING RETURNING id")


def finalize_locked(effect: RemoteEffect, owner_slot: str) -> RemoteEffect:
    """_effect_finalize's checks and writes on the locked effect (annotated with `commanded_at` and `callout`)."""
    if effect.state == EffectState.FINALIZED:
        return effect
    if effect.state != EffectState.REMOTE_CONFIRMED:
        raise ReconcileRefused(f"effect is {effect.state}, not remote_confirmed")
    if owner_slot and effect.remote_id:
        # One statement, no savepoint (issue 20, D-338): a link one of the two partial unique indexes refuses is
        # not inserted, and then it must be exactly this one already.
        with connection.cursor() as cursor:
            cursor.execute(_LINK_SQL, [effect.account_id, owner_slot, effect.remote_id, effect.pk, timezone.now()])
            linked = cursor.fetchone() is not None
        if not linked:
            existing = RemoteLink.objects.filter(Q(owner_slot=owner_slot) | Q(remote_identity=effect.remote_id),
                                                 account_id=effect.account_id, state="active").first()
            if existing is None or (existing.owner_slot, existing.remote_identity) != (owner_slot, effect.remote_id):
                raise ReconcileRefused(f"remote identity {effect.remote_id} or slot {owner_slot} is linked "
                                       "elsewhere; nothing was linked", conflict=True) from None
    effect.finalize()
    effect.save()
    stage_metrics.effect_finalized(callout=effect.callout, commanded_at=effect.commanded_at,
                                   finalized_at=effect.changed_at)
    audit_record(actor=DISPATCHER, entity=effect, action="effect_finalize", from_state=EffectState.REMOTE_CONFIRMED,
                 to_state=effect.state)
    return effect


RECONCILE_DECISIONS = ("remote_confirmed", "no_effect", "idempotent_repeat", "quarantine")


@transaction.atomic
def effect_reconcile(*, effect_pk: int, decision: str, evidence: str, actor: Actor, expected_changed_at: datetime,
                     remote_id: str = "") -> RemoteEffect:
    """An operator's (or provider query's) decision on an `uncertain` effect, with evidence: confirmed remotely;
    proven no effect (another attempt only if the frozen policy permits, else terminal `no_effect`); an exact
    idempotent repeat (only with the frozen provider idempotency key; the uncertain attempt stays as it is); or
    quarantine (CV2-10-023..029, CV2-10-051).

    `expected_changed_at` is the effect's `changed_at` the decision was made on (the state token); it is
    required: a missing or non-datetime token is refused with STATE_TOKEN_INVALID, a different one with
    RECONCILE_REFUSED (the effect moved since the page was shown). Nothing is written on a refusal."""
    if not isinstance(expected_changed_at, datetime):
        raise StateTokenInvalid(f"a decision on effect #{effect_pk} carries the effect's changed_at it was made on")
    if decision not in RECONCILE_DECISIONS:
        raise ReconcileRefused(f"decision must be one of {', '.join(RECONCILE_DECISIONS)}")
    if not evidence.strip():
        raise ReconcileRefused("a reconciliation needs evidence")
    if actor.user is not None and not actor.user.has_perm("effects.reconcile_effect"):
        raise PermissionRefused(f"{actor} lacks the effects.reconcile_effect permission")
    effect = locks.effect_for_update(effect_pk)
    if effect.changed_at != expected_changed_at:
        raise ReconcileRefused(f"effect #{effect_pk} changed since the page was shown (now {effect.state}); "
                               "reload and decide again")
    if effect.state != EffectState.UNCERTAIN:
        raise ReconcileRefused(f"effect is {effect.state}; only uncertain effects are reconciled")
    if decision == "remote_confirmed":
        effect.confirm(remote_id=remote_id)
    elif decision == "no_effect":
        retry.after_no_effect(effect, unreached=False, now=timezone.now())
    elif decision == "idempotent_repeat":
        if not effect.command.provider_idempotency_key:
            raise ReconcileRefused("no frozen provider idempotency contract: an exact repeat is not provably safe")
        effect.retry()
    else:
        effect.quarantine(reason="OPERATOR_QUARANTINE")
    effect.save()
    audit_record(actor=actor, entity=effect, action=f"effect_reconcile_{decision}", from_state=EffectState.UNCERTAIN,
                 to_state=effect.state, reason=evidence)
    return effect


def open_permit_reasons(gate) -> list[str]:
    """The gate's open-permit set, named (halting_v2 -> v2_halted needs it empty)."""
    ids = list(DispatchPermit.objects.filter(gate_id=gate.pk, state__in=(PermitState.GRANTED, PermitState.SENDING))
               .order_by("pk").values_list("pk", "state")[:20])
    return [f"open dispatch permit #{pk} ({state})" for pk, state in ids]


def sending_permits_at_revocation(credential_gate) -> list[str]:
    """Permits already `sending` under a generation being revoked: each still makes its one call and settles
    (decision 4); `revocation_settlement` tells when all of them have."""
    ids = list(DispatchPermit.objects.filter(credential_gate_id=credential_gate.pk, state=PermitState.SENDING)
               .order_by("pk").values_list("pk", flat=True))
    return [f"permits sending at revocation: {', '.join(f'#{i}' for i in ids)}"] if ids else []


def revocation_settlement(*, permit_ids: list[int]) -> dict[int, str]:
    """The state of each permit a revocation listed: settled once each is `returned` or `abandoned`."""
    return dict(DispatchPermit.objects.filter(pk__in=permit_ids).values_list("pk", "state"))
