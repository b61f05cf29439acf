"""The V1 runtime: admission of inbound items and root outbound requests behind the owner barriers, and the
worker step that finishes accepted work (authoring and dispatching every outbound effect it requires).

Barriers stop new roots only: an entry transaction holds its barrier row FOR SHARE, so closing a barrier (FOR
UPDATE) waits for every entry transaction already crossing it, which commits and joins the drain (CV2-12-026/079).
Continuation work (claims, effect authoring and dispatch of accepted items) does not look at the barriers.
"""
from __future__ import annotations

import hashlib
import json
import uuid
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone

from connector.faults import fault_point
from v1 import egress
from v1.errors import V1BarrierClosed, V1GenerationRefused
from v1.models import (
    RELEASE_ID,
    BarrierKind,
    EffectState,
    GenerationState,
    V1Barrier,
    V1HighWater,
    V1OutboundEffect,
    V1ProcessGeneration,
    V1SourceCursor,
    V1WorkItem,
    WorkState,
)

LEASE = timedelta(seconds=60)


def barriers_install() -> None:
    """The three owner barriers exist from the release's first migration; reinstall any missing row (open), e.g.
    after a test flush. Never reopens an existing closed barrier."""
    if V1Barrier.objects.count() < len(BarrierKind.values):
        for kind in BarrierKind.values:
            V1Barrier.objects.get_or_create(kind=kind)


def _open_barrier(kind: str) -> V1Barrier:
    """Inside the entry transaction: hold the barrier FOR SHARE and refuse when it is closed."""
    barriers_install()
    rows = list(V1Barrier.objects.raw("SELECT * FROM v1_v1barrier WHERE kind = %s FOR SHARE", [kind]))
    if rows[0].closed:
        raise V1BarrierClosed(f"the {kind} barrier is closed for cutover {rows[0].attempt_key}")
    return rows[0]


def accept(*, account_key: str, source_key: str, transport_key: str, payload: bytes, partition: str,
           position: int, dependency_deadline=None) -> tuple[V1WorkItem, bool]:
    """Accept one inbound item and checkpoint the source cursor, or recognize a transport duplicate. Refused
    retryably (nothing written, cursor unchanged) while the ingress barrier is closed."""
    digest = hashlib.sha256(payload).digest()
    with transaction.atomic():
        _open_barrier(BarrierKind.INGRESS)
        existing = V1WorkItem.objects.filter(account_key=account_key, source_key=source_key,
                                             transport_key=transport_key).first()
        if existing is not None:
            return existing, False
        try:
            with transaction.atomic():
                item = V1WorkItem.objects.create(account_key=account_key, source_key=source_key,
                                                 transport_key=transport_key, payload=payload, payload_digest=digest,
                                                 partition=partition, position=position,
                                                 dependency_deadline=dependency_deadline)
        except IntegrityError:
            return V1WorkItem.objects.get(account_key=account_key, source_key=source_key,
                                          transport_key=transport_key), False
        cursor, _ = V1SourceCursor.objects.select_for_update().get_or_create(source_key=source_key)
        cursor.cursor, cursor.checkpointed = transport_key, True
        cursor.save()
        return item, True


def request_root_outbound(*, account_key: str, request_key: str, body: bytes) -> V1OutboundEffect:
    """A new root outbound request (no inbound parent). Refused retryably while the root_outbound barrier is
    closed, without committing anything."""
    with transaction.atomic():
        _open_barrier(BarrierKind.ROOT_OUTBOUND)
        return V1OutboundEffect.objects.create(account_key=account_key, request_key=request_key, request_body=body,
                                               request_digest=hashlib.sha256(body).digest())


def generation_start(*, started_by: str, release_id: str = RELEASE_ID) -> V1ProcessGeneration:
    """A NEW process generation of the release (never a revived one). Fails while another is running."""
    with transaction.atomic():
        return V1ProcessGeneration.objects.create(generation_id=f"v1-gen-{uuid.uuid4().hex[:12]}",
                                                  release_id=release_id, started_by=started_by)


def generation_running(generation_id: str) -> V1ProcessGeneration:
    generation = V1ProcessGeneration.objects.filter(generation_id=generation_id).first()
    if generation is None or generation.state != GenerationState.RUNNING:
        raise V1GenerationRefused(f"generation {generation_id} is not running")
    return generation


