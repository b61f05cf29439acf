"""Crash rows of the batched run (issue 18 goal 3; D-254..D-256), with real process kills (connector.faults): a
child process runs one `execution_claim_batch_and_run` step over two accounts and is SIGKILLed at each named point
of the two batch transactions. After the lease expires a new worker step finishes the batch; nothing committed is
lost or repeated (one ApplicationResult per command, every CRM record applied once, every lane advanced once) and
the operator's `manage.py check_invariants` passes."""
from __future__ import annotations

import time

import pytest

from connector.demo import build_world
from connector.models import ApplicationResult, CrmRecord, Execution, ExecutionAttempt, OrderingLane
from connector.services.execution import execution_claim_batch_and_run
from tests.crash.support import CLAIM_BATCH_AND_RUN_SCRIPT, DB, assert_killed, ready_execution
from tests.faults.servers import check_invariants, child_environment, run_database_env

LEASE_SECONDS = 1


def _fingerprints(ready) -> dict:
    return {r.command_id: (r.pk, bytes(r.execution_ref_digest), r.outcome, bytes(r.result_digest), bytes(r.receipt))
            for r in ApplicationResult.objects.filter(command_id__in=[e.command_id for e in ready])}


# point -> whether Runtime's batch (the CRM changes and the ApplicationResults) committed before the kill
POINTS = {
    "runtime.batch_before_commit": False,
    "runtime.batch_after_commit": True,
    "result.batch_before_commit": True,
}


@pytest.mark.django_db(**DB)
@pytest.mark.parametrize("push", [False, True], ids=["plain", "push"])
@pytest.mark.parametrize("point", list(POINTS))
def test_batch_run_killed_at_each_point_loses_and_repeats_nothing(run_child, settings, point, push):
    """A worker step over four Executions of two accounts is SIGKILLed at `point`. Before the kill the claim
    committed (Attempt 1, fence 1, the child's lease). At `runtime.batch_before_commit` nothing of Runtime's
    batch stands (no ApplicationResult, no CRM record); at `runtime.batch_after_commit` and
    `result.batch_before_commit` all four ApplicationResults and CRM changes are durable and no Execution is
    completed, no lane advanced. After lease expiry the next batch step re-claims the same four identities with
    fence 2 and completes them: the stored results are returned unchanged (no second application: CRM version
    1), exactly one ApplicationResult per command, each lane's high-water 1 with no active Execution, and
    check_invariants is clean. With a route that pushes outbound (D-293: its commands are authored in Runtime's
    batch transaction) the OutboundCommands and their RemoteEffects stand or fall with that transaction: none
    before its commit, one per command after it, and still exactly one per command after the recovery.
    Proves: CV2-07-020, CV2-08-010, CV2-08-011, CV2-08-012, CV2-07-021, CV2-02-007, CV2-06-014, CV2-10-005"""
    from effects.models import OutboundCommand, RemoteEffect

    world = build_world("kr-", push=push)
    ready = [ready_execution(account.account_key, f"rec-{n}") for account in world.accounts[:2] for n in (1, 2)]
    lanes_before = {e.pk: OrderingLane.objects.get(pk=e.lane_id).fence for e in ready}

    run = run_child(CLAIM_BATCH_AND_RUN_SCRIPT, point, n=10, lease_seconds=LEASE_SECONDS)
    assert_killed(run)
    rows = Execution.objects.filter(pk__in=[e.pk for e in ready])
    assert {(e.state, e.attempt_count, e.lease_fence, e.lease_holder) for e in rows} == {
        ("ready", 1, 1, "crash-child")}
    for e in ready:  # no lane moved: the completion never committed
        lane = OrderingLane.objects.get(pk=e.lane_id)
        assert (lane.active_execution_id, lane.high_water, lane.fence) == (e.pk, None, lanes_before[e.pk])
    committed = POINTS[point]
    original = _fingerprints(ready)
    assert len(original) == (4 if committed else 0)
    assert CrmRecord.objects.count() == (4 if committed else 0)
    assert OutboundCommand.objects.count() == (4 if committed and push else 0)

    time.sleep(LEASE_SECONDS + 0.2)
    done = execution_claim_batch_and_run(holder="recovery", n=10, lease_seconds=60)
    assert sorted(e.pk for e in done) == sorted(e.pk for e in ready)
    assert {(e.state, e.lease_fence) for e in done} == {("completed", 2)}
    after = _fingerprints(ready)
    assert len(after) == 4 and ApplicationResult.objects.count() == 4
    if committed:
        assert after == original  # the stored results, not new ones
    assert set(CrmRecord.objects.values_list("version", flat=True)) == {1} and CrmRecord.objects.count() == 4
    if push:
        assert sorted(OutboundCommand.objects.values_list("source_execution_id", flat=True)) == \
            sorted(e.pk for e in ready)
        assert RemoteEffect.objects.count() == 4
    for e in ready:
        assert list(ExecutionAttempt.objects.filter(execution=e).values_list("ordinal", "holder")) == [
            (1, "crash-child"), (2, "recovery")]
        lane = OrderingLane.objects.get(pk=e.lane_id)
        assert (lane.active_execution_id, lane.high_water) == (None, 1)
        assert bytes(Execution.objects.get(pk=e.pk).result_digest) == after[e.command_id][3]
    report = check_invariants(child_environment(secret_dir=settings.CONNECTOR["SECRET_BACKEND_DIR"],
                                                **run_database_env()))
    assert report["ok"], report
