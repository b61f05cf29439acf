"""Batched fair claims (issue 18, goals 3 and 8; decisions D-204, D-205): one transaction claims up to n ready
Executions across accounts, round-robin, with fenced leases; on real PostgreSQL with concurrent claimers on their
own connections."""
from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from connector.choices import GateMode
from connector.errors import FenceStale
from connector.models import AccountServingGate, ApplicationResult, Execution, ExecutionAttempt
from connector.services import claims, execution, gates, runtime
from tests.concurrency import start
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import ACTOR, advance_lanes, build_inbound_world, deliver, webhook_body, \
    webhook_event
from tests.support import scaled


def later(seconds: int):
    return mock.patch("django.utils.timezone.now", return_value=timezone.now() + timedelta(seconds=seconds))


@pytest.fixture(autouse=True)
def _fresh_rotation():
    """Each test starts the process's rotation cursors at the lowest account."""
    claims._ROTATION.update(start=0)


def _ready(world, account, count: int, tag: str) -> list[Execution]:
    """`count` ready Executions of `account`, one per record (each record is its own lane)."""
    deliver(world, "records.webhook", webhook_body(*(webhook_event(f"{tag}-evt-{i}", f"{tag}-rec-{i}", 1)
                                                     for i in range(count))), account=account)
    return advance_lanes()


@pytest.fixture
def three_accounts(transactional_db):
    return build_inbound_world("cb-", [PACK_A], account_keys=("acct-1", "acct-2", "acct-3"))


def test_batch_claims_every_account_while_one_holds_ten_times_the_backlog(three_accounts):
    """Fairness: the hot account holds 10x the other accounts' ready Executions and its backlog is the oldest
    (lowest pks, first in FIFO order), yet one batch of 6 takes two from every account, round-robin, and
    successive batches keep rotating until each quiet account is drained before the hot one.
    Proves: CV2-14-003 (starvation bound per operation class), CV2-14-008, CV2-07-016"""
    hot, quiet_a, quiet_b = three_accounts.accounts
    _ready(three_accounts, hot, 20, "hot")
    _ready(three_accounts, quiet_a, 2, "qa")
    _ready(three_accounts, quiet_b, 2, "qb")
    tokens = execution.execution_claim_batch(holder="w1", n=6, lease_seconds=60)
    claimed = Execution.objects.in_bulk([t.execution_pk for t in tokens])
    per_account = Counter(claimed[t.execution_pk].account_id for t in tokens)
    assert per_account == {hot.pk: 2, quiet_a.pk: 2, quiet_b.pk: 2}
    order = [claimed[t.execution_pk].account_id for t in tokens]
    # ranks interleaved in one statement: every account's first, then every account's second
    assert order[:3] == sorted([hot.pk, quiet_a.pk, quiet_b.pk])
    # The next batch has only the hot account's work left: it takes it (no account is starved, none idles).
    second = execution.execution_claim_batch(holder="w1", n=6, lease_seconds=60)
    assert {Execution.objects.get(pk=t.execution_pk).account_id for t in second} == {hot.pk}
    assert len(second) == 6


def test_rotation_moves_the_first_pick_across_batches(three_accounts):
    """Batches of one rotate over the accounts (a hot account with the oldest work does not win every batch).
    Proves: CV2-14-003, CV2-14-008"""
    accounts = three_accounts.accounts
    for account, tag in zip(accounts, ("r1", "r2", "r3")):
        _ready(three_accounts, account, 3 if tag != "r1" else 10, tag)
    picks = [Execution.objects.get(pk=execution.execution_claim_batch(holder="w", n=1)[0].execution_pk).account_id
             for _ in range(6)]
    assert picks == [a.pk for a in accounts] * 2


