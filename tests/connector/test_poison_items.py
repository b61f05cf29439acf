"""Poison items never wedge the inbound sweep or the execution worker (decision D-168, CV2-13-001).

For each step — the inbound sweep's materialization, lane advance, gap deadline, window seal and dependency
resolution, the materialization task, the worker's execution claim and run — one item fails for a non-connector
reason (a real constraint violation where the product can produce one, otherwise the step monkeypatched to raise
for that item only). The item is quarantined (or held) with its closed reason code and a StepFailure row (step,
exception class and message, time) and the other items of the same sweep or worker loop complete. A transient
error (the database restarting) never quarantines: the item is retried."""
from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.core.management import call_command
from django.db import OperationalError
from django.utils import timezone

from connector import locks, tasks
from connector.choices import ExecutionState
from connector.models import (
    ApplicationResult,
    AuditRecord,
    Execution,
    ExecutionDependency,
    GapDecision,
    MaterializationDue,
    OrderingLane,
    ProjectionWindow,
    Receipt,
    ReceiptComponent,
    StepFailure,
)
from connector.services import dependencies, execution, materialize, storable, sweeper
from tests.conformance.packs import PACK_A, PACK_B, WEBHOOK_FIELDS_PROOF, variant, with_route
from tests.connector.inbound_helpers import (
    admit,
    build_inbound_world,
    deliver,
    feed_body,
    feed_line,
    webhook_body,
    webhook_event,
)

WEBHOOK, SEQUENCED, GROUPED, LINKED = "records.webhook", "ledger.sequenced", "ledger.grouped", "records.linked"
STAMP_65 = "2026-01-01T00:00:00." + "1" * 44 + "Z"  # fits RFC 3339, not Event.occurred_at (varchar(64))
LINKED_ROUTE = {
    "ordering_contract": "order_independent",
    "extract": {"format": "json", "components": "/events"},
    "normalize": {"event_kind": "/evt_type", "source_event_key": "/evt_id", "source_locator": "/record_id",
                  "payload": "/attributes"},
    "projection": {"record_key": "/record_id"},
    "depends_on": {"source_event_key": "/parent_evt", "deadline_seconds": 60},
    "mapping": "records.webhook.fields",
    "order_independence": WEBHOOK_FIELDS_PROOF,
}
PACK_B_NOW = variant(variant(PACK_B, SEQUENCED, ordering={"gap_deadline_seconds": 0}), GROUPED,
                     window={"max_age_seconds": 0})


@pytest.fixture
def world(db, monkeypatch):
    for task in (tasks.lane_advance, tasks.execution_claim_and_run):  # Redis only wakes workers: not needed here
        monkeypatch.setattr(task, "delay", lambda *args, **kwargs: None)
    return build_inbound_world("po-", [with_route(PACK_A, LINKED, LINKED_ROUTE), PACK_B_NOW])


def poison(monkeypatch, module, name: str, key: str, bad: int, exc: Exception | None = None) -> None:
    """Make `module.name` raise for the one item whose keyword `key` is `bad`; every other item runs for real."""
    real = getattr(module, name)

    def step(**kwargs):
        if kwargs[key] == bad:
            raise exc if exc is not None else ValueError(f"poison item {bad}")
        return real(**kwargs)

    monkeypatch.setattr(module, name, step)


def admitted_by_the_old_admission(world, body: bytes) -> Receipt:
    """A receipt the admission of today's main accepted (no storability check): what a poison item looks like."""
    with mock.patch.object(storable, "events_check", lambda **kwargs: None):
        return admit(world, WEBHOOK, body)


def failure(entity) -> StepFailure:
    return StepFailure.objects.get(entity_type=type(entity)._meta.label, entity_id=str(entity.pk))


