"""Row locks of the effects app, after connector's (epoch, account gate, credential gate) in the canonical
order: entity rows come last, effect before destination limiter before permit before holder."""
from __future__ import annotations

from connector.selectors.locks import share_one
from effects.models import (
    DeliveryOperation,
    DestinationLimiter,
    DispatchPermit,
    ProcessGeneration,
    RemoteEffect,
    RemoteLink,
)


# `account_id` / `effect_id`, where the caller already read them: the lock names the row's distribution column
# (or, for a permit, its parent effect) so on the scale-out path it is a single-shard row lock (D-241). Same row.
def effect_for_update(effect_pk: int, *, skip_locked: bool = False, account_id: int | None = None
                      ) -> RemoteEffect | None:
    queryset = RemoteEffect.objects.select_for_update(of=("self",), skip_locked=skip_locked)
    if account_id is not None:
        queryset = queryset.filter(account_id=account_id)
    return queryset.filter(pk=effect_pk).first()


def root_slot_effects_for_update(*, account_id: int, application_scope: str, effect_root_id: str,
                                 effect_slot_id: str) -> list[RemoteEffect]:
    """Every RemoteEffect of one (account, application scope, EffectRoot, EffectSlot), `FOR UPDATE` in ascending pk,
    with its command (an intentional new remote call's admission, D-305). A successor committed by a racer while
    this transaction waited for a predecessor's lock is not in the locking statement's snapshot: the set is read
    again once the locks are held, and locked again until it is stable, so the caller decides on every effect."""
    rows = RemoteEffect.objects.filter(account_id=account_id, command__account_id=account_id,
                                       command__application_scope=application_scope,
                                       command__effect_root_id=effect_root_id, command__effect_slot_id=effect_slot_id)
    while True:
        locked = list(rows.select_for_update(of=("self",)).select_related("command").order_by("pk"))
        if {e.pk for e in locked} == set(rows.values_list("pk", flat=True)):
            return locked


def limiter_for_update(limiter_pk: int) -> DestinationLimiter:
    """A destination's limiter row: after the effect, before any permit (docs/locking.md)."""
    return DestinationLimiter.objects.select_for_update(of=("self",)).get(pk=limiter_pk)


def limiter_for_share(limiter_pk: int) -> DestinationLimiter:
    """A destination's limiter row `FOR SHARE` (the limited sending marker and the withdrawal, D-371): after the
    effect (when one is locked), before any permit. It waits for a settlement that is recording a receiver's
    deferral (`FOR UPDATE`) and then reads the committed row."""
    return share_one(DestinationLimiter.objects.filter(pk=limiter_pk))


def permit_for_update(permit_pk: int, *, effect_id: int | None = None) -> DispatchPermit:
    queryset = DispatchPermit.objects.select_for_update(of=("self",))
    if effect_id is not None:
        queryset = queryset.filter(effect_id=effect_id)
    return queryset.get(pk=permit_pk)


def permits_for_update(permit_pks, *, effect_ids) -> list[DispatchPermit]:
    """Several permits FOR UPDATE in ascending pk, in one statement that names their effects (a batch's, D-345)."""
    return list(DispatchPermit.objects.select_for_update(of=("self",))
                .filter(pk__in=sorted(set(permit_pks)), effect_id__in=sorted(set(effect_ids))).order_by("pk"))


def holder_for_share(holder_pk: int) -> ProcessGeneration:
    return share_one(ProcessGeneration.objects.filter(pk=holder_pk))


def holder_for_update(holder_id: str) -> ProcessGeneration | None:
    return ProcessGeneration.objects.select_for_update(of=("self",)).filter(holder_id=holder_id).first()


def delivery_operation_for_update(operation_pk: int) -> DeliveryOperation | None:
    return DeliveryOperation.objects.select_for_update(of=("self",)).filter(pk=operation_pk).first()


def links_for_update(link_pks):
    return list(RemoteLink.objects.filter(pk__in=set(link_pks)).order_by("pk").select_for_update(of=("self",)))
