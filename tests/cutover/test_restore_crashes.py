"""The full restore under crashes: a REAL child process running `restore_run` is SIGKILLed at each named
boundary (connector.faults); both protocols stay offline (no running V1 generation, no gate serving, the decision
still restoring_v1) and a second `restore_run` resumes the SAME RestoreAttempt to completion. Also the
activation-versus-restore race from the restore side (two threads, separate connections)."""
from __future__ import annotations

import time

import pytest
from django.db import connections

from config.routers import JOURNAL_DB
from connector.choices import GateMode
from connector.errors import FenceStale, TransitionRefused
from cutover.choices import DecisionState, RestoreAttemptState
from cutover.errors import RestoreRefused
from cutover.models import RestoreAttempt
from cutover.services.decision import decision_choose_activation, decision_read
from cutover.services.restore import restore_run
from tests.concurrency import run_concurrently
from tests.crash.conftest import child_env, run_child  # noqa: F401 (fixtures)
from tests.cutover.restore_fixtures import TX, restore_env, validating_world  # noqa: F401
from tests.cutover.restore_helpers import ACTOR
from tests.cutover.test_restore import v1_state
from v1.models import GenerationState, V1HighWater, V1ProcessGeneration

RESTORE = """
from connector.actors import Actor
from cutover.services.restore import restore_run
row = restore_run(attempt_key=ARGS["attempt"], actor=Actor.system("restore-child"))
emit(state=row.state)
"""

# fault point -> (RestoreAttempt state left, gate modes left, default already restored)
BOUNDARIES = {
    "restore.after_restoring_v1": (RestoreAttemptState.STARTED, GateMode.V2_VALIDATING, False),
    "restore.after_pg_restore": (RestoreAttemptState.STARTED, GateMode.V1_DRAINED, True),
    "restore.after_recovery_receipt": (RestoreAttemptState.RECEIPT_RECORDED, GateMode.V1_DRAINED, True),
}


@TX
@pytest.mark.parametrize("fault", sorted(BOUNDARIES))
def test_a_crash_at_each_restore_boundary_stays_offline_and_resumes_the_same_attempt(fault, run_child):
    """Proves: CV2-12-075, CV2-12-083, CV2-12-084 (a killed restore leaves V1 and V2 offline, the decision
    restoring_v1, and `restore_run` resumes the same RestoreAttempt; the result equals an uninterrupted restore)."""
    world = validating_world()
    captured = v1_state()
    V1HighWater.objects.update(high_water=999)
    connections.close_all()
    run = run_child(RESTORE, fault, attempt=world.key)
    assert run.killed, f"child not killed at {fault} (rc {run.returncode}):\n{run.stdout}\n{run.stderr}"
    connections.close_all()  # the child terminated this process's sessions of `default` when it restored
    state, modes, restored = BOUNDARIES[fault]
    row = RestoreAttempt.objects.using(JOURNAL_DB).get(attempt_key=world.key)
    assert row.state == state
    assert decision_read(world.key).state == DecisionState.RESTORING_V1
    assert world.modes() == {modes}
    assert not V1ProcessGeneration.objects.filter(state=GenerationState.RUNNING).exists()
    assert (v1_state() == captured) is restored
    resumed = restore_run(attempt_key=world.key, actor=ACTOR)
    connections.close_all()
    assert resumed.pk == row.pk and resumed.state == RestoreAttemptState.V1_SERVING
    assert RestoreAttempt.objects.using(JOURNAL_DB).count() == 1
    assert decision_read(world.key).state == DecisionState.V1_RESTORED
    assert world.modes() == {GateMode.V1_SERVING}
    assert v1_state() == captured
    assert V1ProcessGeneration.objects.filter(state=GenerationState.RUNNING).count() == 1


@TX
@pytest.mark.parametrize("activation_delay", [0.0, 1.5], ids=["together", "restore-ahead"])
def test_activation_and_restore_racing_pick_exactly_one_branch(activation_delay):
    """Proves: CV2-12-095, CV2-12-097 (from the restore side: a restore and an activation decision started
    together on separate connections; exactly one wins; the loser changes nothing)."""
    world = validating_world()
    # The test's own sessions (the suite connects as the administrator) are no product session the restore may
    # terminate: the owner role that restores cannot end a superuser's backend.
    connections.close_all()
    activation, restore = run_concurrently(
        [lambda: (time.sleep(activation_delay), decision_choose_activation(world.key).state)[1],
         lambda: restore_run(attempt_key=world.key, actor=ACTOR).state],
        expect=(TransitionRefused, FenceStale, RestoreRefused))
    results: dict[str, object] = {"activation": activation, "restore": restore}
    connections.close_all()
    activation_won = results["activation"] == DecisionState.ACTIVATING_V2
    restore_won = results["restore"] == RestoreAttemptState.V1_SERVING
    assert activation_won != restore_won, results
    if activation_delay:
        assert restore_won, "the restore took the decision first and the late activation must lose"
    final = decision_read(world.key).state
    if activation_won:
        assert isinstance(results["restore"], RestoreRefused)
        assert final == DecisionState.ACTIVATING_V2
        assert not RestoreAttempt.objects.using(JOURNAL_DB).exists()
        assert world.modes() == {GateMode.V2_VALIDATING}
    else:
        assert isinstance(results["activation"], (TransitionRefused, FenceStale))
        assert final == DecisionState.V1_RESTORED
        assert world.modes() == {GateMode.V1_SERVING}
