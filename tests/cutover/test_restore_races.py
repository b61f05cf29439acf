"""Races on the V1 side, with real concurrent transactions (threads with their own connections)."""
from __future__ import annotations

import os

from config.routers import JOURNAL_DB
from connector.choices import GateMode
from connector.errors import ConnectorError
from cutover.models import ServiceCutoverAttempt, V1RestorePoint
from cutover.services.restore import cutover_begin_validation, cutover_cold_abort
from cutover.services.restore_point import restore_point_capture, restore_point_rehearse
from tests.concurrency import run_concurrently
from tests.cutover.restore_fixtures import TX, restore_env  # noqa: F401
from tests.cutover.approval_helpers import approve
from tests.cutover.restore_helpers import ACTOR, drained_world
from v1.models import GenerationState, V1ProcessGeneration


@TX
def test_two_concurrent_captures_record_one_restore_point_and_keep_one_dump():
    """Proves: CV2-12-050, CV2-12-093 (one restore point per attempt: the losing capture returns the winner's
    receipt and removes its own dump)."""
    world = drained_world("cc-")
    a, b = run_concurrently([lambda: restore_point_capture(attempt_key=world.key, actor="op-1"),
                            lambda: restore_point_capture(attempt_key=world.key, actor="op-2")],
                           expect=ConnectorError)
    assert isinstance(a, V1RestorePoint) and isinstance(b, V1RestorePoint) and a.pk == b.pk
    assert V1RestorePoint.objects.using(JOURNAL_DB).count() == 1
    assert os.listdir(os.path.dirname(a.dump_path)) == [os.path.basename(a.dump_path)]


@TX
def test_cold_abort_racing_begin_validation_lets_exactly_one_move_the_gates():
    """Proves: CV2-12-072, CV2-12-082 (the gate locks serialize them: either V1 serves again with a new generation
    and validation is refused, or validation began and the cold abort is refused; never a mix of gate modes)."""
    world = drained_world("cr-")
    restore_point_capture(attempt_key=world.key, actor="op")
    restore_point_rehearse(attempt_key=world.key, actor="op")
    approve("restore_point", world.key)
    abort, validate = run_concurrently([lambda: cutover_cold_abort(attempt_key=world.key, actor=ACTOR),
                                        lambda: cutover_begin_validation(attempt_key=world.key, actor=ACTOR)],
                                       expect=ConnectorError)
    aborted = isinstance(abort, str)
    validated = isinstance(validate, list)
    assert aborted != validated, (abort, validate)
    running = V1ProcessGeneration.objects.filter(state=GenerationState.RUNNING).count()
    outcome = ServiceCutoverAttempt.objects.get(attempt_key=world.key).outcome
    if aborted:
        assert world.modes() == {GateMode.V1_SERVING} and running == 1 and outcome == "cold_aborted"
    else:
        assert world.modes() == {GateMode.V2_VALIDATING} and running == 0 and outcome == "open"
