"""The delivery journal under crashes and restores (contract `journal`, `mutation_gate`, `remote_job_semaphore`
orphan recovery): a REAL child process delivering one operation is SIGKILLed at a named crash point
(connector.faults), then `runner.recover_orphan` settles the attempt from its durable facts alone; a restored
journal epoch and a marker without its attempt block the mutation gate until a governed unblock."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, connections

from connector.actors import Actor
from effects.delivery.errors import DeliveryError, DeliveryPermissionDenied, DeliveryRequestInvalid
from effects.models import DeliveryAttempt, DeliveryOperation, MayAttemptMarker, MutationGate
from effects.choices import CapacityState
from effects.services.delivery import execution, journal, runner
from tests import dbroles
from tests.crash.conftest import PRELUDE, ROOT, _url
from tests.effects.delivery.world import T0, build, operator
from tests.support import scaled

TX = pytest.mark.django_db(transaction=True, databases=["default", "journal"])
CHILD_TIMEOUT = 90
STEP_SCRIPT = """
from effects.services.delivery import runner
emit(state=runner.step(ARGS["operation"]))
"""


@pytest.fixture
def run_child(settings):
    """run_child(script, fault_point, **args): a fresh interpreter bound to this test's (committed) databases and
    secret directory runs `script` after django.setup(); CONNECTOR_FAULT_POINT makes it SIGKILL itself there."""
    default = connections["default"].settings_dict
    journal_db = connections["journal"].settings_dict
    assert default["NAME"] == default["TEST"]["NAME"], "the test database is not set up"
    env = {k: v for k, v in os.environ.items()
           if k not in ("CONNECTOR_FAULT_POINT", "DATABASE_URL", "JOURNAL_DATABASE_URL", "TEST_DB_SUFFIX")}
    env.update({"DJANGO_SETTINGS_MODULE": "config.django.test", "DATABASE_URL": _url(default, default["NAME"]),
                "JOURNAL_DATABASE_URL": _url(journal_db, journal_db["TEST"]["NAME"]),
                "CONNECTOR_SECRET_DIR": settings.CONNECTOR["SECRET_BACKEND_DIR"],
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
                **dbroles.child_env()})

    def run(script: str, fault_point: str | None, **args) -> subprocess.CompletedProcess:
        child_env = dict(env, CRASH_CHILD_ARGS=json.dumps(args))
        if fault_point:
            child_env["CONNECTOR_FAULT_POINT"] = fault_point
        return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script)], env=child_env, cwd=ROOT,
                              capture_output=True, text=True, timeout=scaled(CHILD_TIMEOUT), check=False)

    return run


def assert_killed(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == -signal.SIGKILL, (f"child was not SIGKILLed (returncode {proc.returncode}):\n"
                                                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    assert "CHILD-RESULT" not in proc.stdout, "the child got past its crash point"


def one_operation(world) -> DeliveryOperation:
    parent = world.plan(parent_key="crash", records=[{"at": T0.isoformat(), "id": "a"},
                                                     {"at": T0.isoformat(), "id": "b"}])
    return parent.children.get()


def mutations_for(receiver, op: DeliveryOperation) -> int:
    key = bytes(op.receiver_mutation_key).hex()
    return Counter(r["key"] for r in receiver.mutations())[key]


# -- (a) crashes around the request ------------------------------------------------------------------------------

@TX
def test_crash_before_io_marked_recovers_to_retry_and_sends_exactly_once(sync_receiver, run_child):
    """Proves: immutable_pre_attempt_marker_precedes_submitting and request_not_started_can_retry_with_same_
    delivery_key: the child dies by SIGKILL at "delivery.after_submit" (SUBMITTING, the MAY_ATTEMPT marker, the
    reserved attempt committed; io_may_have_started never committed). recover_orphan reconciles by attempt ID:
    the request provably never left, so the attempt settles not_started, capacity is released and the operation
    waits in retry_wait; the next step sends it exactly once with the same receiver mutation key."""
    world = build(sync_receiver.url)
    op = one_operation(world)
    proc = run_child(STEP_SCRIPT, "delivery.after_submit", operation=op.pk)
    assert_killed(proc)

    op.refresh_from_db()
    assert op.state == "submitting" and op.attempt_ordinal == 1
    first = DeliveryAttempt.objects.get(operation=op, ordinal=1)
    assert first.marker.attempt_id == first.attempt_id and first.marker.kind == "MAY_ATTEMPT"
    assert (first.io_may_have_started, first.outcome, first.capacity_state) == (False, "", CapacityState.RESERVED)
    assert sync_receiver.mutations() == []
    # a young orphan is left alone by the sweeper's lease; recovery by attempt ID settles it
    assert runner.sweep(lease=timedelta(hours=1))["orphans_recovered"] == 0
    assert runner.recover_orphan(op.pk) == "retry_wait"
    first.refresh_from_db()
    assert first.outcome == "not_started" and first.capacity_state == CapacityState.RELEASED

    assert runner.step(op.pk) == "verifying_success"
    assert runner.step(op.pk) == "final_full_promoted"
    op.refresh_from_db()
    assert op.attempt_ordinal == 2
    assert mutations_for(sync_receiver, op) == 1
    assert sync_receiver.applied == {bytes(op.receiver_mutation_key).hex(): 1}
    assert journal.journal_audit() == []  # every marker has its attempt


@TX
@pytest.mark.parametrize("point, sent", [("delivery.after_io_marked", 0), ("delivery.after_request", 1)])
def test_crash_after_io_may_have_started_is_unknown_without_second_request(sync_receiver, run_child, point, sent):
    """Proves: unknown_remote_job_retains_capacity_until_reconciliation and immutable_pre_attempt_marker_precedes_
    submitting (orphan_recovery: journal_reconciliation_by_attempt_id): the child dies by SIGKILL after
    io_may_have_started was committed, before ("delivery.after_io_marked") or after ("delivery.after_request",
    the receiver applied it) the request. recover_orphan cannot prove the request never left: the operation is
    final_unknown_not_accepted with its capacity retained, and neither steps nor sweeps ever send a second
    request (the receiver saw exactly `sent` mutation requests, applied at most once)."""
    world = build(sync_receiver.url)
    op = one_operation(world)
    proc = run_child(STEP_SCRIPT, point, operation=op.pk)
    assert_killed(proc)

    attempt = DeliveryAttempt.objects.get(operation=op, ordinal=1)
    assert attempt.io_may_have_started and attempt.outcome == ""
    assert mutations_for(sync_receiver, op) == sent
    assert sum(sync_receiver.applied.values()) == sent

    assert runner.recover_orphan(op.pk) == "final_unknown_not_accepted"
    op.refresh_from_db()
    assert op.last_code == "REST_DELIVERY_REMOTE_EFFECT_UNKNOWN"
    attempt.refresh_from_db()
    assert attempt.outcome == "ambiguous" and attempt.capacity_state == CapacityState.RESERVED
    assert runner.step(op.pk) == "final_unknown_not_accepted"
    runner.sweep(lease=timedelta(0))
    assert runner.recover_orphan(op.pk) == "final_unknown_not_accepted"
    assert mutations_for(sync_receiver, op) == sent
    assert DeliveryAttempt.objects.filter(operation=op).count() == 1


# -- (b) a restored journal epoch ----------------------------------------------------------------------------------

def _no_writes(op: DeliveryOperation) -> None:
    op.refresh_from_db()
    assert op.state == "sealed" and op.attempt_ordinal == 0
    assert not MayAttemptMarker.objects.filter(operation=op).exists()
    assert not DeliveryAttempt.objects.filter(operation=op).exists()


def test_journal_restore_blocks_submission_without_zero_rpo(world, sync_receiver):
    """Proves: journal_restore_blocks_submission_without_zero_rpo: the restore tooling attests a newer journal
    epoch (the restored `default` lags it); the next submit is REST_DELIVERY_JOURNAL_EPOCH_BLOCKED, writes no
    marker and no attempt, and blocks the gate (journal_epoch_mismatch). Unblocking is refused without the
    permission, without a completed reconciliation campaign, and to the campaign's own starter; with a completed
    campaign and another approving user, a new epoch is attested and adopted and submission works."""
    op = one_operation(world)
    assert journal.attested_epoch() == 1
    journal.attest_epoch(epoch=2, reason="restore", actor=Actor.system("restore-tooling"))

    with pytest.raises(DeliveryError) as info:
        execution.submit(op.pk)
    assert info.value.code == "REST_DELIVERY_JOURNAL_EPOCH_BLOCKED"
    _no_writes(op)
    gate = MutationGate.objects.get()
    assert (gate.state, gate.blocked_reason) == ("BLOCKED", "journal_epoch_mismatch")
    assert runner.step(op.pk) == "sealed"  # the driver is refused too
    with pytest.raises(DeliveryError):
        execution.submit(op.pk)
    _no_writes(op)
    assert sync_receiver.mutations() == []

    starter = Actor.for_user(world.approver)
    campaign = journal.campaign_start(actor=starter, campaign_id="restore-2026-11", reason="restore")
    nobody = Actor.for_user(operator("delivery-nobody"))
    with pytest.raises(DeliveryPermissionDenied):
        journal.gate_unblock(actor=nobody, campaign=campaign)
    with pytest.raises(DeliveryRequestInvalid):  # the campaign has not completed
        journal.gate_unblock(actor=Actor.for_user(world.admin), campaign=campaign)
    assert MutationGate.objects.get().state == "BLOCKED"
    with pytest.raises(DeliveryError):
        execution.submit(op.pk)

    journal.campaign_complete(actor=starter, campaign=campaign, findings=[])
    with pytest.raises(DeliveryPermissionDenied):
        journal.gate_unblock(actor=nobody, campaign=campaign)
    with pytest.raises(DeliveryPermissionDenied):  # the campaign's starter does not approve its own campaign
        journal.gate_unblock(actor=starter, campaign=campaign)
    assert MutationGate.objects.get().state == "BLOCKED" and journal.attested_epoch() == 2
    gate = journal.gate_unblock(actor=Actor.for_user(world.admin), campaign=campaign)
    assert gate.state == "ENABLED" and gate.journal_epoch == 3 == journal.attested_epoch()
    assert execution.submit(op.pk).submitted
    assert runner.recover_orphan(op.pk) == "retry_wait"  # (settle the attempt to finish cleanly)
    assert runner.step(op.pk) == "verifying_success"
    assert mutations_for(sync_receiver, op) == 1


def test_journal_restore_blocks_in_flight_attempt_before_io(world, sync_receiver):
    """Proves: journal_restore_blocks_submission_without_zero_rpo (an attempt reserved before the restore
    attestation cannot start its I/O: the egress adapter's pre-I/O CAS checks the gate and epoch too)."""
    op = one_operation(world)
    result = execution.submit(op.pk)
    assert result.submitted
    journal.attest_epoch(epoch=2, reason="restore", actor=Actor.system("restore-tooling"))
    with pytest.raises(DeliveryError) as info:
        execution.attempt_start_io(result.attempt.pk)
    assert info.value.code == "REST_DELIVERY_JOURNAL_EPOCH_BLOCKED"
    result.attempt.refresh_from_db()
    assert not result.attempt.io_may_have_started
    assert sync_receiver.mutations() == []


# -- (c) a marker without its attempt ----------------------------------------------------------------------------

def test_marker_without_attempt_blocks_the_gate(world, sync_receiver):
    """Proves: may_attempt_marker_is_attempt_scoped and journal_restore_blocks_submission_without_zero_rpo
    (mutation_gate.blocked_after: pre_attempt_marker_without_matching_journal_attempt): a MAY_ATTEMPT marker
    without its attempt (as a partial restore leaves it) makes journal_audit block the gate; submits are then
    refused without writing anything, and the gate cannot be unblocked while the orphan marker remains."""
    op = one_operation(world)
    assert journal.journal_audit() == []
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO effects_mayattemptmarker (kind, attempt_id, attempt_ordinal, operation_id,"
            " operation_namespace, parent_and_child_identity, generation, expected_journal_revision,"
            " journal_epoch, mutation_intent_digest, created_at) VALUES ('MAY_ATTEMPT', gen_random_uuid(), 7, %s,"
            " %s, 'crash#1', %s, %s, 1, %s, now())",
            [op.pk, bytes(op.namespace), op.explicit_generation, op.revision, bytes(op.mutation_intent_digest)])
    findings = journal.journal_audit()
    assert len(findings) == 1 and "MAY_ATTEMPT markers without journal attempts" in findings[0]
    gate = MutationGate.objects.get()
    assert (gate.state, gate.blocked_reason) == ("BLOCKED", "pre_attempt_marker_without_matching_journal_attempt")

    with pytest.raises(DeliveryError) as info:
        execution.submit(op.pk)
    assert info.value.code == "REST_DELIVERY_JOURNAL_EPOCH_BLOCKED"
    op.refresh_from_db()
    assert op.state == "sealed" and not DeliveryAttempt.objects.filter(operation=op).exists()
    assert MayAttemptMarker.objects.filter(operation=op).count() == 1  # only the planted one

    admin = Actor.for_user(world.admin)
    campaign = journal.campaign_start(actor=Actor.for_user(world.approver), campaign_id="marker-audit",
                                      reason="orphan marker")
    journal.campaign_complete(actor=admin, campaign=campaign, findings=findings)
    with pytest.raises(DeliveryRequestInvalid):
        journal.gate_unblock(actor=admin, campaign=campaign)
    assert MutationGate.objects.get().state == "BLOCKED"
    assert sync_receiver.mutations() == []