def test_two_concurrent_batch_claimers_never_claim_the_same_execution(three_accounts):
    """Two claimers, each on its own connection, claim batches at the same moment until nothing is left: every
    ready Execution is claimed exactly once, with exactly one Attempt (ordinal 1) whose fence is the
    Execution's, no error, no deadlock. Proves: CV2-07-016, CV2-07-018, CV2-15-024"""
    for account, tag in zip(three_accounts.accounts, ("c1", "c2", "c3")):
        _ready(three_accounts, account, 12, tag)
    ready = set(Execution.objects.filter(state="ready").values_list("pk", flat=True))
    assert len(ready) == 36
    barrier = threading.Barrier(2)

    def claimer(name):
        def run():
            barrier.wait(scaled(10))
            got = []
            while batch := execution.execution_claim_batch(holder=name, n=5, lease_seconds=60):
                got += [t.execution_pk for t in batch]
            return got
        return run

    workers = [start(claimer(f"claimer-{i}"), f"claimer-{i}") for i in range(2)]
    for w in workers:
        w.join(scaled(60))
    assert [w.error for w in workers] == [None, None]
    claimed = workers[0].result + workers[1].result
    assert sorted(claimed) == sorted(ready)  # each exactly once
    # Which claimer gets how many depends on the scheduler (on a loaded machine one may take every batch before
    # the other starts); the property is that the union is exact, whatever the interleaving.
    assert ExecutionAttempt.objects.count() == 36
    rows = Execution.objects.filter(pk__in=ready)
    assert {(e.attempt_count, e.lease_fence) for e in rows} == {(1, 1)}
    assert {e.lease_holder for e in rows} <= {"claimer-0", "claimer-1"}
    assert sorted(ExecutionAttempt.objects.values_list("execution_id", flat=True)) == sorted(ready)


def test_a_stale_lease_fence_cannot_complete(three_accounts):
    """Claimant A's lease expires and B re-claims the same Execution with fence + 1. A's late run is refused
    before Runtime (FENCE_STALE, nothing written); A's completion after Runtime (the run raced past the first
    check) is refused under the row lock; B completes it with the one ApplicationResult.
    Proves: CV2-07-018, CV2-07-017, CV2-07-021, CV2-07-016"""
    minted, = _ready(three_accounts, three_accounts.accounts[0], 1, "sf")
    first, = execution.execution_claim_batch(holder="worker-a", n=4, lease_seconds=1)
    assert execution.execution_claim_batch(holder="worker-b", n=4) == []  # the lease is live
    with later(5):
        second, = execution.execution_claim_batch(holder="worker-b", n=4, lease_seconds=60)
    assert (second.execution_pk, second.lease_fence) == (first.execution_pk, first.lease_fence + 1)
    with pytest.raises(FenceStale):
        execution.execution_run(token=first)
    assert not ApplicationResult.objects.filter(command_id=minted.command_id).exists()
    # A got past the first check before B's claim: Runtime applied (idempotent), the completion CAS refuses A.
    row = Execution.objects.select_related("projection").get(pk=minted.pk)
    receipt = runtime.runtime_command_apply(command_id=row.command_id, execution_ref=bytes(row.execution_ref),
                                            input=bytes(row.projection.input), account_id=row.account_id,
                                            execution_id=row.pk)
    with pytest.raises(FenceStale):
        execution.execution_record_result(execution_pk=row.pk, command_id=receipt.command_id,
                                          execution_ref_digest=receipt.execution_ref_digest,
                                          lease_fence=first.lease_fence)
    assert Execution.objects.get(pk=minted.pk).state == "ready"
    done = execution.execution_run(token=second)
    assert done.state == "completed"
    assert ApplicationResult.objects.filter(command_id=minted.command_id).count() == 1


def test_a_batch_skips_an_account_whose_gate_does_not_serve(three_accounts):
    """The guard runs per account in the batch: an account whose gate left v2_serving contributes nothing (no
    Attempt, no lease) while the other accounts are claimed in the same transaction.
    Proves: CV2-03-015, CV2-03-016, CV2-07-016"""
    halted, other, _ = three_accounts.accounts
    _ready(three_accounts, halted, 2, "h")
    _ready(three_accounts, other, 2, "o")
    gate = AccountServingGate.objects.get(account=halted)
    moved = gates.gate_transition(account_id=halted.pk, action="halt_v2", actor=ACTOR, expected_fence=gate.fence,
                                  reason="test halt")
    assert moved.mode == GateMode.HALTING_V2
    tokens = execution.execution_claim_batch(holder="w", n=10)
    assert {Execution.objects.get(pk=t.execution_pk).account_id for t in tokens} == {other.pk}
    assert not ExecutionAttempt.objects.filter(execution__account=halted).exists()


