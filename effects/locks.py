"""Row locks of the effects app, after connector's (epoch, account gate, credential gate) in the canonical
order: entity rows come last, effect before destination limiter before permit before holder."""
from __future__ import annotations

from connector.selectors.locks import share_one
from effects.models import DeliveryOperation, DestinationLimiter, DispatchPermit, ProcessGeneration, RemoteEffect


# `account_id` / `effect_id`, where the caller already read them: the lock names the row's distribution column
# (or, for a permit, its parent effect) so on the scale-out path it is a single-shard row lock (D-241). Same row.
def effect_for_update(effect_pk: int, *, skip_locked: bool = False, account_id: int | None = None
                      ) -> RemoteEffect | None:
    queryset = RemoteEffect.objects.select_for_update(of=("self",), skip_locked=skip_locked)
    if account_id is not None:
        queryset = queryset.filter(account_id=account_id)
    return queryset.filter(pk=effect_pk).first()


def limiter_for_update(limiter_pk: int) -> DestinationLimiter:
    """A destination's limiter row: after the effect, before any permit (docs/locking.md)."""
    return DestinationLimiter.objects.select_for_update(of=("self",)).get(pk=limiter_pk)


def permit_for_update(permit_pk: int, *, effect_id: int | None = None) -> DispatchPermit:
    queryset = DispatchPermit.objects.select_for_update(of=("self",))
    if effect_id is not None:
        queryset = queryset.filter(effect_id=effect_id)
    return queryset.get(pk=permit_pk)


def holder_for_share(holder_pk: int) -> ProcessGeneration:
    return share_one(ProcessGeneration.objects.filter(pk=holder_pk))


def holder_for_update(holder_id: str) -> ProcessGeneration | None:
    return ProcessGeneration.objects.select_for_update(of=("self",)).filter(holder_id=holder_id).first()


def delivery_operation_for_update(operation_pk: int) -> DeliveryOperation | None:
    return DeliveryOperation.objects.select_for_update(of=("self",)).filter(pk=operation_pk).first()


def links_for_update(link_pks):
    from effects.models import RemoteLink

    return list(RemoteLink.objects.filter(pk__in=set(link_pks)).order_by("pk").select_for_update(of=("self",)))
