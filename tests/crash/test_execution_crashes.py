"""Crash rows of the execution path, with real process kills (connector.faults):

- "Execution claimed before Runtime accepts the command" -> lease expiry retries the same Execution identity.
- "Runtime commits application behavior before its response arrives" -> repeating the command returns the same
  ApplicationResult.
- "Connector receives the result before local completion commits" -> the stored Runtime result receipt closes
  the same Execution without re-execution.
"""
from __future__ import annotations

import time

import pytest

from connector.demo import build_world
from connector.models import ApplicationResult, CrmRecord, Execution, ExecutionAttempt, OrderingLane
from connector.services.execution import (
    execution_claim,
    execution_claim_batch,
    execution_claim_batch_and_run,
    execution_record_result,
    execution_run,
)
from tests.crash.support import (
    CLAIM_AND_RUN_SCRIPT,
    CLAIM_BATCH_AND_RUN_PER_ITEM_SCRIPT,
    CLAIM_BATCH_SCRIPT,
    CLAIM_SCRIPT,
    DB,
    assert_killed,
    ready_execution,
)

LEASE_SECONDS = 1


def _wait_for_lease_expiry() -> None:
    time.sleep(LEASE_SECONDS + 0.2)


def _result_fingerprint(command_id: str) -> tuple:
    r = ApplicationResult.objects.get(command_id=command_id)
    return r.pk, bytes(r.execution_ref_digest), r.outcome, bytes(r.result_digest), bytes(r.receipt)


@pytest.mark.django_db(**DB)
def test_claimed_before_runtime_accepts_retries_same_execution(run_child):
    """Crash row "Execution claimed before Runtime accepts the command": the claimant is SIGKILLed right after
    its claim committed, before calling Runtime. The claim (Attempt 1, lease) is durable and Runtime was never
    called. After the lease expires a new claim takes the same Execution identity (same pk, command ID and
    ExecutionRef) as Attempt 2 with a higher fence; running it yields exactly one ApplicationResult and
    completes that Execution. Proves: CV2-07-020, CV2-07-017, CV2-07-021, CV2-07-016"""
    world = build_world("k-")
    account = world.accounts[0]
    execution = ready_execution(account.account_key)

    run = run_child(CLAIM_SCRIPT, "claim.after_commit", account_id=account.pk, lease_seconds=LEASE_SECONDS)
    assert_killed(run)
    claimed = Execution.objects.get(pk=execution.pk)
    assert (claimed.state, claimed.attempt_count, claimed.lease_holder) == ("ready", 1, "crash-child")
    assert claimed.lease_expires_at is not None
    assert not ApplicationResult.objects.filter(command_id=execution.command_id).exists()
    assert not CrmRecord.objects.filter(account=account).exists()

    assert execution_claim(holder="recovery", account_id=account.pk) is None  # the lease is still held
    _wait_for_lease_expiry()
    token = execution_claim(holder="recovery", lease_seconds=60, account_id=account.pk)
    assert token is not None and token.execution_pk == execution.pk
    reclaimed = Execution.objects.get(pk=execution.pk)
    assert reclaimed.command_id == execution.command_id
    assert bytes(reclaimed.execution_ref_digest) == bytes(execution.execution_ref_digest)
    assert reclaimed.attempt_count == 2 and token.lease_fence == claimed.lease_fence + 1
    attempts = list(ExecutionAttempt.objects.filter(execution=execution).values_list("ordinal", "holder"))
    assert attempts == [(1, "crash-child"), (2, "recovery")]
    assert Execution.objects.filter(projection=execution.projection).count() == 1  # no second identity

    done = execution_run(token=token)
    assert done.pk == execution.pk and done.state == "completed"
    assert ApplicationResult.objects.filter(command_id=execution.command_id).count() == 1
    assert CrmRecord.objects.get(account=account, record_key="rec-1").version == 1


