"""`manage.py restore_point`: each step calls its service; refusals exit with the error code."""
from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

from connector.choices import GateMode
from tests.cutover.restore_fixtures import TX, restore_env  # noqa: F401
from tests.cutover.approval_helpers import approve
from tests.cutover.restore_helpers import drained_world


def run(*args) -> str:
    out = StringIO()
    call_command("restore_point", *args, stdout=out)
    return out.getvalue()


@TX
def test_the_command_walks_capture_rehearse_validate_restore_and_status_names_each_next_step():
    """Proves: CV2-12-050, CV2-12-052, CV2-12-073 (the operator path end to end through the services)."""
    world = drained_world("cmd-")
    assert "next: capture" in run("status", world.key)
    with pytest.raises(CommandError, match="RESTORE_POINT_INVALID"):
        run("begin-validation", world.key)
    assert "dump" in run("capture", world.key)
    assert "next: rehearse" in run("status", world.key)
    assert "passed" in run("rehearse", world.key)
    assert "next: begin-validation" in run("status", world.key)
    approve("restore_point", world.key)
    assert "v2_validating" in run("begin-validation", world.key)
    with pytest.raises(CommandError, match="COLD_ABORT_REFUSED"):
        run("cold-abort", world.key)
    assert "v1_serving" in run("restore", world.key)
    connections.close_all()
    assert world.modes() == {GateMode.V1_SERVING}
    assert "next: done" in run("status", world.key)
