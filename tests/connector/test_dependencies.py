"""ExecutionDependency: a child Execution waits (no lease, not claimable) until its prerequisite completes or
its immutable deadline passes; satisfy, expire and reject races produce one result (CV2-07-023, CV2-07-024, CV2-07-025, CV2-07-026, CV2-07-027, CV2-07-028)."""
from __future__ import annotations

import threading
from datetime import timedelta
from unittest import mock

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from connector import locks
from connector.choices import DependencyState, ExecutionState
from connector.models import (
    ApplicationResult,
    CrmRecord,
    Execution,
    ExecutionDependency,
)
from connector.services import dependencies, execution, sweeper
from tests.concurrency import start, wait_until
from tests.conformance.packs import PACK_A, WEBHOOK_FIELDS_PROOF, with_route
from tests.connector.inbound_helpers import (
    build_inbound_world,
    deliver,
    run_ready,
    waiting_in_this_database,
    webhook_body,
    webhook_event,
)
from tests.support import scaled

LINKED = "records.linked"
DEADLINE = 120
LINKED_ROUTE = {
    "ordering_contract": "order_independent",
    "extract": {"format": "json", "components": "/events"},
    "normalize": {"event_kind": "/evt_type", "source_event_key": "/evt_id", "source_locator": "/record_id",
                  "payload": "/attributes"},
    "projection": {"record_key": "/record_id"},
    "depends_on": {"source_event_key": "/parent_evt", "deadline_seconds": DEADLINE},
    "mapping": "records.webhook.fields",
    "order_independence": WEBHOOK_FIELDS_PROOF,
}
PACK = with_route(PACK_A, LINKED, LINKED_ROUTE)


def later(seconds: int):
    return mock.patch("django.utils.timezone.now", return_value=timezone.now() + timedelta(seconds=seconds))


def send(world, evt_id: str, record: str, parent: str | None = None) -> list[int]:
    extra = {"parent_evt": parent} if parent else {}
    return deliver(world, LINKED, webhook_body(webhook_event(evt_id, record, 1, full_name=record, **extra))).executions


def state(pk: int) -> tuple[str, str]:
    row = Execution.objects.get(pk=pk)
    return row.state, row.quarantine_reason


@pytest.fixture
def world(db):
    return build_inbound_world("dp-", [PACK])


def test_child_waits_without_a_lease_until_its_parent_completes(world):
    """A child whose parent has not completed is `waiting_dependency`: no lease, not claimable, resolving
    changes nothing; once the parent completes, resolution satisfies the dependency without moving its deadline,
    the child becomes ready (same Execution, same projection) and runs from its Runtime result.
    Proves: CV2-07-009, CV2-07-012, CV2-07-014, CV2-07-023, CV2-07-024, CV2-07-027, CV2-07-028"""
    child, = send(world, "child-1", "rec-child", parent="parent-1")
    dependency = ExecutionDependency.objects.get()
    deadline = dependency.deadline
    assert (dependency.execution_id, dependency.requirement_key, dependency.state) == (
        child, "parent-1", DependencyState.WAITING)
    row = Execution.objects.get(pk=child)
    assert (row.state, row.lease_holder, row.lease_expires_at, row.attempt_count) == (
        ExecutionState.WAITING_DEPENDENCY, "", None, 0)
    assert execution.execution_claim(holder="w") is None
    assert dependencies.dependency_resolve(dependency_pk=dependency.pk) == DependencyState.WAITING

    parent, = send(world, "parent-1", "rec-parent")
    ran = run_ready()
    assert [e.pk for e in ran] == [parent]  # only the parent was claimable
    assert state(child) == (ExecutionState.WAITING_DEPENDENCY, "")
    assert dependencies.dependency_resolve(dependency_pk=dependency.pk) == DependencyState.SATISFIED
    dependency.refresh_from_db()
    assert (dependency.deadline, dependency.evidence) == (deadline, "completed:parent-1")
    assert state(child) == (ExecutionState.READY, "")
    projection_input = bytes(Execution.objects.get(pk=child).projection.input)
    done = run_ready()
    assert [e.pk for e in done] == [child] and done[0].state == ExecutionState.COMPLETED
    assert bytes(Execution.objects.get(pk=child).projection.input) == projection_input
    assert Execution.objects.get(pk=child).attempt_count == 1
    assert CrmRecord.objects.filter(record_key="rec-child").exists()
    assert ApplicationResult.objects.count() == 2