def test_a_receipt_that_fails_materialization_is_held_and_the_sweep_moves_on(world):
    """A Receipt whose materialization violates a column (a 65-character occurred_at: DataError) is held with
    MATERIALIZATION_FAILED and StepFailure evidence; in the same sweep the later receipt materializes and its lane
    advances, and the next sweep does not retry the held one (today the DataError crashed every sweep, every 5 s,
    and nothing behind it ran). Proves: CV2-13-001, CV2-05-017"""
    bad = admitted_by_the_old_admission(world, webhook_body(webhook_event("ev-bad", "rec-bad", 1,
                                                                          emitted_at=STAMP_65)))
    good = admit(world, WEBHOOK, webhook_body(webhook_event("ev-good", "rec-good", 1)))
    report = sweeper.inbound_sweep(grace_seconds=0)
    assert (report.materialized, report.quarantined, report.lanes_advanced) == (1, 1, 1)
    due = MaterializationDue.objects.get(receipt=bad)
    assert due.held_reason == "MATERIALIZATION_FAILED" and due.held_at is not None
    assert not ReceiptComponent.objects.filter(receipt=bad).exists()
    assert ReceiptComponent.objects.filter(receipt=good).count() == 1
    assert not MaterializationDue.objects.filter(receipt=good).exists()
    evidence = failure(bad)
    assert (evidence.step, evidence.reason_code, evidence.exception_class) == (
        "receipt_materialize", "MATERIALIZATION_FAILED", "django.db.utils.DataError")
    assert "value too long" in evidence.message
    assert AuditRecord.objects.filter(entity_type="connector.Receipt", entity_id=str(bad.pk),
                                      action="quarantine:receipt_materialize", to_state="held").exists()
    again = sweeper.inbound_sweep(grace_seconds=0)
    assert (again.materialized, again.quarantined) == (0, 0)
    assert StepFailure.objects.count() == 1


def test_the_materialize_task_holds_a_poison_receipt_instead_of_failing(world):
    """The worker step (`connector.tasks.receipt_materialize`) isolates the receipt the same way: held, the task
    returns normally. Proves: CV2-13-001"""
    bad = admitted_by_the_old_admission(world, webhook_body(webhook_event("ev-bad", "rec-bad", 1,
                                                                          emitted_at=STAMP_65)))
    tasks.receipt_materialize(bad.pk)
    assert MaterializationDue.objects.get(receipt=bad).held_reason == "MATERIALIZATION_FAILED"
    assert failure(bad).step == "receipt_materialize"


def test_a_transient_error_never_quarantines_and_the_item_is_retried(world, monkeypatch):
    """An OperationalError (the database restarting, a deadlock) is transient: the receipt is neither held nor
    given evidence, the rest of the sweep runs, and the next sweep materializes it. Proves: CV2-13-005"""
    flaky = admit(world, WEBHOOK, webhook_body(webhook_event("ev-1", "rec-1", 1)))
    other = admit(world, WEBHOOK, webhook_body(webhook_event("ev-2", "rec-2", 1)))
    with monkeypatch.context() as m:
        poison(m, materialize, "receipt_materialize", "receipt_pk", flaky.pk,
               OperationalError("server closed the connection unexpectedly"))
        report = sweeper.inbound_sweep(grace_seconds=0)
    assert (report.materialized, report.quarantined) == (1, 0)
    assert MaterializationDue.objects.get(receipt=flaky).held_reason == ""
    assert not StepFailure.objects.exists()
    assert not MaterializationDue.objects.filter(receipt=other).exists()
    assert sweeper.inbound_sweep(grace_seconds=0).materialized == 1
    assert not MaterializationDue.objects.filter(receipt=flaky).exists()


def test_a_released_receipt_is_materialized_by_the_next_sweep(world, monkeypatch):
    """The remediation once the cause is fixed: `poison_release --receipt` puts the held receipt back in the
    queue (audited, the evidence stays) and the next sweep derives its children. Proves: CV2-13-001, CV2-13-002"""
    held = admit(world, WEBHOOK, webhook_body(webhook_event("ev-1", "rec-1", 1)))
    with monkeypatch.context() as m:
        poison(m, materialize, "receipt_materialize", "receipt_pk", held.pk)
        sweeper.inbound_sweep(grace_seconds=0)
    assert MaterializationDue.objects.get(receipt=held).held_reason == "MATERIALIZATION_FAILED"
    assert sweeper.inbound_sweep(grace_seconds=0).materialized == 0  # fixed, but held until released
    call_command("poison_release", receipt=held.pk, reason="fix 1.2.3 deployed", operator="ops-1")
    assert AuditRecord.objects.get(action="materialization_release").actor == "system:operator:ops-1"
    assert sweeper.inbound_sweep(grace_seconds=0).materialized == 1
    assert ReceiptComponent.objects.filter(receipt=held).count() == 1
    assert StepFailure.objects.count() == 1


