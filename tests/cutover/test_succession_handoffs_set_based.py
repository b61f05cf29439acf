"""The successor's ordering handoffs are set-based (issue 19, D-282): `succession_handoffs.handoff_chunk` hands off
the lanes of a chunk of accounts in one transaction. These tests pin that it writes, for a lane, the rows the
single-lane `succession.ordering_handoff` writes (handoff, frozen predecessor lane, successor lane, audit row; the
digest byte-identical once the new rows' keys are set equal), also for a replacement successor (`derived_from`),
that a lane failing a lane check is refused while the others of the chunk proceed, that a gate not halted refuses
the whole chunk and writes nothing, and that its statement count does not grow with the chunk.

Proves: CV2-11-014, CV2-11-015, CV2-11-018, CV2-11-020, CV2-11-021, CV2-11-046, CV2-14-007 (set-based form)
"""
from __future__ import annotations

import copy

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from connector.models import AuditRecord, OrderingLane
from connector.selectors.routes import route_for
from connector.services import execution, serving
from connector.services import gates as gate_services
from cutover.errors import HandoffRefused
from cutover.models import OrderingHandoff
from cutover.services import handoff_digests, succession, succession_handoffs, succession_phases
from tests.connector.inbound_helpers import advance_lanes
from tests.cutover.succession_helpers import ACTOR, build_succession_world, drain, held_barrier, send

RECORDS = ("rec-1", "rec-2", "rec-3")


class _Rollback(Exception):
    pass


def _world(prefix: str):
    """Two accounts, three partitions each (six predecessor lanes, drained), gates halted, barrier set held."""
    world = build_succession_world(prefix)
    for account in world.accounts:
        for i, record in enumerate(RECORDS):
            send(world, f"evt-{account.pk}-{i}", 10 + i, record=record, account=account)
    drain()
    succession_phases.halt_all(predecessor=world.epoch, actor=ACTOR)
    return world, held_barrier(world)


def _lanes(world) -> list[OrderingLane]:
    return list(OrderingLane.objects.filter(epoch=world.epoch).order_by("pk"))


def _rows(handoff: OrderingHandoff) -> dict:
    """Every row the handoff of one lane wrote, with the new rows' own keys and timestamps left out."""
    skip = {"id", "created_at", "changed_at", "at", "successor_lane_id", "handoff_digest", "entity_id",
            "evidence_digest"}

    def values(obj):
        out = {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields if f.attname not in skip}
        return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in out.items()}

    (audit,) = AuditRecord.objects.filter(entity_type="cutover.OrderingHandoff", entity_id=str(handoff.pk))
    return {"handoff": values(handoff), "predecessor_lane": values(OrderingLane.objects.get(
        pk=handoff.predecessor_lane_id)), "successor_lane": values(OrderingLane.objects.get(
        pk=handoff.successor_lane_id)), "audit": values(audit), "audit_evidence": bytes(audit.evidence_digest)}


def _both_ways(barrier, lane_pk: int) -> tuple[dict, dict]:
    """The rows of one lane's handoff written by ordering_handoff and by handoff_chunk, each rolled back; the
    chunk's digest is recomputed with the single-lane path's successor lane key and must be byte-identical."""
    found = []
    for way in ("single", "chunk"):
        try:
            with transaction.atomic():
                if way == "single":
                    handoff = succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane_pk, actor=ACTOR)
                else:
                    result = succession_handoffs.handoff_chunk(barrier_set_pk=barrier.pk, lane_pks=[lane_pk],
                                                               actor=ACTOR)
                    assert result.refused == {}
                    handoff = OrderingHandoff.objects.get(pk=result.done[lane_pk].pk)
                assert bytes(handoff.handoff_digest) == handoff_digests.digest_of_handoff(handoff)
                raise _Rollback(handoff, _rows(handoff))
        except _Rollback as done:
            found.append(done.args)
    (single, single_rows), (chunk, chunk_rows) = found
    assert single_rows["audit_evidence"] == bytes(single.handoff_digest)
    assert chunk_rows["audit_evidence"] == bytes(chunk.handoff_digest)
    same_keys = copy.copy(chunk)
    same_keys.successor_lane_id = single.successor_lane_id
    assert handoff_digests.digest_of_handoff(same_keys) == bytes(single.handoff_digest)
    return {k: v for k, v in single_rows.items() if k != "audit_evidence"}, {
        k: v for k, v in chunk_rows.items() if k != "audit_evidence"}


