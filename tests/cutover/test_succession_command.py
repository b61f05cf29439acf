"""`manage.py succession`: every phase in order, each idempotent on rerun, a refused lane resumed after drain."""
from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from connector.choices import EpochState, GateMode
from connector.models import ServingEpoch
from connector.services import execution
from cutover.models import OrderingHandoff, ServingPublicationBarrierSet
from tests.connector.inbound_helpers import advance_lanes, drain
from tests.cutover.succession_helpers import build_succession_world, gate_modes, send


def run(*args) -> str:
    out = StringIO()
    call_command("succession", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_command_runs_every_phase_idempotently_and_resumes_after_a_refusal():
    """status -> barriers -> halt refused (not drained) -> drain (refused while an execution is nonterminal, every
    gate still v2_serving; resumed after it completes under v2_serving) -> halt -> handoffs -> activate (with
    readback and release); every phase rerun changes nothing more.
    Proves: CV2-11-023, CV2-11-025, CV2-11-005"""
    world = build_succession_world("sc-")
    send(world, "evt-5", 5, record="rec-2")
    drain()
    send(world, "evt-100", 100)
    advance_lanes()
    token = execution.execution_claim(holder="w1")
    pred, succ = world.epoch.epoch_id, world.successor.epoch_id
    assert "next phase  barriers" in run("status", "--predecessor", pred)
    for _ in range(2):
        assert "held" in run("barriers", "--predecessor", pred, "--successor", succ)
    assert ServingPublicationBarrierSet.objects.count() == 1
    with pytest.raises(CommandError, match="SUCCESSION_NOT_DRAINED"):
        run("halt", "--predecessor", pred)
    assert "next phase  drain" in run("status", "--predecessor", pred)
    with pytest.raises(CommandError, match="continuation work still open.*1 nonterminal executions"):
        run("drain", "--predecessor", pred)
    with pytest.raises(CommandError, match="held by"):
        run("drain", "--predecessor", pred, "--holder", "stale-coordinator")
    assert gate_modes(world) == {GateMode.V2_SERVING}
    assert "drain       draining" in run("status", "--predecessor", pred)
    execution.execution_run(token=token)  # the claimed continuation completes under v2_serving
    for _ in range(2):
        assert "drained under v2_serving" in run("drain", "--predecessor", pred)
    assert "next phase  halt" in run("status", "--predecessor", pred)
    for _ in range(2):
        assert "2 gates v2_halted" in run("halt", "--predecessor", pred)
    assert "next phase  handoffs" in run("status", "--predecessor", pred)
    out = run("handoffs", "--predecessor", pred)
    assert "frozen at high-water 100" in out
    assert "already handed off" in run("handoffs", "--predecessor", pred)
    assert OrderingHandoff.objects.count() == 2
    assert "next phase  activate" in run("status", "--predecessor", pred)
    assert "released" in run("activate", "--predecessor", pred)
    assert ServingEpoch.objects.get(epoch_id=succ).state == EpochState.ACTIVE
    assert ServingEpoch.objects.get(epoch_id=pred).state == EpochState.DRAINING
    assert gate_modes(world) == {GateMode.V2_SERVING}
    assert "next phase  retire" in run("status", "--predecessor", pred, "--successor", succ)
    with pytest.raises(CommandError, match="no open barrier set"):
        run("activate", "--predecessor", pred)
    assert f"epoch {pred} retired" in run("retire", "--predecessor", pred, "--reason", "facts terminal")
    assert ServingEpoch.objects.get(epoch_id=pred).state == EpochState.RETIRED
    assert "next phase  done" in run("status", "--predecessor", pred, "--successor", succ)
    with pytest.raises(CommandError, match="TRANSITION_REFUSED"):
        run("retire", "--predecessor", pred, "--reason", "again")


@pytest.mark.django_db
def test_command_refuses_other_successor_classes():
    """`--class online_compatible` is refused and writes nothing. Proves: CV2-11-058"""
    world = build_succession_world("sd-")
    with pytest.raises(CommandError, match="SUCCESSOR_CLASS_UNSUPPORTED"):
        run("barriers", "--predecessor", world.epoch.epoch_id, "--successor", world.successor.epoch_id,
            "--class", "online_compatible")
    assert not ServingPublicationBarrierSet.objects.exists()
