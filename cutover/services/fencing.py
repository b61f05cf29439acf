"""The holder fence of a publication barrier set (D-133): every coordinator act names the holder and the fence it
observed, and is checked on the set as read under the set's lock; and the one takeover by which a new coordinator
recovers an open set, of either kind (a first activation's or a V2 -> V2 succession's)."""
from __future__ import annotations

from django.db import transaction

from connector.actors import Actor
from connector.errors import FenceStale, PermissionRefused
from connector.services.audit import audit_record
from cutover import locks
from cutover.choices import BARRIER_SET_OPEN
from cutover.errors import BarrierSetRefused
from cutover.models import ServingPublicationBarrierSet
from cutover.services.preflight import PERMISSION as CUTOVER_PERMISSION

__all__ = ["SUCCESSION_PERMISSION", "check_fence", "check_holder", "barrier_set_takeover"]

SUCCESSION_PERMISSION = "cutover.coordinate_succession"


def check_fence(row: ServingPublicationBarrierSet, expected_fence: int | None) -> None:
    if expected_fence is not None and row.fence != expected_fence:
        raise FenceStale(f"{row}: acted on with fence {expected_fence}; the set holds fence {row.fence}")


def check_holder(row: ServingPublicationBarrierSet, holder: str | None, expected_fence: int | None) -> None:
    """A coordinator that is not the set's holder (it was taken over, D-133) or acts with a stale fence is refused
    with FENCE_STALE and changes nothing. None skips that part (an operator acting as whoever holds the set; the
    console compares the fence its page showed)."""
    if holder is not None and row.holder != holder:
        raise FenceStale(f"{row} is held by {row.holder!r}, not {holder!r}: only its holder acts on it (a new "
                         "coordinator takes it over first; a taken-over one acts on nothing)")
    check_fence(row, expected_fence)


def barrier_set_takeover(*, barrier_set_pk: int, holder: str, actor: Actor,
                         expected_fence: int | None = None) -> ServingPublicationBarrierSet:
    """ONE holder-fenced takeover of an open barrier set by `holder` (CV2-11-049, CV2-11-056): the holder changes,
    the fence advances by one, the state, receipts, handoffs and drain stay (PostgreSQL allows no other change,
    migrations 0015 and 0020). Idempotent for the holder that already holds it; `expected_fence`, when given, is
    the fence the new coordinator saw (FENCE_STALE otherwise). The actor needs the permission of the set's kind:
    `coordinate_cutover` for a first activation's set, `coordinate_succession` for a successor's.
    Locks: every owner barrier exclusive, then the set FOR UPDATE (its place in the canonical order,
    docs/locking.md). Writes the set and one `barrier_set_takeover` audit row. Refuses with BARRIER_SET_REFUSED a
    non-canonical holder or a set that is not open."""
    # The kind is a binding column that never changes, so it is read before any lock is taken.
    kinds = ServingPublicationBarrierSet.objects.filter(pk=barrier_set_pk).values_list("attempt_key", flat=True)
    if not kinds:
        raise BarrierSetRefused(f"no barrier set #{barrier_set_pk}; nothing to take over")
    permission = CUTOVER_PERMISSION if kinds[0] else SUCCESSION_PERMISSION
    if actor.user is not None and not actor.user.has_perm(permission):
        raise PermissionRefused(f"{actor} lacks {permission}")
    if not holder or holder != holder.strip():
        raise BarrierSetRefused("a takeover needs a canonical holder identity")
    with transaction.atomic():
        row = locks.barrier_set_for_update(barrier_set_pk)
        if row.state not in BARRIER_SET_OPEN:
            raise BarrierSetRefused(f"{row} was released meanwhile; nothing to take over")
        if row.holder == holder:
            return row
        check_fence(row, expected_fence)
        previous = row.holder
        row.take_over(holder=holder)
        row.save()
        audit_record(actor=actor, entity=row, action="barrier_set_takeover", from_state=row.state,
                     to_state=row.state, fence=row.fence, reason=f"holder {previous} -> {holder}")
    return row
