"""The sole egress adapter's batched path (issue 20, decision D-349): the worker's batch of `granted` permits
(effects.services.dispatch_batch.effects_claim_batch) wins its `granted -> sending` markers in ONE committed
transaction before any byte leaves, each permit checked exactly as `effects.egress._win_sending` checks it; then
the adapter makes each permit's one HTTP exchange (`egress._exchange`, sequentially, on the process's kept client)
and settles: the `remote_confirmed` answers and their finalizations in one transaction
(`dispatch_batch.permits_settle_confirmed`), every other answer (or an item the batch settlement refused) alone
through `egress.settle_exchange` (`permit_settle` / `permit_settle_and_finalize`, tried again until it lands, D-424),
each isolated (D-168).

A limited destination's batch (D-371..D-373) sends one permit at a time, each behind its own committed marker that
reads the destination's limiter `FOR SHARE` and refuses while a receiver's deferral is pending; an answer that
defers the destination (`429`, `Retry-After`) is settled at once (recording the deferral) before the next marker,
and the permits the marker refused are withdrawn (`dispatch_withdraw.permits_withdraw`): nothing is sent to the
destination inside its deferral by a permit whose marker follows the deferral."""
from __future__ import annotations

import logging
from functools import partial

from django.db import connection, transaction
from django.utils import timezone
from opentelemetry.trace import SpanKind

from connector import stage_metrics, tracing
from connector.choices import SweepStep
from connector.faults import fault_point
from connector.selectors import locks as connector_locks
from connector.services import poison
from effects import egress, locks
from effects.choices import AttemptOutcome
from effects.models import CommandTrace, RemoteEffect
from effects.services.dispatch_batch import BatchPermit, Confirmed, permits_settle_confirmed
from effects.services.dispatch_withdraw import permits_abandon_fenced_out, permits_withdraw
from effects.services.identity import effect_slot
from effects.services.limiter import receiver_deferral
from effects.services.poison import effect_quarantine

log = logging.getLogger(__name__)

_MARK_SENDING = """
UPDATE effects_dispatchpermit SET state = 'sending', io_may_have_started = true, sending_at = %(now)s
 WHERE id = ANY(%(ids)s::bigint[]) AND effect_id = ANY(%(effects)s::bigint[]) AND state = 'granted'"""


def win_sending_batch(*, permits: list[BatchPermit], holder_id: str) -> list[BatchPermit]:
    """The batch's committed `granted -> sending` markers, one transaction: the credential dispatch gates FOR SHARE
    (ascending generation), the permits FOR UPDATE (ascending pk, naming their effects), their holder FOR SHARE,
    the checks of `_win_sending` per permit (`egress.sending_refusal`), then one UPDATE of the permits that pass.
    A permit that fails a check is left as it is and not sent (logged, as `send` refuses it). Returns the permits
    won, in the given order. `fault_point("dispatch.batch_sending_before_commit")` fires before the COMMIT."""
    if not permits:
        return []
    with transaction.atomic():
        gates = connector_locks.credential_gates_for_share(p.credential_generation_pk for p in permits)
        deferred = _deferred(permits)
        rows = {r.pk: r for r in locks.permits_for_update([p.permit_pk for p in permits],
                                                          effect_ids=[p.effect_pk for p in permits])}
        holders = {pk: locks.holder_for_share(pk) for pk in sorted({r.holder_id for r in rows.values()})}
        won = []
        for p in permits:
            permit, gate = rows.get(p.permit_pk), gates.get(p.credential_generation_pk)
            if permit is None or permit.effect_id != p.effect_pk:
                refusal = "the permit does not belong to that effect"
            elif deferred is not None or permit.limiter_id != p.limiter_pk:
                refusal = deferred or "the permit names another destination limiter"
            elif gate is None or permit.credential_gate_id != gate.pk:
                refusal = "the permit names another credential dispatch gate"
            else:
                refusal = egress.sending_refusal(permit=permit, holder=holders[permit.holder_id], credential_gate=gate,
                                                 holder_id=holder_id, holder_fence=p.holder_fence,
                                                 credential_gate_fence=p.credential_gate_fence)
            if refusal is not None:
                log.info("egress refused a permit of the batch", extra={"permit": p.permit_pk, "reason": refusal})
                continue
            won.append(p)
        if won:
            with connection.cursor() as cursor:
                cursor.execute(_MARK_SENDING, {"now": timezone.now(), "ids": [p.permit_pk for p in won],
                                               "effects": [p.effect_pk for p in won]})
                if cursor.rowcount != len(won):
                    raise AssertionError(f"{cursor.rowcount} permits marked sending for {len(won)} won")
        fault_point("dispatch.batch_sending_before_commit")
    return won


def _deferred(permits: list[BatchPermit]) -> str | None:
    """A limited batch's marker (D-371): its destination's limiter `FOR SHARE` (after the credential gates, before
    the permits), and why nothing may be marked now (a receiver's deferral pending), else None. The share lock
    waits for a settlement recording a deferral (`FOR UPDATE`) and then reads its committed row: every marker is
    ordered before or after each deferral, and none after it is won while it lasts."""
    limiter_pks = {p.limiter_pk for p in permits}
    if limiter_pks == {None}:
        return None
    if len(limiter_pks) != 1:
        return "a batch's markers name one destination"
    limiter = locks.limiter_for_share(limiter_pks.pop())
    return receiver_deferral(limiter, timezone.now())


def _isolated(step: str, effect_pk: int) -> poison.Isolated:
    return poison.isolated(step=step, item=f"effect {effect_pk}",
                           quarantine=partial(effect_quarantine, effect_pk=effect_pk, step=step))