def test_dependency_past_its_deadline_expires_and_quarantines_the_child(world):
    """Before its deadline a waiting dependency stays waiting; after it, the sweeper expires it and the child is
    quarantined with DEPENDENCY_EXPIRED without any Runtime call; a parent completing later changes nothing.
    Proves: CV2-07-013, CV2-07-025, CV2-07-028, decision 6"""
    child, = send(world, "child-1", "rec-child", parent="parent-1")
    with later(DEADLINE - 5):
        assert sweeper.inbound_sweep(grace_seconds=0).dependencies_resolved == 0
    with later(DEADLINE + 1):
        assert sweeper.inbound_sweep(grace_seconds=0).dependencies_resolved == 1
    assert ExecutionDependency.objects.get().state == DependencyState.EXPIRED
    assert state(child) == (ExecutionState.QUARANTINED, "DEPENDENCY_EXPIRED")
    send(world, "parent-1", "rec-parent")
    run_ready()
    dependency = ExecutionDependency.objects.get()
    assert dependencies.dependency_resolve(dependency_pk=dependency.pk) == DependencyState.EXPIRED
    assert state(child) == (ExecutionState.QUARANTINED, "DEPENDENCY_EXPIRED")
    assert ApplicationResult.objects.count() == 1  # the parent only
    assert not CrmRecord.objects.filter(record_key="rec-child").exists()


def test_rejected_dependency_quarantines_the_child(world):
    """Explicit rejection evidence ends the dependency `rejected` and quarantines the child with
    DEPENDENCY_REJECTED. Proves: CV2-07-013, CV2-07-026, decision 6"""
    child, = send(world, "child-1", "rec-child", parent="parent-1")
    dependency = ExecutionDependency.objects.get()
    assert dependencies.dependency_resolve(dependency_pk=dependency.pk,
                                           reject_evidence="parent deleted at source") == DependencyState.REJECTED
    assert state(child) == (ExecutionState.QUARANTINED, "DEPENDENCY_REJECTED")
    assert ExecutionDependency.objects.get().evidence == "parent deleted at source"


def test_a_component_without_a_prerequisite_runs_at_once(world):
    """On a route with `depends_on`, a component that names no prerequisite mints a ready Execution with no
    dependency. Proves: CV2-07-023"""
    parent, = send(world, "parent-1", "rec-parent")
    assert state(parent) == (ExecutionState.READY, "") and not ExecutionDependency.objects.exists()


