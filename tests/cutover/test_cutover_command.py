"""`manage.py cutover`: every phase from the command line, idempotent reruns, status with blockers and the next
action, and stable refusals."""
from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from connector.choices import GateMode
from cutover.models import AttemptOutcome, ServiceCutoverAttempt
from tests.cutover.approval_helpers import approve
from tests.cutover.v1_world import approve_activation, build_v1_world
from v1 import runtime


pytestmark = pytest.mark.usefixtures("cutover_env")  # tests/cutover/conftest.py


def run(*args) -> str:
    out = io.StringIO()
    call_command("cutover", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(databases=["default", "journal"], transaction=True)
def test_the_whole_cutover_from_the_command_line():
    """Each phase is one subcommand; reruns change nothing; status names blockers and the next action; a phase run
    out of order is refused with its stable code."""
    world = build_v1_world("cmd-")
    world.accept(0, "k1", 1)
    run("open", "--attempt", "a1", "--configuration", world.configuration.generation_id, "--epoch",
        world.epoch.epoch_id)
    with pytest.raises(CommandError, match="CUTOVER_PHASE_REFUSED"):
        run("stop", "--attempt", "a1")
    run("certify", "--attempt", "a1")
    with pytest.raises(CommandError, match="APPROVAL_MISSING"):
        run("close", "--attempt", "a1")
    approve("readiness_certificate", "a1")
    run("close", "--attempt", "a1")
    status = run("status", "--attempt", "a1")
    assert "BLOCKED: inbound_nonterminal" in status and "next: cutover stop --attempt a1" in status
    with pytest.raises(CommandError, match="DRAIN_BLOCKED"):
        run("stop", "--attempt", "a1")
    runtime.drain(world.generation_id)
    for action in ("stop", "export", "certify-drained", "certify-drained", "capture", "rehearse"):
        run(action, "--attempt", "a1")
    with pytest.raises(CommandError, match="APPROVAL_MISSING"):
        run("begin-validation", "--attempt", "a1")
    approve("restore_point", "a1")
    for action in ("begin-validation", "hold"):
        run(action, "--attempt", "a1")
    assert world.modes() == {GateMode.V2_VALIDATING}
    with pytest.raises(CommandError, match="APPROVAL_MISSING"):
        run("activate", "--attempt", "a1")
    approve_activation(world.epoch.epoch_id)
    output = run("activate", "--attempt", "a1")
    assert "[##############################] 8/8 phases" in output, output
    assert world.modes() == {GateMode.V2_SERVING}
    assert ServiceCutoverAttempt.objects.get().outcome == AttemptOutcome.V2_COMMITTED