@pytest.mark.django_db(**DB)
def test_runtime_committed_before_response_returns_same_result(run_child):
    """Crash row "Runtime commits application behavior before its response arrives": the claimant is
    SIGKILLed after Runtime committed the CRM change and the ApplicationResult, before the connector recorded
    it. The Execution is still ready. Re-running the same Execution after lease expiry returns the same
    ApplicationResult (one row, same digests), applies nothing again (CrmRecord version unchanged) and
    completes the Execution from that result. Proves: CV2-08-010, CV2-08-012, CV2-08-005, CV2-07-014"""
    world = build_world("k-")
    account = world.accounts[0]
    execution = ready_execution(account.account_key)

    run = run_child(CLAIM_AND_RUN_SCRIPT, "runtime.after_commit", account_id=account.pk,
                    lease_seconds=LEASE_SECONDS)
    assert_killed(run)
    assert Execution.objects.get(pk=execution.pk).state == "ready"
    original = _result_fingerprint(execution.command_id)
    record = CrmRecord.objects.get(account=account, record_key="rec-1")
    assert (record.version, record.last_command_id) == (1, execution.command_id)

    _wait_for_lease_expiry()
    token = execution_claim(holder="recovery", account_id=account.pk)
    assert token is not None and token.execution_pk == execution.pk
    done = execution_run(token=token)
    assert done.state == "completed"
    assert ApplicationResult.objects.filter(command_id=execution.command_id).count() == 1
    assert _result_fingerprint(execution.command_id) == original
    assert bytes(done.result_digest) == original[3] and bytes(done.runtime_receipt) == original[4]
    record.refresh_from_db()
    assert record.version == 1
    lane = OrderingLane.objects.get(pk=execution.lane_id)
    assert lane.active_execution_id is None and lane.high_water == 1


@pytest.mark.django_db(**DB)
def test_result_received_before_local_completion_closes_from_stored_receipt(run_child):
    """Crash row "Connector receives the result before local completion commits": the claimant is SIGKILLed
    inside the transaction recording the Runtime result. That transaction rolls back: the Execution is still
    ready with the lane's active Execution unchanged, and Runtime's ApplicationResult stands. Recording the
    stored Runtime result receipt closes the same Execution and advances the lane high-water without a second
    Runtime application. Proves: CV2-08-011, CV2-08-008, CV2-07-015, CV2-06-014"""
    world = build_world("k-")
    account = world.accounts[0]
    execution = ready_execution(account.account_key)
    lane_before = OrderingLane.objects.get(pk=execution.lane_id)

    run = run_child(CLAIM_AND_RUN_SCRIPT, "result.before_commit", account_id=account.pk, lease_seconds=60)
    assert_killed(run)
    assert Execution.objects.get(pk=execution.pk).state == "ready"
    lane = OrderingLane.objects.get(pk=execution.lane_id)
    assert (lane.active_execution_id, lane.high_water, lane.fence) == (execution.pk, None, lane_before.fence)
    original = _result_fingerprint(execution.command_id)

    # no lease wait: closing from the stored receipt is not a re-execution and needs no claim
    done = execution_record_result(execution_pk=execution.pk, command_id=execution.command_id,
                                   execution_ref_digest=original[1])
    assert done.pk == execution.pk and done.state == "completed"
    assert bytes(done.result_digest) == original[3] and bytes(done.runtime_receipt) == original[4]
    assert ApplicationResult.objects.filter(command_id=execution.command_id).count() == 1
    assert _result_fingerprint(execution.command_id) == original
    assert CrmRecord.objects.get(account=account, record_key="rec-1").version == 1
    lane.refresh_from_db()
    assert lane.active_execution_id is None and lane.high_water == 1
    # recording again is idempotent
    again = execution_record_result(execution_pk=execution.pk, command_id=execution.command_id,
                                    execution_ref_digest=original[1])
    assert again.state == "completed" and ApplicationResult.objects.count() == 1


def _batch_world():
    """Two accounts with two ready Executions each (each record its own lane)."""
    world = build_world("kb-")
    ready = [ready_execution(account.account_key, f"rec-{n}") for account in world.accounts[:2] for n in (1, 2)]
    return world, ready