def test_database_keeps_the_deadline_and_the_dependency_transitions(world):
    """A raw UPDATE cannot move a dependency deadline or its requirement, nor take an unlisted transition
    (`satisfied -> waiting`); one dependency per (execution, requirement). Proves: CV2-07-023, CV2-07-028"""
    send(world, "child-1", "rec-child", parent="parent-1")
    dependency = ExecutionDependency.objects.get()
    for sql in ("UPDATE connector_executiondependency SET deadline = deadline + interval '1 hour' WHERE id=%s",
                "UPDATE connector_executiondependency SET requirement_key = 'other' WHERE id=%s"):
        with pytest.raises(IntegrityError, match="immutable"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [dependency.pk])
    with pytest.raises(IntegrityError), transaction.atomic():
        ExecutionDependency.objects.create(execution=dependency.execution, requirement_key="parent-1",
                                           deadline=timezone.now())
    send(world, "parent-1", "rec-parent")
    run_ready()
    dependencies.dependency_resolve(dependency_pk=dependency.pk)
    with pytest.raises(IntegrityError, match="transition"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE connector_executiondependency SET state='waiting' WHERE id=%s", [dependency.pk])


# -- races ---------------------------------------------------------------------------------------------------------

def _contend(dependency_pk: int, execution_pk: int, calls: list[dict]):
    """Start one resolver per `calls` entry while another connection holds the Execution row lock, wait until
    every resolver is queued behind it, then release: the resolvers meet on the lock at the same moment."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            locks.execution_for_update(execution_pk)
            held.set()
            assert release.wait(scaled(15))

    holder = start(hold, "holder")
    assert held.wait(scaled(15))
    resolvers = [start(lambda kw=kw: dependencies.dependency_resolve(dependency_pk=dependency_pk, **kw),
                       f"resolver-{i}") for i, kw in enumerate(calls)]
    assert wait_until(lambda: waiting_in_this_database() >= len(calls)), "the resolvers never queued on the lock"
    release.set()
    holder.join(scaled(15))
    for r in resolvers:
        r.join(scaled(15))
    assert holder.error is None
    return resolvers


@pytest.mark.django_db(transaction=True)
def test_satisfy_and_expire_race_resolves_once():
    """The deadline has just passed and the parent has completed; three resolvers (the sweeper and workers)
    resolve the same dependency at once: one terminal state, recorded once, every resolver reports it, and the
    Execution state matches it (satisfied -> ready). Proves: CV2-07-028, CV2-07-024, CV2-07-025, CV2-15-024"""
    world = build_inbound_world("dr-", [PACK])
    child, = send(world, "child-1", "rec-child", parent="parent-1")
    send(world, "parent-1", "rec-parent")
    run_ready()
    dependency = ExecutionDependency.objects.get()
    with later(DEADLINE + 1):
        resolvers = _contend(dependency.pk, child, [{}, {}, {}])
    assert [r.error for r in resolvers] == [None] * 3
    assert {r.result for r in resolvers} == {DependencyState.SATISFIED}
    resolved = ExecutionDependency.objects.get()
    assert resolved.state == DependencyState.SATISFIED and resolved.deadline == dependency.deadline
    assert state(child) == (ExecutionState.READY, "")
    assert [e.pk for e in run_ready()] == [child]


@pytest.mark.django_db(transaction=True)
def test_satisfy_and_reject_race_has_one_consistent_outcome():
    """A satisfying resolver and a rejecting one race on one dependency: exactly one terminal state wins, both
    callers report the winner, and the Execution follows it (ready after satisfied, quarantined after
    rejected), never both. Proves: CV2-07-028, CV2-07-024, CV2-07-026, CV2-15-024"""
    world = build_inbound_world("dj-", [PACK])
    child, = send(world, "child-1", "rec-child", parent="parent-1")
    send(world, "parent-1", "rec-parent")
    run_ready()
    dependency = ExecutionDependency.objects.get()
    resolvers = _contend(dependency.pk, child, [{}, {"reject_evidence": "operator veto"}])
    assert [r.error for r in resolvers] == [None, None]
    outcome = ExecutionDependency.objects.get().state
    assert outcome in (DependencyState.SATISFIED, DependencyState.REJECTED)
    assert {r.result for r in resolvers} == {outcome}
    expected = (ExecutionState.READY, "") if outcome == DependencyState.SATISFIED else (
        ExecutionState.QUARANTINED, "DEPENDENCY_REJECTED")
    assert state(child) == expected


@pytest.mark.django_db(transaction=True)
def test_parent_completion_racing_the_deadline_never_leaves_the_child_stuck():
    """The parent's result is being recorded (transaction open) when the deadline passes and the sweeper
    resolves: it cannot see an uncommitted completion, so the dependency expires and the child is quarantined;
    after the parent commits, resolution keeps that one result. The child is never both ready and quarantined,
    and never left waiting. Proves: CV2-07-028, CV2-07-025, CV2-07-013"""
    world = build_inbound_world("dx-", [PACK])
    child, = send(world, "child-1", "rec-child", parent="parent-1")
    parent, = send(world, "parent-1", "rec-parent")
    token = execution.execution_claim(holder="w")
    assert token.execution_pk == parent
    recording, release = threading.Event(), threading.Event()

    def record_parent():
        with transaction.atomic():
            done = execution.execution_run(token=token)
            recording.set()
            assert release.wait(scaled(15))
            return done.state

    dependency = ExecutionDependency.objects.get()
    recorder = start(record_parent, "parent-result")
    assert recording.wait(scaled(15))
    with later(DEADLINE + 1):
        resolver = start(lambda: dependencies.dependency_resolve(dependency_pk=dependency.pk), "sweeper")
        resolver.join(scaled(15))
    release.set()
    recorder.join(scaled(15))
    assert recorder.error is None and recorder.result == ExecutionState.COMPLETED
    assert resolver.error is None and resolver.result == DependencyState.EXPIRED
    assert dependencies.dependency_resolve(dependency_pk=dependency.pk) == DependencyState.EXPIRED
    assert state(child) == (ExecutionState.QUARANTINED, "DEPENDENCY_EXPIRED")
    assert state(parent) == (ExecutionState.COMPLETED, "")
