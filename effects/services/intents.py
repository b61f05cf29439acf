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

from django.db import transaction

from connector.actors import Actor
from connector.canonical.encoding import encode
from connector.errors import PermissionRefused
from connector.receipts import canonical_json, rec
from connector.services.admission import account_get
from connector.services.audit import audit_record
from connector.services.guard import lock_serving
from connector.services.owners import ident
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
                    effect_slot_id: str, body: dict, path_params: dict, reason: str, principal: str) -> bytes:
    return hashlib.sha256(encode(INTENT_PROTOCOL, rec(
        account_key=account_key, intent_id=intent_id, application_scope=application_scope,
        effect_root_id=effect_root_id, effect_slot_id=effect_slot_id, body=canonical_json(body),
        path_params=canonical_json(path_params), reason=reason, principal=principal))).digest()


def _lock_predecessors(*, account_id: int, application_scope: str, effect_root_id: str,
                       effect_slot_id: str) -> list[RemoteEffect]:
    """Every RemoteEffect of the root and slot, locked FOR UPDATE in pk order (entity rows, after the serving
    guard). A racer that committed a successor while this transaction waited for a predecessor's lock is not in
    the locking statement's snapshot: the set is read again after the locks are held and locked again until it
    is stable, so the decision is made on every effect that exists."""
    rows = RemoteEffect.objects.filter(account_id=account_id, command__account_id=account_id,
                                       command__application_scope=application_scope,
                                       command__effect_root_id=effect_root_id,
                                       command__effect_slot_id=effect_slot_id)
    while True:
        locked = list(rows.select_for_update(of=("self",)).select_related("command").order_by("pk"))
        if {e.pk for e in locked} == set(rows.values_list("pk", flat=True)):
            return locked


@transaction.atomic
def remote_call_authorize(*, account_key: str, intent_id: str, application_scope: str, effect_root_id: str,
                          effect_slot_id: str, body: dict, path_params: dict, reason: str,
                          actor: Actor) -> RemoteCallIntent:
    """Admit an operator's intentional new remote call for an EffectRoot and slot that already has effects (see
    the module docstring for the four dispositions). Lock order: the account's serving guard (epoch, gate) first,
    then the predecessor effects. Repeating the same intent ID with the same bytes returns the recorded intent;
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
    effects = _lock_predecessors(account_id=account.pk, application_scope=application_scope,
                                 effect_root_id=effect_root_id, effect_slot_id=effect_slot_id)
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


# -- replay correlation (CV2-09-019) ------------------------------------------------------------------------------

def replay_correlate(request) -> list[ReplayEffectCorrelation]:
    """Registered with `connector.hooks.register_replay_admitted`: runs inside the replay-admission transaction,
    after the ReplayRequest row is written. Records, for each OutboundCommand the predecessor event's executions
    authored (and each root an earlier replay of that event already correlated: lineage), that this replay
    correlates with its EffectRootID. Writes only this evidence: a replay mints no command, effect or generation."""
    event = request.predecessor_event
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
