"""Shared fixtures of the restore tests (imported by each module: no tests/cutover/conftest.py to collide with
other engineers' fixtures)."""
from __future__ import annotations

import pytest
from django.db import connections

from cutover.ports import v1_owner
from cutover.services.restore import cutover_begin_validation
from cutover.services.restore_point import restore_point_capture, restore_point_rehearse
from tests.cutover.approval_helpers import approve
from tests.cutover.restore_helpers import ACTOR, drained_world, start_provider

TX = pytest.mark.django_db(databases=["default", "journal"], transaction=True)


@pytest.fixture(autouse=True)
def restore_env(settings, tmp_path):
    """The real V1 (settings.CUTOVER_V1_OWNER = v1.owner.V1Owner) against a loopback provider; dumps in tmp."""
    v1_owner.cache_clear()
    settings.CUTOVER_RESTORE_POINT_DIR = str(tmp_path / "restore-points")
    receiver = start_provider(settings)
    yield receiver
    receiver.stop()
    connections.close_all()  # a restore terminated the sessions of `default`; teardown reconnects


def validating_world(prefix: str = "v-"):
    """Drained, restore point captured and rehearsed, validation begun (gates v2_validating, decision open)."""
    world = drained_world(prefix)
    world.point = restore_point_capture(attempt_key=world.key, actor="op")
    restore_point_rehearse(attempt_key=world.key, actor="op")
    approve("restore_point", world.key)
    cutover_begin_validation(attempt_key=world.key, actor=ACTOR)
    return world
