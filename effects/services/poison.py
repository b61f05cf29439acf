"""Quarantine writes of the effects app's items after a deterministic failure of a worker or sweeper step
(decision D-168; the isolation and the evidence are connector.services.poison's).

A RemoteEffect still `prepared` has crossed no boundary: it moves to `quarantined` (EFFECT_STEP_FAILED). Any later
state may hold an open permit or an unsettled attempt, whose fate only the crash rules decide (permit settlement,
abandonment with proof, reconciliation); there the failure only marks the effect's `quarantine_reason` (a hold, as
REMOTE_LINK_CONFLICT does) so the sweep stops retrying it and the operator sees it. A DeliveryOperation keeps its
contract state and is held (`held_reason` DELIVERY_STEP_FAILED): the sweep and the step skip it."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from connector.actors import Actor
from connector.choices import StepFailureReason
from connector.errors import TransitionRefused
from connector.services import poison
from connector.services.audit import audit_record
from connector.services.poison import step_failure_record
from effects import locks
from effects.choices import EffectState
from effects.models import DeliveryOperation, RemoteEffect
from effects.selectors import RELEASABLE_KINDS

TERMINAL = (EffectState.FINALIZED, EffectState.NO_EFFECT, EffectState.QUARANTINED)


def effect_quarantine(exc: Exception, *, effect_pk: int, step: str) -> bool:
    """Quarantine a prepared effect, or hold a later non-terminal one (see the module docstring). Returns whether
    anything was written."""
    reason = StepFailureReason.EFFECT_STEP_FAILED
    with transaction.atomic():
        effect = locks.effect_for_update(effect_pk)
        if effect is None or effect.state in TERMINAL or effect.quarantine_reason:
            return False
        was = effect.state
        if effect.state == EffectState.PREPARED:
            effect.quarantine(reason=reason)
            effect.save()
        else:
            RemoteEffect.objects.filter(pk=effect_pk).update(quarantine_reason=reason)
        step_failure_record(entity=effect, step=step, reason=reason, exc=exc, from_state=was, to_state=effect.state)
        return True


def delivery_hold(exc: Exception, *, operation_pk: int, step: str) -> bool:
    """Hold one delivery operation (its contract state unchanged). Returns whether it was held now."""
    with transaction.atomic():
        operation = locks.delivery_operation_for_update(operation_pk)
        if operation is None or operation.held_reason:
            return False
        DeliveryOperation.objects.filter(pk=operation_pk).update(
            held_reason=StepFailureReason.DELIVERY_STEP_FAILED, held_at=timezone.now())
        step_failure_record(entity=operation, step=step, reason=StepFailureReason.DELIVERY_STEP_FAILED, exc=exc,
                            from_state=operation.state, to_state=operation.state)
        return True


def effect_release(*, effect_pk: int, actor: Actor, reason: str) -> bool:
    """Lift an EFFECT_STEP_FAILED hold from an effect that is not `quarantined` (a quarantined effect is final:
    a new intent needs a new EffectRoot). The state is untouched. Returns whether a hold was lifted."""
    if not reason.strip():
        raise TransitionRefused("a release needs a reason")
    with transaction.atomic():
        effect = locks.effect_for_update(effect_pk)
        if (effect is None or effect.state == EffectState.QUARANTINED
                or effect.quarantine_reason != StepFailureReason.EFFECT_STEP_FAILED):
            return False
        RemoteEffect.objects.filter(pk=effect_pk).update(quarantine_reason="")
        audit_record(actor=actor, entity=effect, action="effect_release", from_state=effect.state,
                     to_state=effect.state, reason=reason)
        return True


def delivery_release(*, operation_pk: int, actor: Actor, reason: str) -> bool:
    """Put a held delivery operation back in the sweep (its contract state untouched). Returns whether released."""
    if not reason.strip():
        raise TransitionRefused("a release needs a reason")
    with transaction.atomic():
        operation = locks.delivery_operation_for_update(operation_pk)
        if operation is None or not operation.held_reason:
            return False
        DeliveryOperation.objects.filter(pk=operation_pk).update(held_reason="", held_at=None)
        audit_record(actor=actor, entity=operation, action="delivery_release", from_state=operation.state,
                     to_state=operation.state, reason=reason)
        return True


def poison_release_item(*, code: str, pk: int, actor: Actor, reason: str) -> bool:
    """Release one item held with `code` through the release service of its kind (`materialization_release`,
    `lane_release`, `effect_release`, `delivery_release`): each locks its item, re-checks the hold, lifts it and
    writes its audit row in its own transaction. The bulk release (governance, `manage.py poison_release --all`)
    calls it once per item (D-490). Returns whether this call released it (False: not held any more, e.g. an
    other operator released it first). Raises TransitionRefused for a blank reason, KeyError for another code."""
    kind = RELEASABLE_KINDS[code]
    if kind == "receipt":
        return poison.materialization_release(receipt_pk=pk, actor=actor, reason=reason)
    if kind == "lane":
        return poison.lane_release(lane_pk=pk, actor=actor, reason=reason)
    if kind == "effect":
        return effect_release(effect_pk=pk, actor=actor, reason=reason)
    return delivery_release(operation_pk=pk, actor=actor, reason=reason)