def test_the_chunk_writes_the_rows_of_the_single_lane_handoff(db):
    """Same world, one lane each way (before the cutoff, and after it for another lane): the handoff, the frozen
    predecessor lane, the successor lane and the audit row are equal column by column, and the digest is
    byte-identical given the same successor lane key. (CV2-11-014/015/018, D-282)"""
    world, barrier = _world("hi-")
    first, second, *_ = _lanes(world)
    single, chunk = _both_ways(barrier, first.pk)
    assert single == chunk and single["handoff"]["derived_from_id"] is None
    succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=first.pk, actor=ACTOR)  # the cutoff commits
    single, chunk = _both_ways(barrier, second.pk)
    assert single == chunk


def test_a_replacement_successor_chunk_derives_like_the_single_lane_path(db):
    """After the cutoff the candidate is abandoned and rejected: the chunk's handoffs of the frozen lanes cite the
    abandoned ones (`derived_from`), copy their high-water and fence, leave the predecessor lanes untouched, and
    equal the single-lane path's rows. (CV2-11-021, CV2-11-022)"""
    world, barrier = _world("hr-")
    lanes = _lanes(world)
    abandoned = succession_phases.handoff_all(barrier_set=barrier, actor=ACTOR)
    assert abandoned.complete and abandoned.done == len(lanes) == 6
    succession.barrier_set_release(barrier_set_pk=barrier.pk, expected_fence=barrier.fence, reason="failed",
                                   replacement=True, actor=ACTOR)
    first_successor = world.successor
    world.successor = serving.epoch_verify(epoch_pk=serving.epoch_prepare_from_owners(
        epoch_id="hr-epoch-3", configuration_generation_id=world.configuration.generation_id, actor=ACTOR).pk,
        actor=ACTOR)
    replacement = held_barrier(world)
    refused = succession_handoffs.handoff_chunk(barrier_set_pk=replacement.pk, lane_pks=[lanes[0].pk], actor=ACTOR)
    assert "not rejected" in refused.refused[lanes[0].pk] and not refused.done
    serving.epoch_reject(epoch_pk=first_successor.pk, reason="abandoned after the cutoff", actor=ACTOR)
    single, chunk = _both_ways(replacement, lanes[0].pk)
    assert single == chunk and single["handoff"]["derived_from_id"] is not None
    frozen = {lane.pk: lane.fence for lane in _lanes(world)}
    outcome = succession_phases.handoff_all(barrier_set=replacement, actor=ACTOR)
    assert outcome.complete and outcome.done == 6
    assert {lane.pk: lane.fence for lane in _lanes(world)} == frozen
    derived = OrderingHandoff.objects.filter(successor_epoch=world.successor).order_by("predecessor_lane_id")
    prior = {h.predecessor_lane_id: h for h in OrderingHandoff.objects.filter(successor_epoch=first_successor)}
    assert [(h.derived_from_id, h.high_water, h.predecessor_lane_fence) for h in derived] == [
        (prior[h.predecessor_lane_id].pk, prior[h.predecessor_lane_id].high_water,
         prior[h.predecessor_lane_id].predecessor_lane_fence) for h in derived]


