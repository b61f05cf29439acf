"""Saves that name their shard (issue 23, docs/scale-out.md, D-244).

A transition-guarded `save()` (django_fsm's ConcurrentTransitionMixin) updates `WHERE state = <loaded> AND id = pk`;
on the Citus path that UPDATE is routed to one shard only when it also names the distribution column (or, for a
table filled from its parent, the parent key). `RoutedSaveMixin` adds the row's own values of `ROUTE_FIELDS` to the
update's filter: the same row (those columns never change), the same compare-and-set, one more equality."""
from __future__ import annotations

__all__ = ["RoutedSaveMixin"]


class RoutedSaveMixin:
    ROUTE_FIELDS: tuple[str, ...] = ("account_id",)

    def _do_update(self, base_qs, *args, **kwargs):
        route = {name: getattr(self, name) for name in self.ROUTE_FIELDS if getattr(self, name) is not None}
        return super()._do_update(base_qs.filter(**route), *args, **kwargs)
