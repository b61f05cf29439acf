"""An intentional new remote call is a separate operator-authorized business intent, never a replay side effect
(seed "Replay and external effects", CV2-09-019..024, D-305..D-309). Its admission reconciles every predecessor
RemoteEffect of the same (account, application scope, EffectRootID, EffectSlotID) under their row locks:

- `prepared` or `dispatching`: the existing effect resumes on the normal path; no new effect (disposition
  `resumed`);
- `remote_confirmed` or `finalized`: the effect occurred; RemoteCallEffectOccurred, nothing written;
- `uncertain` (or `quarantined`, never proven): RemoteCallBlocked until reconciliation proves it; nothing written;
- every predecessor proven terminal `no_effect`: a successor EffectGenerationID is authored through the normal
  outbound author, linked to the latest predecessor and with a newly frozen dispatch binding (disposition
  `successor`).

A replay never reaches this module's author: it only records, at its admission, which EffectRoots its
predecessor authored (`replay_correlate`), and mints nothing."""
from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime

from django.db import transaction

from connector.actors import Actor
from connector.canonical.encoding import encode
from connector.errors import FenceStale, PermissionRefused
from connector.receipts import canonical_json, rec
from connector.services.admission import account_get
from connector.services.audit import audit_record
from connector.services.guard import lock_serving
from connector.services.owners import ident
from effects import locks
from effects.choices import EffectState
from effects.errors import RemoteCallBlocked, RemoteCallEffectOccurred, RemoteCallRefused
from effects.models import OutboundCommand, RemoteCallIntent, RemoteEffect, ReplayEffectCorrelation
from effects.services import outbound
from effects.services.runtime_bridge import wake_after_commit

INTENT_PROTOCOL = "nexuscrm.effects.remote-call-intent.v1"
PERMISSION = "effects.authorize_remote_call"
OPEN = (EffectState.PREPARED, EffectState.DISPATCHING)
OCCURRED = (EffectState.REMOTE_CONFIRMED, EffectState.FINALIZED)
UNPROVEN = (EffectState.UNCERTAIN, EffectState.QUARANTINED)


def successor_generation_id(intent_id: str) -> str:
    """The EffectGenerationID an intent mints: derived from the intent, so asking again never mints another."""
    return f"intent:{intent_id}"


def _request_digest(*, account_key: str, intent_id: str, application_scope: str, effect_root_id: str,
                    effect_slot_id: str, body: dict | None, path_params: dict | None, reason: str,
                    principal: str) -> bytes:
    return hashlib.sha256(encode(INTENT_PROTOCOL, rec(
        account_key=account_key, intent_id=intent_id, application_scope=application_scope,
        effect_root_id=effect_root_id, effect_slot_id=effect_slot_id, body=canonical_json(body),
        path_params=canonical_json(path_params), reason=reason, principal=principal))).digest()


def _same_request(command: OutboundCommand) -> tuple[dict, dict]:
    """The body and path parameters that author the predecessor's call again: the canonical body bytes it froze,
    and the path parameter the runtime bridge fills from the record key, which is the command's owner slot
    (`runtime_bridge._author_call`). Only for commands that name their owner slot; others need them given."""
    if not command.owner_slot:
        raise RemoteCallRefused(f"command #{command.pk} names no owner slot: give the body and path parameters")
    return json.loads(bytes(command.request_body)), {"record_key": command.owner_slot}