def _effect_body(item: V1WorkItem) -> bytes:
    return json.dumps({"account": item.account_key, "partition": item.partition, "position": int(item.position),
                       "payload_sha256": bytes(item.payload_digest).hex()}, sort_keys=True).encode()


def claim_next(generation_id: str) -> V1WorkItem | None:
    """Claim the oldest accepted item (SKIP LOCKED) and author its continuation effect, in one transaction."""
    with transaction.atomic():
        generation_running(generation_id)
        item = (V1WorkItem.objects.select_for_update(skip_locked=True).filter(state=WorkState.ACCEPTED)
                .order_by("pk").first())
        if item is None:
            return None
        item.claim(generation_id=generation_id, until=timezone.now() + LEASE)
        item.save()
        body = _effect_body(item)
        V1OutboundEffect.objects.get_or_create(
            request_key=f"v1:{item.account_key}:{item.source_key}:{item.transport_key}",
            defaults={"work_item": item, "account_key": item.account_key, "request_body": body,
                      "request_digest": hashlib.sha256(body).digest()})
        return item


def dispatch(effect_pk: int, generation_id: str) -> V1OutboundEffect:
    """Commit the pre-I/O marker, make the one provider call, record its outcome."""
    with transaction.atomic():
        generation_running(generation_id)
        effect = V1OutboundEffect.objects.select_for_update().get(pk=effect_pk)
        if effect.state != EffectState.INTENT:
            return effect
        effect.mark_dispatching(generation_id=generation_id)
        effect.save()
    fault_point("v1.after_dispatching")
    outcome = egress.send(effect, generation_id)
    fault_point("v1.after_request")
    with transaction.atomic():
        effect = V1OutboundEffect.objects.select_for_update().get(pk=effect_pk)
        if outcome.state == EffectState.FINALIZED:
            effect.finalize(remote_id=outcome.remote_id, evidence=outcome.evidence)
        elif outcome.state == EffectState.NO_EFFECT:
            effect.prove_no_effect(evidence=outcome.evidence)
        else:
            effect.mark_ambiguous(evidence=outcome.evidence)
        effect.save()
        if effect.work_item_id is not None:
            complete_if_finished(effect.work_item_id)
    return effect


def complete_if_finished(item_pk: int) -> bool:
    """In the caller's transaction: complete a claimed item whose every effect is terminal, and advance its
    route/partition high-water."""
    item = V1WorkItem.objects.select_for_update().get(pk=item_pk)
    if item.state != WorkState.CLAIMED:
        return False
    if item.effects.exclude(state__in=(EffectState.FINALIZED, EffectState.NO_EFFECT)).exists():
        return False
    item.complete()
    item.save()
    water, created = V1HighWater.objects.select_for_update().get_or_create(
        account_key=item.account_key, route_key=item.route_key, partition=item.partition,
        defaults={"high_water": item.position})
    if not created and water.high_water < item.position:
        water.high_water = item.position
        water.save()
    return True


def work_once(generation_id: str) -> int:
    """One worker step: claim and finish one accepted item, and dispatch every pending root request. Returns the
    number of effects dispatched."""
    sent = 0
    item = claim_next(generation_id)
    scope = Q(work_item__isnull=True) | (Q(work_item=item) if item else Q(pk__in=[]))
    pending = V1OutboundEffect.objects.filter(scope, state=EffectState.INTENT)
    for effect_pk in pending.order_by("pk").values_list("pk", flat=True):
        dispatch(effect_pk, generation_id)
        sent += 1
    return sent


def drain(generation_id: str, *, limit: int = 10_000) -> int:
    """Run work_once until nothing is left (tests, the worker's catch-up)."""
    total = 0
    for _ in range(limit):
        before = V1WorkItem.objects.filter(state=WorkState.ACCEPTED).exists() or V1OutboundEffect.objects.filter(
            state=EffectState.INTENT).exists()
        if not before:
            break
        total += work_once(generation_id)
    return total


def max_position(account_key: str, partition: str) -> int | None:
    return V1WorkItem.objects.filter(account_key=account_key, partition=partition).aggregate(m=Max("position"))["m"]