def test_a_lane_whose_advance_fails_halts_and_the_other_lanes_advance(world, monkeypatch):
    """lane_advance failing for one lane halts that lane (LANE_STEP_FAILED, evidence) and every other lane of the
    sweep advances; after the fix `poison_release --lane` reopens it with its pending positions intact.
    Proves: CV2-13-001, CV2-06-014"""
    for n in (1, 2):
        deliver(world, WEBHOOK, webhook_body(webhook_event(f"ev-{n}", f"rec-{n}", 1)))
    bad, good = (OrderingLane.objects.get(partition=f"rec-{n}") for n in (1, 2))
    with monkeypatch.context() as m:
        poison(m, execution, "lanes_advance", "lane_pks", [bad.pk])  # the sweeper: one lane a batch of one
        report = sweeper.inbound_sweep(grace_seconds=0)
    assert (report.lanes_advanced, report.quarantined) == (1, 1)
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.state, bad.halt_reason, bad.active_execution_id) == ("halted", "LANE_STEP_FAILED", None)
    assert good.state == "open" and good.active_execution_id is not None
    assert failure(bad).step == "lane_advance"
    call_command("poison_release", lane=bad.pk, reason="fix deployed")
    assert sweeper.inbound_sweep(grace_seconds=0).lanes_advanced == 1
    bad.refresh_from_db()
    assert bad.state == "open" and bad.active_execution_id is not None


def test_a_lane_whose_gap_decision_fails_halts_and_the_other_gaps_are_decided(world, monkeypatch):
    """lane_gap_deadline failing for one strict lane halts it (LANE_STEP_FAILED); the other lane's expired gap
    is decided in the same sweep (its frozen disposition: GAP_DEADLINE). Proves: CV2-13-001, CV2-06-020"""
    deliver(world, SEQUENCED, feed_body(feed_line("L-1", 2, "member-1"), feed_line("L-2", 2, "member-2")))
    bad, good = (OrderingLane.objects.get(partition=f"member-{n}") for n in (1, 2))
    for lane in (bad, good):  # position 1 never arrived: each lane records that a gap is waiting
        execution.lane_advance(lane_pk=lane.pk)
        lane.refresh_from_db()
    assert bad.gap_since is not None and good.gap_since is not None
    with monkeypatch.context() as m:
        poison(m, execution, "lane_gap_deadline", "lane_pk", bad.pk)
        report = sweeper.inbound_sweep(grace_seconds=0)
    assert (report.gaps_decided, report.quarantined) == (1, 1)
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.state, bad.halt_reason) == ("halted", "LANE_STEP_FAILED")
    assert (good.state, good.halt_reason) == ("halted", "GAP_DEADLINE")
    assert GapDecision.objects.filter(lane=good).exists() and not GapDecision.objects.filter(lane=bad).exists()
    assert failure(bad).step == "lane_gap_deadline"


def test_a_window_whose_seal_fails_is_quarantined_and_the_other_windows_seal(world, monkeypatch):
    """window_seal_due failing for one window quarantines it (WINDOW_SEAL_FAILED, `open -> quarantined`) and the
    other due window of the sweep seals and mints its execution. Proves: CV2-13-001, CV2-06-025, CV2-07-005"""
    deliver(world, GROUPED, feed_body(feed_line("G-1", 1, "m-1", batch_tag="batch-a"),
                                      feed_line("G-2", 1, "m-2", batch_tag="batch-b")))
    bad, good = (ProjectionWindow.objects.get(grouping_key=f"batch-{t}") for t in "ab")
    with monkeypatch.context() as m:
        poison(m, execution, "window_seal_due", "window_pk", bad.pk)
        report = sweeper.inbound_sweep(grace_seconds=0)
    assert (report.windows_sealed, report.quarantined) == (1, 1)
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.state, bad.quarantine_reason) == ("quarantined", "WINDOW_SEAL_FAILED")
    assert good.state == "sealed" and good.projection.executions.count() == 1
    assert failure(bad).step == "window_seal_due"


