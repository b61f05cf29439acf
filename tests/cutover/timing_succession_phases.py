"""Timing of the successor phases halt_all and handoff_all (issue 19, D-281/D-282), per-gate/per-lane paths vs the
set-based chunks, side by side in one run on two identical worlds. Not part of the suite (no `test_` file name):

    TIMING_ACCOUNTS=1000 [TIMING_PER_ROW=0] /work/t.sh WORKTREE _SUFFIX REDISDB \
        tests/cutover/timing_succession_phases.py -s -q --timeout 3600

Each world: TIMING_ACCOUNTS accounts through the owner services (pack A, one epoch active, a successor verified),
TIMING_PARTITIONS open lanes per account on the predecessor (bulk-inserted: lanes with a high-water, no work on
them, which is what a drained predecessor hands off). World "per-row" runs gate_transition twice per account then
ordering_handoff per lane (the paths before issue 19); world "set" runs succession_phases.halt_all and handoff_all.
"""
from __future__ import annotations

import os
import time

import pytest

from connector.choices import GateMode
from connector.models import AccountServingGate, OrderingLane
from connector.services import gates as gate_services
from connector.services import serving
from cutover.models import OrderingHandoff
from cutover.services import succession, succession_phases
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import build_inbound_world
from tests.cutover.succession_helpers import ACTOR, WEBHOOK, held_barrier

ACCOUNTS = int(os.environ.get("TIMING_ACCOUNTS", "20"))
PARTITIONS = int(os.environ.get("TIMING_PARTITIONS", "4"))
PER_ROW = os.environ.get("TIMING_PER_ROW", "1") == "1"  # 0: the set-based phases only (larger N)


def _world(prefix: str):
    world = build_inbound_world(prefix, [PACK_A], account_keys=tuple(f"acct-{i}" for i in range(ACCOUNTS)))
    world.successor = serving.epoch_verify(epoch_pk=serving.epoch_prepare_from_owners(
        epoch_id=f"{prefix}epoch-2", configuration_generation_id=world.configuration.generation_id, actor=ACTOR).pk,
        actor=ACTOR)
    OrderingLane.objects.bulk_create([OrderingLane(
        epoch=world.epoch, account=account, route=WEBHOOK, route_version=1, partition=f"rec-{p}",
        contract="latest_source_position", high_water=100 + p)
        for account in world.accounts for p in range(PARTITIONS)])
    return world


# transaction=True: every phase transaction really commits (inside the default test transaction the per-gate and
# per-lane paths would pay no commit, and their xact advisory locks would pile up until the test ends).
@pytest.mark.django_db(transaction=True)
def test_timing_halt_all_and_handoff_all():
    per_row, chunked = _world("tp-") if PER_ROW else None, _world("tc-")
    seconds: dict[str, float] = {}

    def note(name: str, began: float) -> None:
        seconds[name] = time.monotonic() - began
        print(f"TIMING {name:24} {seconds[name]:8.2f} s (load {os.getloadavg()[0]:.2f})", flush=True)

    if PER_ROW:
        _per_row(per_row, note)
    _set_based(chunked, note)
    for world in (per_row, chunked) if PER_ROW else (chunked,):
        assert set(AccountServingGate.objects.filter(account__in=world.accounts).values_list("mode", flat=True)) == {
            GateMode.V2_HALTED}
        assert OrderingHandoff.objects.filter(successor_epoch=world.successor).count() == ACCOUNTS * PARTITIONS
    print(f"\nTIMING accounts={ACCOUNTS} partitions={PARTITIONS} load={os.getloadavg()[0]:.2f}")
    if PER_ROW:
        print(f"TIMING halt ratio {seconds['halt per gate'] / seconds['halt_all set-based']:.1f}x, handoff ratio "
              f"{seconds['handoff per lane'] / seconds['handoff_all set-based']:.1f}x")


def _per_row(world, note) -> None:
    began = time.monotonic()
    for account in world.accounts:
        for action in ("halt_v2", "confirm_halted"):
            gate_services.gate_transition(account_id=account.pk, action=action, expected_fence=None, actor=ACTOR,
                                          reason=succession_phases.REASON)
    note("halt per gate", began)
    barrier = held_barrier(world)
    began = time.monotonic()
    for lane_pk in OrderingLane.objects.filter(epoch=world.epoch).order_by("pk").values_list("pk", flat=True):
        succession.ordering_handoff(barrier_set_pk=barrier.pk, lane_pk=lane_pk, actor=ACTOR)
    note("handoff per lane", began)


def _set_based(world, note) -> None:
    began = time.monotonic()
    halted = succession_phases.halt_all(predecessor=world.epoch, actor=ACTOR)
    note("halt_all set-based", began)
    barrier = held_barrier(world)
    began = time.monotonic()
    handed = succession_phases.handoff_all(barrier_set=barrier, actor=ACTOR)
    note("handoff_all set-based", began)
    assert halted.complete and handed.complete and handed.total == ACCOUNTS * PARTITIONS