def test_a_lane_with_nonterminal_work_is_refused_and_the_others_of_the_chunk_proceed(db):
    """One claimed execution on one lane: that lane is refused with the single-lane path's detail and stays open
    at its fence; every other lane of the chunk is handed off in the same transaction. (CV2-11-014, CV2-11-046)"""
    world = build_succession_world("hn-")
    send(world, "evt-1", 1)
    send(world, "evt-2", 2, record="rec-2")
    send(world, "evt-3", 3, record="rec-3", account=world.accounts[1])
    drain()
    send(world, "evt-9", 9)
    advance_lanes()
    token = execution.execution_claim(holder="w1")
    succession_phases.halt_all(predecessor=world.epoch, actor=ACTOR)
    barrier = held_barrier(world)
    busy = OrderingLane.objects.get(epoch=world.epoch, partition="rec-1")
    result = succession_handoffs.handoff_chunk(barrier_set_pk=barrier.pk, lane_pks=[x.pk for x in _lanes(world)],
                                               actor=ACTOR)
    assert list(result.refused) == [busy.pk] and "nonterminal execution" in result.refused[busy.pk]
    assert sorted(result.done) == sorted(x.pk for x in _lanes(world) if x.pk != busy.pk)
    assert OrderingLane.objects.get(pk=busy.pk).fence == busy.fence
    with pytest.raises(HandoffRefused, match="nonterminal execution"):
        succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=busy.pk, actor=ACTOR)
    execution.execution_run(token=token)
    assert succession_phases.handoff_all(barrier_set=barrier, actor=ACTOR).complete


def test_a_gate_not_halted_refuses_the_whole_chunk_before_the_cutoff(db):
    """Before the first handoff every gate of the service is locked and checked: one gate resumed to v2_serving
    refuses a chunk of the OTHER account's lanes, naming that gate, and nothing is written. (CV2-11-020)"""
    world, barrier = _world("hg-")
    resumed, other = world.accounts
    gate_services.gate_transition(account_id=resumed.pk, action="resume_predecessor", expected_fence=None,
                                  actor=ACTOR)
    lanes = [x.pk for x in _lanes(world) if x.account_id == other.pk]
    audits = AuditRecord.objects.count()
    with pytest.raises(HandoffRefused, match=f"not halted: {resumed.pk}=v2_serving"):
        succession_handoffs.handoff_chunk(barrier_set_pk=barrier.pk, lane_pks=lanes, actor=ACTOR)
    assert not OrderingHandoff.objects.exists() and AuditRecord.objects.count() == audits
    assert not OrderingLane.objects.filter(epoch=world.successor).exists()


def _chunk_statements(world, barrier, lane_pks: list[int]) -> int:
    for lane in OrderingLane.objects.filter(pk__in=lane_pks):  # compiled route programs are cached per epoch
        for epoch in (world.epoch, world.successor):
            route_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), account_id=lane.account_id,
                      channel=lane.route)
    try:
        with transaction.atomic(), CaptureQueriesContext(connection) as queries:
            result = succession_handoffs.handoff_chunk(barrier_set_pk=barrier.pk, lane_pks=lane_pks, actor=ACTOR)
            assert sorted(result.done) == sorted(lane_pks)
            raise _Rollback(len(queries))
    except _Rollback as done:
        return done.args[0]


# Measured: the lanes and barrier set read before the transaction, the enabled routes (one query per epoch and
# route, whatever the accounts), the account set, the barrier set FOR SHARE,
# both epochs FOR SHARE, the cutoff read, the gates FOR SHARE (and after the cutoff the service's gate count), the
# unmaterialized receipts, the lanes FOR UPDATE, the existing handoffs, the lane checks (executions, projections,
# successor lanes), the freeze UPDATE, the successor lanes INSERT (in a savepoint), the handoffs INSERT and the
# audit INSERT.
HANDOFF_CHUNK_STATEMENTS = 25


def test_handoff_chunk_statement_count_does_not_grow_with_the_chunk(db):
    """handoff_chunk runs the same number of statements for one lane and for five, before and after the cutoff
    (R27, R31)."""
    world, barrier = _world("hs-")
    lanes = [x.pk for x in _lanes(world)]
    before = (_chunk_statements(world, barrier, lanes[:1]), _chunk_statements(world, barrier, lanes[1:]))
    succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lanes[0], actor=ACTOR)
    after = (_chunk_statements(world, barrier, lanes[1:2]), _chunk_statements(world, barrier, lanes[1:]))
    assert before[0] == before[1] <= HANDOFF_CHUNK_STATEMENTS
    assert after[0] == after[1] <= HANDOFF_CHUNK_STATEMENTS