def test_a_dependency_whose_resolution_fails_quarantines_its_execution_and_the_others_resolve(world, monkeypatch):
    """dependency_resolve failing for one dependency quarantines its Execution (EXECUTION_STEP_FAILED) and rejects
    the dependency with the failure as evidence (so no sweep meets it again); the other expired dependency is
    resolved in the same sweep. Proves: CV2-13-001, CV2-07-026"""
    children = [deliver(world, LINKED, webhook_body(webhook_event(f"child-{n}", f"rec-{n}", 1,
                                                                  parent_evt=f"parent-{n}"))).executions[0]
                for n in (1, 2)]
    bad, good = (ExecutionDependency.objects.get(execution_id=pk) for pk in children)
    with monkeypatch.context() as m, mock.patch("django.utils.timezone.now",
                                                return_value=timezone.now() + timedelta(seconds=61)):
        poison(m, dependencies, "dependency_resolve", "dependency_pk", bad.pk)
        report = sweeper.inbound_sweep(grace_seconds=0)
    assert (report.dependencies_resolved, report.quarantined) == (1, 1)
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.state, bad.evidence) == ("rejected", "EXECUTION_STEP_FAILED in dependency_resolve")
    assert good.state == "expired"
    assert Execution.objects.get(pk=bad.execution_id).quarantine_reason == "EXECUTION_STEP_FAILED"
    assert Execution.objects.get(pk=good.execution_id).quarantine_reason == "DEPENDENCY_EXPIRED"
    assert failure(Execution.objects.get(pk=bad.execution_id)).step == "dependency_resolve"
    assert sweeper.inbound_sweep(grace_seconds=0).quarantined == 0


def test_an_execution_whose_runtime_run_fails_is_quarantined_and_the_worker_runs_the_next(world):
    """The worker loop (`execution_claim_and_run`) meets an Execution whose Runtime apply violates a column (a
    U+0000 in a mapped value, which jsonb refuses: DataError): it is quarantined (EXECUTION_STEP_FAILED), its lane
    halts with the same reason, and the next Execution of the same loop completes (today the DataError ended the
    task; the lease expired and the poison was claimed again forever). Proves: CV2-13-001, CV2-07-012"""
    bad = admitted_by_the_old_admission(world, webhook_body(webhook_event("ev-bad", "rec-bad", 1,
                                                                          full_name="A\u0000da")))
    materialize.receipt_materialize(receipt_pk=bad.pk)
    deliver(world, WEBHOOK, webhook_body(webhook_event("ev-good", "rec-good", 1)))
    for lane in OrderingLane.objects.order_by("pk"):
        execution.lane_advance(lane_pk=lane.pk)
    assert tasks.execution_claim_and_run() == 2
    poisoned = Execution.objects.get(projection__event__source_event_key="ev-bad")
    done = Execution.objects.get(projection__event__source_event_key="ev-good")
    assert (poisoned.state, poisoned.quarantine_reason) == (ExecutionState.QUARANTINED, "EXECUTION_STEP_FAILED")
    assert (done.state, done.result_outcome) == (ExecutionState.COMPLETED, "applied")
    lane = OrderingLane.objects.get(partition="rec-bad")
    assert (lane.state, lane.halt_reason, lane.active_execution_id) == ("halted", "EXECUTION_STEP_FAILED", None)
    evidence = failure(poisoned)
    assert (evidence.step, evidence.exception_class) == ("execution_run", "django.db.utils.DataError")
    assert not ApplicationResult.objects.filter(command_id=poisoned.command_id).exists()


