"""The holder fence of a publication barrier set (D-133): every coordinator act names the holder and the fence it
observed, and is checked on the set as read under the set's lock."""
from __future__ import annotations

from connector.errors import FenceStale
from cutover.models import ServingPublicationBarrierSet


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
