"""The frozen policy's decision after an attempt proved no effect (issue 37 item 1, decisions D-420..D-423): another
Attempt (`dispatching|uncertain -> prepared`, the seed's "proved no effect; retry allowed"), now or at a scheduled
time, or terminal `no_effect` with its closed reason code.

Two budgets, each counting only its own attempts:

- An attempt that never reached the receiver (the egress adapter settled it `no_effect` without any answer: a
  connection refused, a DNS or TLS handshake failure, a connect or pool timeout, a secret unreadable before the
  request; its permit reached `sending`, so the seed's proof is the adapter's: no request byte left) follows the
  command's frozen `retry_schedule`: after the n-th such attempt the effect returns to `prepared` with
  `next_attempt_at` = now + about schedule[n-1] seconds (jitter, `jittered`), and no claim takes it before; after
  the last one it is terminal `no_effect` with RECEIVER_UNREACHABLE.
- An attempt the receiver answered and refused (`400`, `404`, `409`, `422`), or an uncertain one an operator proved
  without effect, counts against the frozen `max_attempts` as before (D-117; a `429` never counts, D-224); once they
  are spent the effect is terminal `no_effect` with NO_EFFECT_ATTEMPTS_SPENT, or with LINKED_RECORD_NOT_FOUND when
  the last refusal was a `404` to an update addressed at the owner slot's linked remote identity (D-481): the
  record the RemoteLink names is not at the provider, so the push did not happen and the cause is named.

Each retry is a new Attempt of the same frozen request under a new claim: no transition is added to the seed's."""
from __future__ import annotations

import random
from datetime import datetime, timedelta

from django.db.models import Q

from connector import stage_metrics
from effects.choices import DEFAULT_RETRY_SCHEDULE, AttemptOutcome, NoEffectReason
from effects.errors import RetryPolicyInvalid
from effects.models import RemoteEffect, RemoteEffectAttempt

JITTER = 0.2  # each scheduled delay is drawn from [d * (1 - JITTER), d * (1 + JITTER)], at least 1 s
MAX_DELAY, MAX_STEPS = 7 * 24 * 3600, 100


def declared_schedule(callout_def: dict) -> list[int] | None:
    """The callout definition's `retry`, validated and expanded to the schedule the command freezes (D-420): an
    explicit `{"schedule_seconds": [...]}`, or `{"exponential": {"first_seconds": F, "factor": X,
    "max_delay_seconds": M}, "horizon_seconds": H}` (delays F, F*X, F*X^2 ... capped at M, while their sum stays
    within H). None when the callout declares none (the command then freezes DEFAULT_RETRY_SCHEDULE). Raises
    RetryPolicyInvalid (nothing written)."""
    declared = callout_def.get("retry")
    if declared is None:
        return None
    if isinstance(declared, dict) and set(declared) == {"schedule_seconds"}:
        schedule = declared["schedule_seconds"]
    elif isinstance(declared, dict) and set(declared) == {"exponential", "horizon_seconds"} \
            and isinstance(declared["exponential"], dict) \
            and set(declared["exponential"]) == {"first_seconds", "factor", "max_delay_seconds"}:
        spec, horizon = declared["exponential"], declared["horizon_seconds"]
        first, factor, cap = spec["first_seconds"], spec["factor"], spec["max_delay_seconds"]
        if any(type(v) is not int or v < 1 for v in (first, factor, cap, horizon)) or factor < 2 \
                or cap > MAX_DELAY or first > cap:
            raise RetryPolicyInvalid(f"retry.exponential needs integers first_seconds <= max_delay_seconds <= "
                                     f"{MAX_DELAY}, factor >= 2 and horizon_seconds >= 1, not {declared!r}")
        schedule, delay = [], first
        while len(schedule) < MAX_STEPS and sum(schedule) + delay <= horizon:
            schedule.append(delay)
            delay = min(delay * factor, cap)
    else:
        raise RetryPolicyInvalid(f"retry must be {{\"schedule_seconds\": [...]}} or {{\"exponential\": {{...}}, "
                                 f"\"horizon_seconds\": H}}, not {declared!r}")
    if not isinstance(schedule, list) or not 1 <= len(schedule) <= MAX_STEPS \
            or any(type(d) is not int or not 1 <= d <= MAX_DELAY for d in schedule):
        raise RetryPolicyInvalid(f"retry schedule must be 1 to {MAX_STEPS} integers from 1 to {MAX_DELAY}, "
                                 f"not {schedule!r}")
    return schedule