def test_an_execution_whose_claim_fails_is_quarantined_and_the_next_is_claimed(world, monkeypatch):
    """A claim failing for one Execution quarantines it (step execution_claim) and the same claim call takes the
    next ready Execution (`ready -> quarantined`). Proves: CV2-13-001, CV2-07-010, CV2-07-011"""
    for n in (1, 2):
        deliver(world, WEBHOOK, webhook_body(webhook_event(f"ev-{n}", f"rec-{n}", 1)))
    for lane in OrderingLane.objects.order_by("pk"):
        execution.lane_advance(lane_pk=lane.pk)
    bad, good = Execution.objects.order_by("pk")
    real = locks.execution_for_update

    def lock(pk, *, skip_locked=False, **kwargs):
        if pk == bad.pk and skip_locked:
            raise KeyError("poison claim")
        return real(pk, skip_locked=skip_locked, **kwargs)

    monkeypatch.setattr(locks, "execution_for_update", lock)
    token = execution.execution_claim(holder="w-1")
    assert token is not None and token.execution_pk == good.pk
    bad.refresh_from_db()
    assert (bad.state, bad.quarantine_reason) == (ExecutionState.QUARANTINED, "EXECUTION_STEP_FAILED")
    assert failure(bad).step == "execution_claim"
    assert OrderingLane.objects.get(partition="rec-1").halt_reason == "EXECUTION_STEP_FAILED"


def test_an_epoch_whose_verification_fails_is_recorded_and_the_sweep_verifies_the_others(db, monkeypatch):
    """The serving-epoch sweep meets a prepared candidate whose verification fails for a non-connector reason:
    EPOCH_VERIFY_FAILED is recorded (StepFailure), the sweep verifies the other candidate, and later sweeps no
    longer re-verify the failed one (its remediation is `epoch_reject` and a new candidate).
    Proves: CV2-13-001, CV2-02-038"""
    from connector.actors import Actor
    from connector.demo import build_owners
    from connector.models import ServingEpoch
    from connector.services import serving

    owners = build_owners("ep-")
    bad, good = (serving.epoch_prepare_from_owners(epoch_id=f"ep-epoch-{n}", actor=Actor.system("test"),
                                                   configuration_generation_id=owners.configuration.generation_id)
                 for n in (1, 2))
    poison(monkeypatch, sweeper, "epoch_verify", "epoch_pk", bad.pk, AttributeError("poison verify"))
    report = sweeper.serving_epoch_sweep()
    assert (report.verified, report.failed, report.deferred) == ([good.pk], [bad.pk], [])
    assert ServingEpoch.objects.get(pk=bad.pk).state == "prepared"
    assert (failure(bad).reason_code, failure(bad).step) == ("EPOCH_VERIFY_FAILED", "epoch_verify")
    assert sweeper.serving_epoch_sweep().failed == []
    assert StepFailure.objects.count() == 1
    # the remedy: an operator rejects the candidate; it leaves the board
    from governance.poison import poison_items

    assert [i.pk for i in poison_items() if i.code == "EPOCH_VERIFY_FAILED"] == [bad.pk]
    serving.epoch_reject(epoch_pk=bad.pk, reason="verification bug; a new candidate follows", actor=Actor.system("op"))
    assert [i.pk for i in poison_items() if i.code == "EPOCH_VERIFY_FAILED"] == []


def test_a_batch_fallback_logs_a_refusal_quietly_and_a_defect_with_its_traceback(caplog):
    """A batch rolled back because the gate stopped serving (a routine refusal during a halt) is logged at INFO
    without a traceback; a defect is logged as an ERROR with one (D-397). Proves: CV2-14-004 (the batch falls back
    to the per-item path either way; only the log level differs)."""
    import logging

    from connector.errors import GateNotServing
    from connector.services import poison

    logger = logging.getLogger("tests.batch_fallback")
    with caplog.at_level(logging.INFO, logger="tests.batch_fallback"):
        poison.log_fallback(logger, GateNotServing("gate halting_v2"), "batch of %d rolled back", 3)
        poison.log_fallback(logger, ValueError("bad row"), "batch of %d rolled back", 4)
    refused, failed = caplog.records
    assert (refused.levelno, refused.exc_info) == (logging.INFO, None)
    assert refused.getMessage() == "batch of 3 rolled back: GateNotServing: gate halting_v2"
    assert failed.levelno == logging.ERROR and failed.exc_info[0] is ValueError
    assert failed.getMessage() == "batch of 4 rolled back"