def send_batch(*, permits: list[BatchPermit], holder_id: str, base_url: str | None = None) -> dict[int, RemoteEffect]:
    """Win the batch's markers (committed), then each permit's one exchange, then the settlements (see the module).
    Returns the settled effects by pk (an item whose settlement failed is absent: the worker reads it back)."""
    if permits and permits[0].limiter_pk is not None:
        return _send_limited(permits=permits, holder_id=holder_id, base_url=base_url)
    won = win_sending_batch(permits=permits, holder_id=holder_id)
    settled = _abandon_refused([p for p in permits if p not in won])
    if not won:
        return settled
    fault_point("egress.after_sending")
    effects = _effects(won)
    return settled | _settle(won[0].account_id, effects, [(p, _send(p, effects, base_url)) for p in won], holder_id)


def _abandon_refused(refused: list[BatchPermit]) -> dict[int, RemoteEffect]:
    """Permits the markers refused that can never be sent (a revocation moved their credential gate's fence), each
    abandoned with that proof (`permits_abandon_fenced_out`, D-399); the others stay as they are."""
    if not refused:
        return {}
    with _isolated(SweepStep.EFFECT_SEND, refused[0].effect_pk):
        pks = permits_abandon_fenced_out([p.permit_pk for p in refused])
        return {e.pk: e for e in RemoteEffect.objects.filter(account_id=refused[0].account_id, pk__in=pks)}
    return {}


def _effects(permits: list[BatchPermit]) -> dict[int, RemoteEffect]:
    account_id = permits[0].account_id
    return {e.pk: e for e in RemoteEffect.objects.select_related("command", "command__credential_generation")
            .filter(account_id=account_id, command__account_id=account_id, pk__in=[p.effect_pk for p in permits])}


def _send(p: BatchPermit, effects: dict[int, RemoteEffect], base_url: str | None) -> egress.Exchange:
    with tracing.stage("egress_send", CommandTrace, kind=SpanKind.CLIENT,  # issue 21, as `send` traces it
                       command__effect__permits=p.permit_pk):
        return egress._exchange(permit_pk=p.permit_pk, command=effects[p.effect_pk].command, base_url=base_url)


def _send_limited(*, permits: list[BatchPermit], holder_id: str, base_url: str | None) -> dict[int, RemoteEffect]:
    """A limited destination's batch (see the module): per permit its marker, then its exchange; an answer that
    defers the destination is settled before the next marker; refused permits are withdrawn."""
    effects, answers, settled, refused = _effects(permits), [], {}, []
    for p in permits:
        if not win_sending_batch(permits=[p], holder_id=holder_id):
            refused.append(p)
            continue
        fault_point("egress.after_sending")
        done = _send(p, effects, base_url)
        if done.outcome.get("defer_seconds") is None:
            answers.append((p, done))
        else:  # the deferral is recorded by this settlement, before any further marker of the destination
            settled.update(_settle(p.account_id, effects, [(p, done)], holder_id, batch=False))
    if refused:
        with _isolated(SweepStep.EFFECT_SEND, refused[0].effect_pk):
            for pk in permits_withdraw(permits=refused, holder_id=holder_id):
                settled[pk] = RemoteEffect.objects.get(pk=pk, account_id=refused[0].account_id)
        settled.update(_abandon_refused([p for p in refused if p.effect_pk not in settled]))
    if answers:
        settled.update(_settle(permits[0].account_id, effects, answers, holder_id))
    return settled


def _settle(account_id: int, effects: dict[int, RemoteEffect], answers: list, holder_id: str,
            batch: bool = True) -> dict[int, RemoteEffect]:
    """The answers' settlements: the confirmed ones (without a deferral to record) in one transaction, every other
    one alone through `egress.settle_exchange` (the settlement of `send`, tried again until it lands, D-424),
    isolated (D-168)."""
    confirmed = [(p, done) for p, done in answers if batch and done.outcome["outcome"] == AttemptOutcome.REMOTE_CONFIRMED
                 and (p.limiter_pk is None or done.outcome.get("defer_seconds") is None)]
    settled: dict[int, RemoteEffect] = {}
    try:
        settled = permits_settle_confirmed(account_id=account_id, items=[
            Confirmed(p.permit_pk, p.effect_pk, done.outcome["response_status"], done.outcome["response_digest"],
                      done.outcome["remote_id"], done.outcome["evidence"], effect_slot(effects[p.effect_pk]),
                      effects[p.effect_pk].command.created_at, effects[p.effect_pk].command.callout)
            for p, done in confirmed])
        if confirmed and not settled:  # the savepoint rolled back: settled, left remote_confirmed (D-336)
            settled = {e.pk: e for e in RemoteEffect.objects.filter(
                account_id=account_id, pk__in=[p.effect_pk for p, _ in confirmed])}
    except Exception as exc:  # noqa: BLE001 - rolled back: each item settles alone below, the one semantics
        log.warning("batch settlement failed; settling each item alone", extra={"error": f"{type(exc).__name__}"})
    for p, done in answers:
        effect = effects[p.effect_pk]
        if p.effect_pk in settled:
            if done.answered is not None:  # issue 21: counted once the settlement committed
                stage_metrics.egress_observe(callout=effect.command.callout, status_label=done.answered,
                                             seconds=done.seconds)
            continue
        with _isolated(SweepStep.EFFECT_SEND, p.effect_pk):  # the one settlement of `send` (retried until it lands)
            settled[p.effect_pk] = egress.settle_exchange(permit_pk=p.permit_pk, effect=effect, done=done,
                                                          finalize=True, holder_id=holder_id)
    return settled
