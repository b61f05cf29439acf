"""The successor activation transaction's shape (issue 19, D-278..D-280): its statement count does not grow with the
lanes and handoffs, the handoffs are compared with their locked lanes in one SQL join, and a handoff whose bytes do
not match its recomputed digest (append-only rows, checked before the transaction) still refuses the activation.

Proves: CV2-11-023, CV2-11-024, CV2-14-007 (set-based form)
"""
from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from connector.choices import EpochState
from connector.models import OrderingLane
from cutover.choices import BarrierSetState
from cutover.errors import SuccessorActivationRefused
from cutover.models import OrderingHandoff, ServingPublicationBarrierSet
from cutover.services import succession
from tests import dbroles
from tests.connector.inbound_helpers import drain
from tests.cutover.succession_helpers import (
    ACTOR,
    build_succession_world,
    halt_all,
    handoff_all,
    held_barrier,
    send,
    state_of,
)

# Measured: barrier set lock, both epochs, the gates, effects, executions, receipts, windows, the lane locks with
# the handoff/lane comparison (one statement, D-288), the barrier set's UPDATE + audit, each epoch's UPDATE + audit,
# the gates' UPDATE with their audit rows (one statement, D-279).
SUCCESSOR_TRANSACTION_STATEMENTS = 16


def _ready(prefix: str, records: int):
    """A succession world with `records` lanes per account (2 accounts), every gate halted, the set held and one
    handoff per predecessor lane."""
    world = build_succession_world(prefix)
    for i in range(records):
        for account in world.accounts:
            send(world, f"evt-{account.pk}-{i}", 10 + i, record=f"rec-{i}", account=account)
    drain()
    halt_all(world)
    barrier = held_barrier(world)
    handoffs = handoff_all(world, barrier)
    assert len(handoffs) == 2 * records
    return world, barrier


def _transaction_statements(queries) -> list[str]:
    """The statements from the barrier set's FOR UPDATE (the transaction's first lock) to the end of the call."""
    sqls = [q["sql"] for q in queries.captured_queries]
    first = next(i for i, sql in enumerate(sqls) if "cutover_servingpublicationbarrierset" in sql
                 and "FOR UPDATE" in sql)
    return [sql for sql in sqls[first:] if sql not in ("BEGIN", "COMMIT") and not sql.startswith("SAVEPOINT")
            and not sql.startswith("RELEASE SAVEPOINT")]


def test_successor_transaction_statement_count_does_not_grow_with_lanes_and_handoffs(db):
    """successor_activate's transaction runs the same number of statements with 2 handoffs and with 12: the
    handoffs are read as pks, the lanes locked by one statement and compared in one join, the gates moved with
    their audit rows by one statement. (R27, R31; CV2-11-023)"""
    counts = []
    for prefix, records in (("sh1-", 1), ("sh6-", 6)):
        world, barrier = _ready(prefix, records)
        with CaptureQueriesContext(connection) as queries:
            epoch = succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence,
                                                  actor=ACTOR)
        assert epoch.state == EpochState.ACTIVE
        counts.append(len(_transaction_statements(queries)))
        succession.barrier_set_release(barrier_set_pk=barrier.pk, expected_fence=None,
                                       reason="readback verified", actor=ACTOR)
    assert counts[0] == counts[1] <= SUCCESSOR_TRANSACTION_STATEMENTS, counts


@contextmanager
def _triggers_off():
    """Bypass the row triggers (append-only handoffs): the tampering only a broken database could show."""
    with transaction.atomic(), connection.cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute("SET LOCAL session_replication_role = replica")
        yield cursor
        cursor.execute("SET LOCAL session_replication_role = origin")
        dbroles.admin_off(cursor)


@pytest.mark.parametrize("tamper", ["successor_baseline", "predecessor_fence", "predecessor_halt_reason",
                                    "handoff_digest", "handoff_high_water"])
def test_a_handoff_that_does_not_byte_match_refuses_the_activation(db, tamper):
    """A successor lane whose baseline differs from its handoff's high-water, a predecessor lane whose fence or
    halt reason is no longer the frozen one (the SQL join, under the lane locks), or a handoff row whose bytes no
    longer give its digest (checked before the transaction) refuses the whole activation: nothing moves.
    (CV2-11-018, CV2-11-023, CV2-11-052)"""
    world, barrier = _ready(f"tm-{tamper[:6]}-", 2)
    handoff = OrderingHandoff.objects.order_by("pk").last()
    with _triggers_off() as cursor:
        if tamper == "successor_baseline":
            cursor.execute("UPDATE connector_orderinglane SET baseline = baseline - 1 WHERE id = %s",
                           [handoff.successor_lane_id])
        elif tamper == "predecessor_fence":
            cursor.execute("UPDATE connector_orderinglane SET fence = fence + 1 WHERE id = %s",
                           [handoff.predecessor_lane_id])
        elif tamper == "predecessor_halt_reason":
            cursor.execute("UPDATE connector_orderinglane SET halt_reason = 'OTHER' WHERE id = %s",
                           [handoff.predecessor_lane_id])
        elif tamper == "handoff_digest":
            cursor.execute("UPDATE cutover_orderinghandoff SET handoff_digest = %s WHERE id = %s",
                           [b"\x00" * 32, handoff.pk])
        else:  # the handoff's high-water with its lanes: the lanes no longer match, nor the digest
            cursor.execute("UPDATE cutover_orderinghandoff SET high_water = high_water + 1 WHERE id = %s",
                           [handoff.pk])
    before = state_of(world)
    match = "does not byte-match its recomputed digest" if tamper.startswith("handoff") else "does not byte-match its lanes"
    with pytest.raises(SuccessorActivationRefused, match=f"OrderingHandoff #{handoff.pk} {match}"):
        succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert state_of(world) == before
    assert ServingPublicationBarrierSet.objects.get(pk=barrier.pk).state == BarrierSetState.HELD
    assert OrderingLane.objects.filter(epoch=world.successor).count() == 4


def test_a_handoff_written_after_the_reread_is_verified_under_the_locks(db, monkeypatch):
    """The digests are checked before the transaction; a handoff the reread did not see (written in between) is
    checked inside it, under the lane locks, so a bad one still refuses. (CV2-11-023, D-280)"""
    world, barrier = _ready("late-", 1)
    real = succession.verify_handoff_digests
    calls = []

    def reread_sees_none(queryset):
        calls.append(queryset)
        return 0 if len(calls) == 1 else real(queryset)

    monkeypatch.setattr(succession, "verify_handoff_digests", reread_sees_none)
    handoff = OrderingHandoff.objects.order_by("pk").first()
    with _triggers_off() as cursor:
        cursor.execute("UPDATE cutover_orderinghandoff SET handoff_digest = %s WHERE id = %s",
                       [b"\x00" * 32, handoff.pk])
    with pytest.raises(SuccessorActivationRefused, match="recomputed digest"):
        succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, actor=ACTOR)
    assert len(calls) == 2
    assert ServingPublicationBarrierSet.objects.get(pk=barrier.pk).state == BarrierSetState.HELD