@pytest.mark.django_db(**DB)
def test_batch_claimed_before_runtime_accepts_retries_each_execution(run_child):
    """Crash row "Execution claimed before Runtime accepts the command", for a batched claim (D-204): the
    claimant is SIGKILLed right after the batch's one transaction committed (`claim.after_commit`). All four
    leases and Attempts are durable, Runtime was never called; while the leases live nobody claims them; after
    expiry one batch re-claims the same four Execution identities as Attempt 2 with fence + 1, and running them
    yields exactly one ApplicationResult per command. Proves: CV2-07-020, CV2-07-017, CV2-07-021, CV2-07-016"""
    _, ready = _batch_world()
    run = run_child(CLAIM_BATCH_SCRIPT, "claim.after_commit", n=10, lease_seconds=LEASE_SECONDS)
    assert_killed(run)
    rows = Execution.objects.filter(pk__in=[e.pk for e in ready])
    assert {(e.state, e.attempt_count, e.lease_fence, e.lease_holder) for e in rows} == {
        ("ready", 1, 1, "crash-child")}
    assert ExecutionAttempt.objects.count() == 4 and not ApplicationResult.objects.exists()

    assert execution_claim_batch(holder="recovery", n=10) == []  # the leases still hold
    _wait_for_lease_expiry()
    tokens = execution_claim_batch(holder="recovery", n=10, lease_seconds=60)
    assert sorted(t.execution_pk for t in tokens) == sorted(e.pk for e in ready)
    assert {t.lease_fence for t in tokens} == {2}
    for token in tokens:
        assert execution_run(token=token).state == "completed"
    for e in ready:
        assert ApplicationResult.objects.filter(command_id=e.command_id).count() == 1
        assert list(ExecutionAttempt.objects.filter(execution=e).values_list("ordinal", "holder")) == [
            (1, "crash-child"), (2, "recovery")]
    assert Execution.objects.filter(projection__in=[e.projection_id for e in ready]).count() == 4


@pytest.mark.django_db(**DB)
def test_batch_run_crash_loses_only_uncommitted_work(run_child):
    """A batch worker step running each Execution through the per-item step (`_run_one`, as the batch path runs
    what the batch leaves and a traced step; the batch run's own crash points are in test_batch_run_crashes.py) is SIGKILLed after Runtime committed the first Execution's ApplicationResult
    (`runtime.after_commit`), before the result was recorded and before the batch's other three ran. Nothing
    committed is lost or repeated: after lease expiry the next batch step re-claims all four with a new fence,
    the first completes from Runtime's same stored ApplicationResult (applied once), the other three run once.
    Proves: CV2-07-020, CV2-08-010, CV2-08-012, CV2-07-021, CV2-02-007"""
    _, ready = _batch_world()
    run = run_child(CLAIM_BATCH_AND_RUN_PER_ITEM_SCRIPT, "runtime.after_commit", n=10,
                    lease_seconds=LEASE_SECONDS)
    assert_killed(run)
    assert set(Execution.objects.filter(pk__in=[e.pk for e in ready]).values_list("state", flat=True)) == {"ready"}
    applied = [e for e in ready if ApplicationResult.objects.filter(command_id=e.command_id).exists()]
    assert len(applied) == 1
    original = _result_fingerprint(applied[0].command_id)

    _wait_for_lease_expiry()
    done = execution_claim_batch_and_run(holder="recovery", n=10, lease_seconds=60)
    assert sorted(e.pk for e in done) == sorted(e.pk for e in ready)
    assert {e.state for e in done} == {"completed"} and {e.lease_fence for e in done} == {2}
    assert _result_fingerprint(applied[0].command_id) == original
    for e in ready:
        assert ApplicationResult.objects.filter(command_id=e.command_id).count() == 1
    assert set(CrmRecord.objects.values_list("version", flat=True)) == {1}
