"""The one edge of a barrier set that is not a state transition, the holder takeover (D-133, migration 0020), as
PostgreSQL enforces it on a V2 -> V2 successor set: the holder and the fence (+1) change, nothing else, only on an
open set. Every other pair of (state, holder) changes stays refused."""
from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from cutover.choices import BarrierSetState
from cutover.models import ServingPublicationBarrierSet
from cutover.services import succession
from tests.cutover.succession_helpers import ACTOR, build_succession_world, held_barrier

TX = pytest.mark.django_db(transaction=True, databases=["default", "journal"])
TAKEOVER = "cutover_servingpublicationbarrierset_takeover"
FENCE = "cutover_servingpublicationbarrierset_fence_advance"


def refused(rows, change: dict) -> str:
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        rows.update(**change)
    return info.value.__cause__.diag.constraint_name


@TX
def test_postgresql_allows_a_successor_set_takeover_as_one_holder_and_fence_step_only():
    """On a held successor set a raw UPDATE may change the holder with the fence + 1 (what `take_over` writes) and
    nothing more: without the fence step, with two steps, together with the state, the owner receipts digest or the
    release reason, or to an empty holder, it is refused; a released set is never taken over. Proves: issue 42
    item 1"""
    world = build_succession_world("tr-")
    row = held_barrier(world)
    rows = ServingPublicationBarrierSet.objects.filter(pk=row.pk)
    fence = row.fence
    assert refused(rows, {"holder": "b"}) == FENCE
    assert refused(rows, {"holder": "b", "fence": fence + 2}) == FENCE
    assert refused(rows, {"holder": "b", "fence": fence + 1, "state": BarrierSetState.RELEASED}) == TAKEOVER
    assert refused(rows, {"holder": "b", "fence": fence + 1, "owner_receipts_digest": b"x" * 32}) == TAKEOVER
    assert refused(rows, {"holder": "b", "fence": fence + 1, "release_reason": "rides along"}) == TAKEOVER
    assert refused(rows, {"holder": "", "fence": fence + 1}) == TAKEOVER
    assert rows.update(holder="b", fence=fence + 1) == 1  # the one legal form
    succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=fence + 1, holder="b", reason="done",
                                   actor=ACTOR)
    assert refused(rows, {"holder": "c", "fence": fence + 3}) == TAKEOVER
    assert (rows.get().holder, rows.get().state) == ("b", BarrierSetState.RELEASED)