@transaction.atomic
def remote_call_authorize(*, account_key: str, intent_id: str, application_scope: str, effect_root_id: str,
                          effect_slot_id: str, reason: str, actor: Actor, body: dict | None = None,
                          path_params: dict | None = None,
                          shown: tuple[int, datetime] | None = None) -> RemoteCallIntent:
    """Admit an operator's intentional new remote call for an EffectRoot and slot that already has effects (see
    the module docstring for the four dispositions). Lock order: the account's serving guard (epoch, gate) first,
    then the predecessor effects. Without `body` and `path_params` the successor repeats the latest predecessor's
    request (re-frozen under the current epoch); an operator may give them instead. `shown` = (effect pk, its
    `changed_at` as the page showed it): a screen's state token, compared under the lock (FenceStale if moved).
    Repeating the same intent ID with the same bytes returns the recorded intent;
    different bytes raise RemoteCallRefused. Raises PermissionRefused, RemoteCallRefused, RemoteCallEffectOccurred,
    RemoteCallBlocked and every outbound authoring refusal; a refusal writes nothing."""
    intent_id = ident(intent_id, "intent_id")
    if not reason.strip():
        raise RemoteCallRefused("an intentional new remote call needs a reason")
    if actor.user is not None and not actor.user.has_perm(PERMISSION):
        raise PermissionRefused(f"{actor} lacks the {PERMISSION} permission")
    account = account_get(account_key)
    ctx = lock_serving(account_id=account.pk)
    digest = _request_digest(account_key=account.account_key, intent_id=intent_id,
                             application_scope=application_scope, effect_root_id=effect_root_id,
                             effect_slot_id=effect_slot_id, body=body, path_params=path_params, reason=reason,
                             principal=actor.principal)
    effects = locks.root_slot_effects_for_update(account_id=account.pk, application_scope=application_scope,
                                                 effect_root_id=effect_root_id, effect_slot_id=effect_slot_id)
    if shown is not None:
        seen = next((e for e in effects if e.pk == shown[0]), None)
        if seen is None or not isinstance(shown[1], datetime) or seen.changed_at != shown[1]:
            raise FenceStale(f"effect #{shown[0]} changed since the page was shown; reload and decide again")
    existing = RemoteCallIntent.objects.filter(account=account, intent_id=intent_id).first()
    if existing is not None:
        if not hmac.compare_digest(bytes(existing.request_digest), digest):
            raise RemoteCallRefused(f"intent {intent_id} exists with different bytes")
        return existing
    if not effects:
        raise RemoteCallRefused(f"no RemoteEffect exists for {effect_root_id}/{effect_slot_id}: a first call is "
                                "authored by Runtime, not by an operator intent")
    reconciled = [{"effect": e.pk, "generation": e.command.effect_generation_id, "state": e.state} for e in effects]
    occurred = [e for e in effects if e.state in OCCURRED]
    if occurred:
        raise RemoteCallEffectOccurred(f"effect #{occurred[0].pk} ({occurred[0].command.effect_generation_id}) is "
                                       f"{occurred[0].state}: the remote call happened; no new generation")
    unproven = [e for e in effects if e.state in UNPROVEN]
    if unproven:
        raise RemoteCallBlocked(f"effect #{unproven[0].pk} ({unproven[0].command.effect_generation_id}) is "
                                f"{unproven[0].state}: reconcile it to confirmed or proven no_effect first")
    fields = dict(account=account, intent_id=intent_id, application_scope=application_scope,
                  effect_root_id=effect_root_id, effect_slot_id=effect_slot_id, principal=actor.principal,
                  reason=reason, request_digest=digest, epoch_id=ctx.epoch_pk, gate_fence=ctx.fence,
                  reconciled=reconciled)
    open_effects = [e for e in effects if e.state in OPEN]
    if open_effects:
        intent = RemoteCallIntent.objects.create(**fields, disposition="resumed", resumed_effect=open_effects[0])
        to_state = open_effects[0].state
    else:
        # Every predecessor is proven terminal no_effect: the chain's last generation (the one no successor names)
        # is the predecessor; the OneToOne predecessor column admits one successor per command in PostgreSQL.
        linked = set(OutboundCommand.objects.filter(predecessor_id__in=[e.command_id for e in effects])
                     .values_list("predecessor_id", flat=True))
        latest = [e for e in effects if e.command_id not in linked]
        if len(latest) != 1:  # pragma: no cover - the locks above make the chain's tail exactly one effect
            raise RemoteCallRefused(f"{effect_root_id}/{effect_slot_id} has no single latest generation")
        latest = latest[0]
        if body is None or path_params is None:
            body, path_params = _same_request(latest.command)
        command = outbound.outbound_successor_author(
            ctx=ctx, predecessor_command_id=latest.command_id,
            effect_generation_id=successor_generation_id(intent_id), body=body, path_params=path_params,
            account_key=account.account_key)
        intent = RemoteCallIntent.objects.create(**fields, disposition="successor", predecessor_effect=latest,
                                                 successor_command=command)
        to_state = EffectState.PREPARED
    if to_state == EffectState.PREPARED:
        wake_after_commit()
    audit_record(actor=actor, entity=intent, action=f"remote_call_authorize_{intent.disposition}",
                 to_state=intent.disposition, fence=ctx.fence, evidence_digest=digest, reason=reason)
    return intent


def remote_call_for_effect(*, effect_pk: int, reason: str, actor: Actor, expected_changed_at) -> RemoteCallIntent:
    """The governance screen's form on an effect page: an intent for that effect's root and slot repeating the
    latest predecessor's request. Its intent ID is derived from the effect and the state token the page showed,
    so posting the same page again returns the same intent; a page shown before the effect moved is FenceStale."""
    row = (RemoteEffect.objects.filter(pk=effect_pk)
           .values_list("account__account_key", "command__application_scope", "command__effect_root_id",
                        "command__effect_slot_id").first())
    if row is None:
        raise RemoteCallRefused(f"no effect #{effect_pk}")
    if not isinstance(expected_changed_at, datetime):
        raise FenceStale(f"the request carried no change time of effect #{effect_pk}; reload and decide again")
    account_key, scope, root, slot = row
    return remote_call_authorize(
        account_key=account_key, intent_id=f"effect-{effect_pk}-{int(expected_changed_at.timestamp() * 1e6)}",
        application_scope=scope, effect_root_id=root, effect_slot_id=slot, reason=reason, actor=actor,
        shown=(effect_pk, expected_changed_at))


# -- replay correlation (CV2-09-019) ------------------------------------------------------------------------------

def replay_correlate(request) -> list[ReplayEffectCorrelation]:
    """Registered with `connector.hooks.register_replay_admitted`: runs inside the replay-admission transaction,
    after the ReplayRequest row is written. Records, for each OutboundCommand the predecessor event's executions
    authored (and each root an earlier replay of that event already correlated: lineage), that this replay
    correlates with its EffectRootID. Writes only this evidence: a replay mints no command, effect or generation."""
    event = request.predecessor_event
    if event is None:  # a V1 predecessor (D-331): its effects were V1's, never V2 roots (V2 never reads V1, D-330)
        return []
    commands = set(OutboundCommand.objects.filter(source_execution__projection__event_id=event.pk)
                   .values_list("pk", flat=True))
    if event.replay_request_id is not None:
        commands |= set(ReplayEffectCorrelation.objects.filter(replay_request_id=event.replay_request_id)
                        .values_list("predecessor_command_id", flat=True))
    rows = [ReplayEffectCorrelation(replay_request=request, predecessor_command=c,
                                    application_scope=c.application_scope, effect_root_id=c.effect_root_id,
                                    effect_slot_id=c.effect_slot_id,
                                    predecessor_generation_id=c.effect_generation_id)
            for c in OutboundCommand.objects.filter(pk__in=commands).order_by("pk")]
    return ReplayEffectCorrelation.objects.bulk_create(rows)