def frozen_schedule(callout_def: dict) -> tuple[list[int], bool]:
    """(the schedule a command freezes, whether the callout declared it): only a declared schedule enters the route
    policy digest, so commands of callouts without one keep their exact bytes (as `rate_limit`, D-222)."""
    declared = declared_schedule(callout_def)
    return (declared, True) if declared is not None else (list(DEFAULT_RETRY_SCHEDULE), False)


def jittered(seconds: float, *, rng: random.Random | None = None) -> float:
    """A scheduled delay with jitter, so effects that failed together (one receiver outage) do not all come back in
    the same second when it ends."""
    draw = (rng or random).uniform(1 - JITTER, 1 + JITTER)
    return max(1.0, seconds * draw)


def _sent(effect: RemoteEffect):
    return RemoteEffectAttempt.objects.filter(effect=effect, permit__io_may_have_started=True)


UNREACHED = Q(outcome=AttemptOutcome.NO_EFFECT, response_status__isnull=True)


def unreached_count(effect: RemoteEffect) -> int:
    """The effect's settled attempts that crossed the sending marker and never reached the receiver."""
    return _sent(effect).filter(UNREACHED).count()


def after_no_effect(effect: RemoteEffect, *, unreached: bool, now: datetime) -> None:
    """Proven no effect on the locked effect (see the module): `retry` (maybe with a `not_before`) or terminal
    `no_effect` with its reason code. `unreached`: this attempt never reached the receiver. Inside the caller's
    transaction; the attempt's outcome is already written."""
    command = effect.command
    if unreached:
        n, schedule = unreached_count(effect), command.retry_schedule
        if n <= len(schedule):
            effect.retry(not_before=now + timedelta(seconds=jittered(float(schedule[n - 1]))))
            stage_metrics.retry_scheduled(callout=command.callout)
        else:
            no_effect(effect, reason=NoEffectReason.RECEIVER_UNREACHABLE)
        return
    # An attempt the receiver refused with 429 (its rate limit, D-224) is proven unprocessed and does not count:
    # a throttled destination delays its effects, it never exhausts them; nor do unreached attempts (above).
    counted = _sent(effect).exclude(response_status=429).exclude(UNREACHED).count()
    if counted < command.max_attempts:
        effect.retry()
    else:
        no_effect(effect, reason=_spent_reason(effect))


def _spent_reason(effect: RemoteEffect) -> str:
    """The reason code of an effect whose counted attempts are spent (D-481): LINKED_RECORD_NOT_FOUND when its
    command is an update addressed at a RemoteLink (`target_link`) and the last counted attempt was answered `404`,
    else NO_EFFECT_ATTEMPTS_SPENT. A create (no link) answered 404 names a missing route, not a missing record."""
    if effect.command.target_link_id is None:
        return NoEffectReason.ATTEMPTS_SPENT
    last = (_sent(effect).exclude(response_status=429).exclude(UNREACHED).order_by("-ordinal")
            .values_list("response_status", flat=True).first())
    return NoEffectReason.LINKED_RECORD_NOT_FOUND if last == 404 else NoEffectReason.ATTEMPTS_SPENT


def no_effect(effect: RemoteEffect, *, reason: str) -> None:
    """Terminal `no_effect` with its closed reason code (D-423), counted in /metrics once committed."""
    effect.no_effect(reason=reason)
    stage_metrics.effect_no_effect(callout=effect.command.callout, reason=reason)


def schedule_view(effect: RemoteEffect, now: datetime) -> dict:
    """What the effect's page shows of its retry policy: the frozen schedule, the unreached attempts so far, the
    next attempt's time (while one is scheduled) and the nominal horizon."""
    schedule = list(effect.command.retry_schedule)
    waiting = effect.state == "prepared" and effect.next_attempt_at is not None and effect.next_attempt_at > now
    return {"schedule": schedule, "unreached": unreached_count(effect), "steps": len(schedule),
            "horizon": timedelta(seconds=sum(schedule)), "next_attempt_at": effect.next_attempt_at if waiting else None,
            "max_attempts": effect.command.max_attempts}
