"""The one send path of the sole egress adapter (issue 20, D-349; issue 39): a batch of `granted` permits (one
permit is a batch of one) wins its `granted -> sending` markers in ONE committed transaction before any byte
leaves (`win_sending_batch`); then the adapter makes each permit's one HTTP exchange (`egress.permit_exchange`,
sequentially, on the process's kept client) and the answers are settled (`_settle`): the `remote_confirmed`
answers and their finalizations in one transaction (`dispatch_batch.permits_settle_confirmed`), every other answer
by `dispatch.permit_settle`. A settlement PostgreSQL cannot take now is tried again until it lands, or the holder
generation is given up (`settlement.until_landed`, issue 37 item 3). A batch settlement that fails otherwise is
split in halves and each half settled again, until the item at fault stands alone and is held (D-168, D-530).

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
from effects import egress, locks, settlement
from effects.choices import AttemptOutcome
from effects.errors import DestinationDeferred, EgressRefused
from effects.models import CommandTrace, DispatchPermit, RemoteEffect
from effects.services import dispatch
from effects.services.dispatch_batch import BatchPermit, Confirmed, permits_settle_confirmed
from effects.services.dispatch_withdraw import permits_abandon_fenced_out, permits_withdraw
from effects.services.identity import effect_slot
from effects.services.limiter import receiver_deferral
from effects.services.poison import effect_quarantine

log = logging.getLogger(__name__)

_MARK_SENDING = """
UPDATE effects_dispatchpermit SET state = 'sending', io_may_have_started = true, sending_at = %(now)s
 WHERE id = ANY(%(ids)s::bigint[]) AND effect_id = ANY(%(effects)s::bigint[]) AND state = 'granted'"""


def win_sending_batch(*, permits: list[BatchPermit], holder_id: str,
                      refusals: dict[int, EgressRefused] | None = None) -> list[BatchPermit]:
    """The batch's committed `granted -> sending` markers, one transaction: the credential dispatch gates FOR SHARE
    (ascending generation), a limited batch's limiter FOR SHARE, the permits FOR UPDATE (ascending pk, naming their
    effects), their holder FOR SHARE, the checks per permit (`egress.sending_refusal`), then one UPDATE of the
    permits that pass. A permit that fails a check is left as it is and not sent (logged; its refusal put in
    `refusals` by permit pk when given). Returns the permits won, in the given order.
    `fault_point("dispatch.batch_sending_before_commit")` fires before the COMMIT."""
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
            refused = EgressRefused
            if permit is None or permit.effect_id != p.effect_pk:
                refusal = "the permit does not belong to that effect"
            elif deferred is not None:
                refusal, refused = deferred, DestinationDeferred
            elif permit.limiter_id != p.limiter_pk:
                refusal = "the permit names another destination limiter"
            elif gate is None or permit.credential_gate_id != gate.pk:
                refusal = "the permit names another credential dispatch gate"
            else:
                refusal = egress.sending_refusal(permit=permit, holder=holders[permit.holder_id], credential_gate=gate,
                                                 holder_id=holder_id, holder_fence=p.holder_fence,
                                                 credential_gate_fence=p.credential_gate_fence)
            if refusal is not None:
                log.info("egress refused a permit of the batch", extra={"permit": p.permit_pk, "reason": refusal})
                if refusals is not None:
                    refusals[p.permit_pk] = refused(refusal)
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


@tracing.entry("egress_send", CommandTrace, arg="permit_pk", lookup="command__effect__permits",
               kind=SpanKind.CLIENT)  # issue 21: continues the trace stored with the OutboundCommand
def send(*, permit_pk: int, holder_id: str, holder_fence: int, credential_gate_fence: int,
         base_url: str | None = None) -> RemoteEffect:
    """One `granted` permit sent as a batch of one: its committed marker (a refusal raises `EgressRefused`, or
    `DestinationDeferred` while its destination is deferred, and leaves the permit as it is), its one exchange, its
    settlement. Returns the effect as settled (read back when its settlement was held)."""
    effect_pk, account_id, attempt_pk, generation_pk, limiter_pk = DispatchPermit.objects.filter(
        pk=permit_pk).values_list("effect_id", "effect__account_id", "attempt_id",
                                  "credential_gate__credential_generation_id", "limiter_id").get()
    p = BatchPermit(permit_pk, effect_pk, attempt_pk, account_id, holder_fence, credential_gate_fence, generation_pk,
                    limiter_pk)
    refusals: dict[int, EgressRefused] = {}
    if not win_sending_batch(permits=[p], holder_id=holder_id, refusals=refusals):
        raise refusals[permit_pk]
    fault_point("egress.after_sending")
    effects = _effects([p])
    settled = _settle(account_id, effects, [(p, _exchange(p, effects, base_url))], holder_id)
    return settled.get(effect_pk) or RemoteEffect.objects.get(pk=effect_pk, account_id=account_id)


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


def _exchange(p: BatchPermit, effects: dict[int, RemoteEffect], base_url: str | None) -> egress.Exchange:
    return egress.permit_exchange(permit_pk=p.permit_pk, command=effects[p.effect_pk].command, base_url=base_url)


def _send(p: BatchPermit, effects: dict[int, RemoteEffect], base_url: str | None) -> egress.Exchange:
    with tracing.stage("egress_send", CommandTrace, kind=SpanKind.CLIENT,  # issue 21, as `send` traces it
                       command__effect__permits=p.permit_pk):
        return _exchange(p, effects, base_url)


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
            settled.update(_settle(p.account_id, effects, [(p, done)], holder_id))
    if refused:
        with _isolated(SweepStep.EFFECT_SEND, refused[0].effect_pk):
            for pk in permits_withdraw(permits=refused, holder_id=holder_id):
                settled[pk] = RemoteEffect.objects.get(pk=pk, account_id=refused[0].account_id)
        settled.update(_abandon_refused([p for p in refused if p.effect_pk not in settled]))
    if answers:
        settled.update(_settle(permits[0].account_id, effects, answers, holder_id))
    return settled


def _together(p: BatchPermit, done: egress.Exchange) -> bool:
    """An answer the batch settles and finalizes in one statement set: `remote_confirmed`, without a deferral of a
    limited destination to record (that one is settled by `permit_settle`, which records it under the limiter's
    lock, and finalized by the worker after)."""
    return done.outcome["outcome"] == AttemptOutcome.REMOTE_CONFIRMED and (
        p.limiter_pk is None or done.outcome.get("defer_seconds") is None)


def _settle(account_id: int, effects: dict[int, RemoteEffect], answers: list, holder_id: str) -> dict[int, RemoteEffect]:
    """The answers' settlements (see the module); each is counted in the egress metric once committed (issue 21)."""
    settled = _settle_confirmed(account_id, effects, [(p, d) for p, d in answers if _together(p, d)], holder_id)
    for p, done in answers:
        if _together(p, done):
            continue
        with _isolated(SweepStep.EFFECT_SEND, p.effect_pk):
            settled[p.effect_pk] = settlement.until_landed(
                partial(dispatch.permit_settle, permit_pk=p.permit_pk, effect_pk=p.effect_pk,
                        account_id=p.account_id, **done.outcome), permit_pk=p.permit_pk, holder_id=holder_id)
    for p, done in answers:
        if p.effect_pk in settled and done.answered is not None:
            stage_metrics.egress_observe(callout=effects[p.effect_pk].command.callout, status_label=done.answered,
                                         seconds=done.seconds)
    return settled