def test_batch_worker_step_runs_each_claimed_execution(three_accounts):
    """`execution_claim_batch_and_run` claims one batch across accounts and runs each Execution to completion
    with exactly one ApplicationResult each. Proves: CV2-07-022, CV2-08-005"""
    for account, tag in zip(three_accounts.accounts, ("w1", "w2", "w3")):
        _ready(three_accounts, account, 2, tag)
    done = execution.execution_claim_batch_and_run(holder="w", n=10)
    assert len(done) == 6 and {e.state for e in done} == {"completed"}
    assert ApplicationResult.objects.count() == 6
    assert execution.execution_claim_batch_and_run(holder="w", n=10) == []


def test_a_claimer_given_its_group_claims_only_its_group(three_accounts):
    """A claimer given its account group (`account_ids`) claims from those accounts only: another account's ready
    work stays unclaimed (another claimer's). Proves: CV2-07-016"""
    first, second, third = three_accounts.accounts
    for account, tag in ((first, "g1"), (second, "g2"), (third, "g3")):
        _ready(three_accounts, account, 3, tag)
    tokens = execution.execution_claim_batch(holder="w", n=10, account_ids=[second.pk, third.pk])
    assert len(tokens) == 6 and {t.account_id for t in tokens} == {second.pk, third.pk}
    assert {Execution.objects.get(pk=t.execution_pk).account_id for t in tokens} == {second.pk, third.pk}
    assert Execution.objects.filter(account=first, attempt_count=0, lease_fence=0).count() == 3
    assert not ExecutionAttempt.objects.filter(execution__account=first).exists()


def test_a_candidate_bound_to_another_epoch_is_not_leased(three_accounts):
    """The claim leases only candidates bound to the epoch the account's guard locked (the check before the CAS;
    the CAS repeats it under the row lock): a candidate read with another epoch is not leased (no Attempt), the
    rest are. Proves: CV2-03-017, CV2-07-018"""

    account = three_accounts.accounts[0]
    stale, fresh = _ready(three_accounts, account, 2, "ep")
    skewed = (f"SELECT q.id, q.account_id, CASE WHEN q.id = {stale.pk} THEN -1 ELSE q.epoch_id END "
              f"FROM ({claims._CLAIM_CANDIDATES}) q")
    with mock.patch.object(claims, "_CLAIM_CANDIDATES", skewed):
        tokens = execution.execution_claim_batch(holder="w", n=5, account_ids=[account.pk])
    assert [t.execution_pk for t in tokens] == [fresh.pk]
    assert not ExecutionAttempt.objects.filter(execution=stale).exists()


def test_a_poison_candidate_is_isolated_by_splitting_the_batch(three_accounts):
    """A lease transaction that fails deterministically for one Execution rolls back as a whole; the claim leases
    each half again until the Execution at fault stands alone: it is quarantined (EXECUTION_STEP_FAILED, step
    execution_claim, its lane halted) and every other candidate of the same call is leased (D-503, replacing the
    fallback to single claims). Proves: CV2-13-001, CV2-07-010, CV2-07-016"""
    from connector.models import OrderingLane, StepFailure
    from connector.services import claims

    first, second, _ = three_accounts.accounts
    ready = _ready(three_accounts, first, 2, "pa") + _ready(three_accounts, second, 2, "pb")
    bad = ready[1]
    real = claims.locks.executions_lease

    def lease(*, candidates, **kwargs):
        if any(pk == bad.pk for pk, _, _ in candidates):
            raise KeyError("poison claim")
        return real(candidates=candidates, **kwargs)

    with mock.patch.object(claims.locks, "executions_lease", lease):
        tokens = execution.execution_claim_batch(holder="w", n=10)
    assert sorted(t.execution_pk for t in tokens) == sorted(e.pk for e in ready if e.pk != bad.pk)
    bad.refresh_from_db()
    assert (bad.state, bad.quarantine_reason, bad.attempt_count) == ("quarantined", "EXECUTION_STEP_FAILED", 0)
    assert StepFailure.objects.get(entity_id=str(bad.pk)).step == "execution_claim"
    assert OrderingLane.objects.get(pk=bad.lane_id).halt_reason == "EXECUTION_STEP_FAILED"
    assert ExecutionAttempt.objects.filter(execution__in=[e for e in ready if e.pk != bad.pk]).count() == 3
