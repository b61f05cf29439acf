"""The destination limiter's decisions (D-222, D-223), shared by `permit_acquire` and the batch claim:
an unlocked admission hint for the claim's candidate scan, the admission under the limiter's lock, and the writes
of a refusal and of a grant. Callers hold the limiter `FOR UPDATE` (after the effect, docs/locking.md)."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import F

from connector import stage_metrics
from effects.choices import PermitState
from effects.models import DestinationLimiter, DispatchPermit

# A limited destination's time gate and in-flight count in one round trip (the count through the
# effects_permit_limiter_open index).
_DESTINATION_SQL = (
    "SELECT l.not_before, (SELECT count(*) FROM effects_dispatchpermit p WHERE p.limiter_id = l.id "
    "AND p.state IN ('granted', 'sending')) FROM effects_destinationlimiter l WHERE l.id = %s")


def destination_open(limiter_pk: int, max_in_flight: int, now: datetime) -> bool:
    """An unlocked look at a limited destination: may it admit a permit now? A hint that spares a claim (and its
    attempt row) for a destination that would refuse; permit_acquire decides under the limiter's lock."""
    with connection.cursor() as cursor:
        cursor.execute(_DESTINATION_SQL, [limiter_pk])
        not_before, in_flight = cursor.fetchone()
    return (not_before is None or not_before <= now) and in_flight < max_in_flight


def in_flight(limiter_pk: int) -> int:
    """The destination's open permits (`granted`/`sending`), through the effects_permit_limiter_open index."""
    return DispatchPermit.objects.filter(limiter_id=limiter_pk, state__in=(PermitState.GRANTED,
                                                                           PermitState.SENDING)).count()


def receiver_deferral(limiter: DestinationLimiter, now: datetime) -> str | None:
    """Why nothing may be granted or marked for the destination now: its receiver's deferral (`429` /
    `Retry-After`) is still pending; None otherwise. Admission (below) and both sending markers (D-371, D-402)
    read it from the limiter row they hold."""
    if limiter.deferred_until is not None and limiter.deferred_until > now:
        return f"the destination is deferred by its receiver until {limiter.deferred_until:%H:%M:%S.%f}"
    return None


def limiter_admit(limiter: DestinationLimiter, command, now: datetime,
                  open_now: int | None = None) -> tuple[bool, datetime | None, str, str]:
    """Decide under the limiter's lock whether the destination admits one more permit, by the command's frozen
    limit: no receiver deferral pending, fewer than K permits open, and a token in the bucket (refilled at R per
    second up to the burst). On admission the token is taken. Returns (admitted, retry_at, reason, cause), the
    cause one of stage_metrics.CAUSES (empty when admitted); the caller saves the row either way. `open_now`: the
    in-flight count the caller took under this same lock (a batch counts once and adds what it admitted)."""
    rate, burst = command.rate_requests_per_second, command.rate_burst
    deferral = receiver_deferral(limiter, now)
    if deferral is not None:
        return False, limiter.deferred_until, deferral, "receiver_deferral"
    open_now = in_flight(limiter.pk) if open_now is None else open_now
    if open_now >= command.rate_max_in_flight:
        return (False, None, f"{open_now} permits in flight, the declared maximum is {command.rate_max_in_flight}",
                "in_flight")
    if limiter.refilled_at is None:
        tokens = float(burst)
    else:
        elapsed = max((now - limiter.refilled_at).total_seconds(), 0.0)
        tokens = min(float(burst), limiter.tokens + elapsed * rate)
    limiter.refilled_at = now
    if tokens < 1.0:
        limiter.tokens = tokens
        retry_at = now + timedelta(seconds=(1.0 - tokens) / rate)
        return False, retry_at, f"{rate} requests per second: the next token is due at {retry_at:%H:%M:%S.%f}", "rate"
    limiter.tokens = tokens - 1.0
    return True, None, "", ""


def limiter_refused(*, limiter: DestinationLimiter, retry_at: datetime | None, now: datetime) -> None:
    """A refusal's limiter writes: the bucket as computed, `not_before` pushed to a time-bound refusal's retry."""
    assert transaction.get_connection().in_atomic_block
    not_before = limiter.not_before
    if retry_at is not None and (not_before is None or not_before < retry_at):
        not_before = retry_at
    DestinationLimiter.objects.filter(pk=limiter.pk).update(
        tokens=limiter.tokens, refilled_at=limiter.refilled_at, not_before=not_before,
        refused_total=F("refused_total") + 1, updated_at=now)


def limiter_granted(*, limiter: DestinationLimiter, command, count: int = 1) -> None:
    """A grant's limiter writes: the token taken. An emptied bucket names when its next token is due, so claims
    pass the destination over until then instead of claiming what acquisition would refuse."""
    rate = command.rate_requests_per_second
    next_token = limiter.refilled_at + timedelta(seconds=(1.0 - limiter.tokens) / rate) \
        if limiter.tokens < 1.0 else None
    not_before = max(d for d in (limiter.not_before, next_token, limiter.deferred_until) if d) \
        if (limiter.not_before or next_token) else None
    DestinationLimiter.objects.filter(pk=limiter.pk).update(
        tokens=limiter.tokens, refilled_at=limiter.refilled_at, not_before=not_before,
        granted_total=F("granted_total") + count, updated_at=limiter.refilled_at)


def limiter_admit_batch(limiter: DestinationLimiter, commands: list, now: datetime) -> int:
    """A limited batch's admission under the limiter's lock (D-372): the in-flight count once, then
    `limiter_admit`'s accounting one effect at a time, in the batch's order, each by its own command's frozen limit,
    until the first refusal, and at most half the free slots (rounded up, D-374): so at most
    min(tokens, ceil((K - in flight) / 2)) are admitted, and the other half is left to the destination's other
    workers, whose permits then overlap instead of waiting behind one worker's sequential exchanges. Writes the grant (tokens taken,
    `not_before` at the next token when the bucket is empty) or, when none is admitted, the refusal. Returns how
    many of `commands` (a prefix) are admitted."""
    open_now, admitted, refusal = in_flight(limiter.pk), 0, None
    for command in commands:
        ok, retry_at, reason, cause = limiter_admit(limiter, command, now, open_now=open_now + admitted)
        if not ok:
            refusal = (retry_at, cause)
            break
        admitted += 1
        if admitted >= max(1, -(-(command.rate_max_in_flight - open_now) // 2)):
            break  # half the free slots (rounded up): the others are left to the destination's other workers
    if admitted:
        limiter_granted(limiter=limiter, command=commands[admitted - 1], count=admitted)
    elif refusal is not None:
        limiter_refused(limiter=limiter, retry_at=refusal[0], now=now)
        stage_metrics.rate_limit_deferred(callout=limiter.callout, cause=refusal[1])  # counted after the commit
    return admitted