def _settle_confirmed(account_id: int, effects: dict[int, RemoteEffect], answers: list,
                      holder_id: str) -> dict[int, RemoteEffect]:
    """The `remote_confirmed` answers settled and finalized in one transaction, tried again until it lands (or the
    generation is given up). A batch whose settlement fails otherwise (a refusal: an item moved meanwhile; a defect)
    is split in halves, each settled again, until the item at fault stands alone: that one is isolated (D-168: a
    refusal leaves it as it is, a defect holds it EFFECT_STEP_FAILED) and every other item lands (D-530)."""
    if not answers:
        return {}
    items = [Confirmed(p.permit_pk, p.effect_pk, done.outcome["response_status"], done.outcome["response_digest"],
                       done.outcome["remote_id"], done.outcome["evidence"], effect_slot(effects[p.effect_pk]),
                       effects[p.effect_pk].command.created_at, effects[p.effect_pk].command.callout)
             for p, done in answers]
    first = answers[0][0]
    try:
        settled = settlement.until_landed(partial(permits_settle_confirmed, account_id=account_id, items=items),
                                          permit_pk=first.permit_pk, holder_id=holder_id)
    except settlement.LOST:  # given up: the generation's permits are abandoned with that proof; read back later
        return {}
    except Exception as exc:  # noqa: BLE001 - classified: split until the item at fault stands alone
        if len(answers) == 1:
            with _isolated(SweepStep.EFFECT_SEND, first.effect_pk):
                raise exc
            return {}
        poison.log_fallback(log, exc, "a settlement of %d answers failed; settling each half again", len(answers))
        half = len(answers) // 2
        return (_settle_confirmed(account_id, effects, answers[:half], holder_id)
                | _settle_confirmed(account_id, effects, answers[half:], holder_id))
    if not settled:  # the finalization's savepoint rolled back: settled, left remote_confirmed (D-336)
        settled = {e.pk: e for e in RemoteEffect.objects.filter(account_id=account_id,
                                                                 pk__in=[i.effect_pk for i in items])}
    return settled
