"""`manage.py check_invariants`: the system invariants as read-only, set-based queries.

A clean world (the demo push world with traffic run through the whole chain, leaving in-flight work of every
kind) passes. Then, for each invariant, the database is corrupted on purpose with raw SQL — triggers and foreign
keys off (`SET session_replication_role = replica`), and where a unique index guards the invariant, that index
dropped inside the test's transaction (rolled back with it) — and the checker must report exactly that
invariant, with the offending ids, and exit non-zero.

The world also carries REST bulk delivery traffic (tests/effects/delivery/world.py against a loopback
DeliveryReceiver): one parent delivered in full (children final_full_promoted, frontier 2, a watermark) and one
single-child parent whose child was submitted (SUBMITTING, marker, attempt holding capacity) but never sent. Its
tests need the journal database, where the journal epoch is attested."""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, ProgrammingError, connection, transaction
from django.test.utils import CaptureQueriesContext

from connector.actors import Actor
from connector.demo import build_world
from connector.models import (
    AccountServingGate,
    ApplicationResult,
    Execution,
    MaterializationDue,
    OrderingLane,
    Projection,
    Receipt,
    SupersededDecision,
)
from connector.selectors.invariants import INVARIANTS, invariant_check
from connector.services.admission import receipt_admit
from connector.services.execution import execution_claim, execution_run, lane_advance
from connector.services.materialize import receipt_materialize
from connector.services.sweeper import inbound_sweep
from effects.delivery.contract import AXES, contract
from tests.effects.delivery.receiver import DeliveryReceiver
from effects.models import (
    DeliveryAttempt,
    DeliveryOperation,
    DeliveryParent,
    DeliveryWatermark,
    DispatchPermit,
    MayAttemptMarker,
    RemoteEffect,
    RemoteEffectAttempt,
)
from effects.services import dispatch
from effects.services.delivery import execution as delivery_execution
from effects.services.delivery import runner as delivery_runner
from effects.services.worker import effect_dispatch_once
from tests.crash.support import webhook_body
from tests.effects.delivery import world as delivery_world
from tests.effects.receiver import Receiver
from tests import dbroles
from tests.support import whole_seconds

CHANNEL = "records.webhook"
ACTOR = Actor.system("invariants-test")
DB = pytest.mark.django_db(databases=["default", "journal"])  # delivery submits read the journal epoch


@dataclass
class Traffic:
    """Handles on the clean world's rows that the corruptions aim at."""

    world: object
    pending_receipt: Receipt  # admitted, not yet materialized (MaterializationDue present)
    superseded_projection: Projection  # a projection the lane superseded (no Execution)
    completed: Execution  # completed, in a lane, with its ApplicationResult
    ready: Execution  # minted by the lane, never claimed (account 2)
    finalized: RemoteEffect  # remote_confirmed -> finalized through the receiver
    prepared: RemoteEffect  # authored, never claimed
    granted: DispatchPermit  # claimed, permit acquired, nothing sent yet (effect dispatching)
    delivered: DeliveryParent  # two children final_full_promoted, frontier 2, its watermark
    submitting: DeliveryOperation  # the only child of a second parent: SUBMITTING, never sent
    submit_attempt: DeliveryAttempt  # its attempt (capacity reserved), with its marker


def _admit(account, key: str, *events: tuple[str, int]) -> Receipt:
    return receipt_admit(account_key=account.account_key, channel=CHANNEL, transport_key=key,
                         body=webhook_body(*events), actor=ACTOR).receipt


def run_delivery(delivery_receiver) -> tuple[DeliveryParent, DeliveryOperation, DeliveryAttempt]:
    """REST bulk delivery: one parent (4 records, 2 children) delivered in full through the loopback receiver,
    and the single child of a second parent (the next day, same conflict domain) submitted but not sent."""
    w = delivery_world.build(delivery_receiver.url)
    delivered = w.plan(parent_key="inv-full")
    states = delivery_runner.drive_parent(delivered.pk)
    assert states == ["final_full_promoted", "final_full_promoted"], states
    day = delivery_world.T0 + timedelta(days=1)
    pending = w.plan(parent_key="inv-submitting", start=day, end=day + timedelta(days=1),
                     records=[{"at": (day + timedelta(hours=h)).isoformat(), "id": f"s{h}", "v": h}
                              for h in range(2)])
    [child] = pending.children.all()
    result = delivery_execution.submit(child.pk)
    assert result.submitted, result
    return DeliveryParent.objects.get(pk=delivered.pk), DeliveryOperation.objects.get(pk=child.pk), result.attempt


def run_traffic(receiver, delivery_receiver) -> Traffic:
    """Drive the demo push world through admission, materialization, lanes, claims, Runtime and dispatch, and
    leave some work in flight at every stage (all of it legitimate); then the delivery traffic."""
    world = build_world("i-", push=True)
    first, second = world.accounts
    # rec-1 at positions 1 and 2 in one lane before it advances: position 1 is superseded
    _admit(first, "d-1", ("rec-1", 1), ("rec-2", 1))
    _admit(first, "d-2", ("rec-1", 2), ("rec-3", 1), ("rec-4", 1))
    _admit(first, "d-2", ("rec-1", 2), ("rec-3", 1), ("rec-4", 1))  # a transport retry: duplicate
    _admit(first, "d-3", ("rec-2", 1))  # the same event again: duplicate_event component
    assert inbound_sweep(grace_seconds=-60).materialized == 3
    while (token := execution_claim(holder="inv-worker", account_id=first.pk)) is not None:
        execution_run(token=token)
    inbound_sweep(grace_seconds=-60)
    assert execution_claim(holder="inv-worker", account_id=first.pk) is None
    # outbound: two effects finalized through the receiver, one granted (dispatching), one left prepared
    effects = list(RemoteEffect.objects.filter(account=first).order_by("pk"))
    assert len(effects) == 4, [e.state for e in effects]
    for _ in range(2):
        assert effect_dispatch_once(holder_name="inv-egress", account_id=first.pk).state == "finalized"
    holder = dispatch.holder_register(holder_id="inv-paused")
    permit = dispatch.permit_acquire(claim=dispatch.effect_claim(holder=holder, account_id=first.pk))
    # the second account: one Execution minted and ready, one Receipt still due
    ready_receipt = _admit(second, "s-1", ("rec-9", 1))
    out = receipt_materialize(receipt_pk=ready_receipt.pk)
    ready = lane_advance(lane_pk=next(iter(out.lanes)))
    pending = _admit(second, "s-2", ("rec-8", 1), ("rec-7", 1))

    superseded = SupersededDecision.objects.get(lane__account=first).projection
    completed = Execution.objects.filter(account=first, state="completed").order_by("pk").first()
    delivered, submitting, submit_attempt = run_delivery(delivery_receiver)
    return Traffic(world=world, pending_receipt=pending, superseded_projection=superseded, completed=completed,
                   ready=ready, finalized=RemoteEffect.objects.filter(account=first, state="finalized").first(),
                   prepared=RemoteEffect.objects.get(account=first, state="prepared"), granted=permit,
                   delivered=delivered, submitting=submitting, submit_attempt=submit_attempt)


@pytest.fixture
def receiver(settings):
    r = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": r.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(2)}
    yield r
    r.stop()


@pytest.fixture(scope="module")
def delivery_receiver():
    """One loopback receiver for the module: it answers every sync batch in full whatever it saw before, and
    stopping a server per test would cost up to its 0.5 s poll interval each time."""
    r = DeliveryReceiver(kind="sync_batch").start()
    yield r
    r.stop()


@pytest.fixture
def traffic(db, receiver, delivery_receiver) -> Traffic:
    return run_traffic(receiver, delivery_receiver)


# -- corruption helpers (only ever inside the test's own transaction) -------------------------------------------

def _replica(cursor) -> None:
    """Triggers and foreign-key checks off for this session (superuser). The deferred foreign-key checks queued by
    the world's own inserts run first, while their rows are still intact (Django's test teardown runs them)."""
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    cursor.execute("SET CONSTRAINTS ALL DEFERRED")
    dbroles.admin_on(cursor)
    cursor.execute("SET session_replication_role = replica")


def raw(sql: str, params=()) -> None:
    """One statement with triggers and foreign-key checks off, then back on."""
    with connection.cursor() as cursor:
        _replica(cursor)
        try:
            cursor.execute(sql, params)
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")
            dbroles.admin_off(cursor)


def drop_unique(table: str, column: str) -> None:
    """Drop the single-column unique constraint or (partial) unique index guarding `table.column`. DDL is
    transactional in PostgreSQL: the test's rollback restores it."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no ALTER TABLE while deferred checks are pending
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        cursor.execute("""
            SELECT i.relname, con.conname FROM pg_index x
            JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
            JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[0]
            LEFT JOIN pg_constraint con ON con.conindid = x.indexrelid AND con.conrelid = t.oid
            WHERE t.relname = %s AND x.indisunique AND NOT x.indisprimary AND x.indnatts = 1 AND a.attname = %s
        """, [table, column])
        found = cursor.fetchall()
        assert found, f"no unique index on {table}.{column}"
        dbroles.admin_on(cursor)  # only the owner may drop an index: the test stages what no product role can
        for index, constraint in found:
            if constraint:
                cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{constraint}"')
            else:
                cursor.execute(f'DROP INDEX "{index}"')
        dbroles.admin_off(cursor)


def copy_row(table: str, pk: int, **overrides) -> int:
    """Insert a copy of one row with a new id and the given column values; returns the new id."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                       "AND table_schema = current_schema() ORDER BY ordinal_position", [table])
        columns = [c for (c,) in cursor.fetchall() if c != "id"]
    select = ", ".join(f"%({c})s" if c in overrides else c for c in columns)
    with connection.cursor() as cursor:
        _replica(cursor)
        try:
            cursor.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} FROM {table} "
                           f"WHERE id = %(pk)s RETURNING id", {**overrides, "pk": pk})
            return cursor.fetchone()[0]
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")
            dbroles.admin_off(cursor)


def sha(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def run_command(*args: str) -> tuple[bool, str]:
    """(passed, stdout) of `manage.py check_invariants`."""
    out = io.StringIO()
    try:
        call_command("check_invariants", *args, stdout=out)
    except CommandError as exc:
        assert exc.returncode == 1
        return False, out.getvalue()
    return True, out.getvalue()


# -- the clean world ----------------------------------------------------------------------------------------------

@DB
def test_clean_world_passes(traffic):
    """Every invariant holds on a world with traffic through the whole chain and work in flight at each stage
    (a receipt due, a superseded projection, a ready execution, a prepared effect, a granted permit, a delivered
    parent, a SUBMITTING delivery with its marker and reserved attempt); the command exits 0 in text and JSON
    form."""
    assert MaterializationDue.objects.filter(receipt=traffic.pending_receipt).exists()
    assert traffic.granted.state == "granted" and traffic.ready.state == "ready"
    assert traffic.delivered.contiguous_checkpoint_frontier == 2
    assert DeliveryWatermark.objects.filter(domain_id=traffic.delivered.domain_id).exists()
    assert traffic.submitting.state == "submitting" and traffic.submitting.execution == "SUBMITTING"
    assert traffic.submit_attempt.capacity_state == "reserved" and not traffic.submit_attempt.io_may_have_started
    assert MayAttemptMarker.objects.filter(operation=traffic.submitting, attempt_ordinal=1).exists()
    report = invariant_check()
    assert report.ok, [(v.invariant, v.ids) for v in report.violations]
    assert report.checked == [i.code for i in INVARIANTS] and not report.skipped
    passed, text = run_command()
    assert passed and text.count("ok        ") == len(INVARIANTS), text
    passed, text = run_command("--json")
    data = json.loads(text)
    assert passed and data["ok"] is True and data["violations"] == [] and data["totals"] == {}


@DB
def test_checks_are_set_based_queries(traffic):
    """One SQL statement per invariant whatever the amount of history: no per-row Python loop."""
    with CaptureQueriesContext(connection) as queries:
        invariant_check()
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == len(INVARIANTS)
    assert all(sql.startswith("SELECT v.*, count(*) OVER ()") for sql in statements)


@pytest.mark.django_db(transaction=True)
def test_own_run_is_one_read_only_snapshot(db):
    """Outside a caller's transaction the checker pins one REPEATABLE READ, READ ONLY snapshot."""
    from connector.selectors import invariants

    seen = []
    original = invariants._run

    def spy(cursor, invariant, limit, report):
        cursor.execute("SELECT current_setting('transaction_read_only'), current_setting('transaction_isolation')")
        seen.append(cursor.fetchone())
        original(cursor, invariant, limit, report)

    invariants._run = spy
    try:
        assert invariant_check().ok
    finally:
        invariants._run = original
    assert set(seen) == {("on", "repeatable read")}


# -- one corruption per invariant ---------------------------------------------------------------------------------

def c_due_lost(t: Traffic) -> dict:
    """The work row of a receipt whose children were never materialized is lost."""
    raw("DELETE FROM connector_materializationdue WHERE receipt_id = %s", [t.pending_receipt.pk])
    return {"receipt": t.pending_receipt.pk, "expected": 2, "found": 0}


def c_component_lost(t: Traffic) -> dict:
    """A materialized receipt loses one of its components (its Event and Projection remain)."""
    receipt = Receipt.objects.filter(account=t.world.accounts[0], component_count=3).first()
    raw("DELETE FROM connector_receiptcomponent WHERE receipt_id = %s AND ordinal = 2", [receipt.pk])
    return {"receipt": receipt.pk, "expected": 3, "found": 2}


def c_projection_lost(t: Traffic) -> dict:
    projection = t.superseded_projection
    raw("DELETE FROM connector_projection WHERE id = %s", [projection.pk])
    return {"event": projection.event_id, "receipt": projection.event.receipt_id}


def c_second_active_execution(t: Traffic) -> dict:
    drop_unique("connector_execution", "projection_id")
    twin = copy_row("connector_execution", t.ready.pk, generation=t.ready.generation + 1,
                    command_id=t.ready.command_id + "-twin")
    return {"projection": t.ready.projection_id, "executions": [t.ready.pk, twin]}


def c_second_result(t: Traffic) -> dict:
    drop_unique("connector_applicationresult", "command_id")
    original = ApplicationResult.objects.get(command_id=t.completed.command_id)
    twin = copy_row("connector_applicationresult", original.pk)
    return {"command_id": t.completed.command_id, "results": [original.pk, twin]}


def c_result_digest(t: Traffic) -> dict:
    raw("UPDATE connector_applicationresult SET result_digest = %s WHERE command_id = %s",
        [sha("forged"), t.completed.command_id])
    return {"execution": t.completed.pk, "problem": "result digest differs"}


def c_result_ref(t: Traffic) -> dict:
    raw("UPDATE connector_applicationresult SET execution_ref_digest = %s WHERE command_id = %s",
        [sha("other ref"), t.completed.command_id])
    return {"execution": t.completed.pk, "problem": "ExecutionRef digest differs"}


def c_result_lost(t: Traffic) -> dict:
    raw("DELETE FROM connector_applicationresult WHERE command_id = %s", [t.completed.command_id])
    return {"execution": t.completed.pk, "problem": "no ApplicationResult", "result": None}


def c_high_water_ahead(t: Traffic) -> dict:
    lane = OrderingLane.objects.get(pk=t.completed.lane_id)
    raw("UPDATE connector_orderinglane SET high_water = high_water + 5 WHERE id = %s", [lane.pk])
    return {"lane": lane.pk, "high_water": lane.high_water + 5, "max_completed": lane.high_water}


def c_completed_above_high_water(t: Traffic) -> dict:
    lane = OrderingLane.objects.get(pk=t.completed.lane_id)
    raw("UPDATE connector_orderinglane SET high_water = high_water - 1 WHERE id = %s", [lane.pk])
    return {"lane": lane.pk, "high_water": lane.high_water - 1, "max_completed": lane.high_water}


def c_effect_lost(t: Traffic) -> dict:
    raw("DELETE FROM effects_remoteeffect WHERE id = %s", [t.prepared.pk])
    return {"command": t.prepared.command_id, "effects": 0, "effect_ids": []}


def c_second_effect(t: Traffic) -> dict:
    drop_unique("effects_remoteeffect", "command_id")
    twin = copy_row("effects_remoteeffect", t.prepared.pk)
    return {"command": t.prepared.command_id, "effects": 2, "effect_ids": [t.prepared.pk, twin]}


def c_effect_key(t: Traffic) -> dict:
    raw("UPDATE effects_remoteeffect SET logical_effect_digest = %s WHERE id = %s", [sha("other"), t.prepared.pk])
    return {"effect": t.prepared.pk, "command": t.prepared.command_id, "problem": "logical_effect_digest differs"}


def c_permit_foreign_gate(t: Traffic) -> dict:
    other = AccountServingGate.objects.get(account=t.world.accounts[1])
    raw("UPDATE effects_dispatchpermit SET gate_id = %s WHERE id = %s", [other.pk, t.granted.pk])
    return {"permit": t.granted.pk, "effect": t.granted.effect_id, "gate": other.pk,
            "gate_account": t.world.accounts[1].pk, "effect_account": t.world.accounts[0].pk}


def c_permit_no_gate(t: Traffic) -> dict:
    raw("UPDATE effects_dispatchpermit SET gate_id = %s WHERE id = %s", [10**9, t.granted.pk])
    return {"permit": t.granted.pk, "effect": t.granted.effect_id, "gate": 10**9, "gate_account": None}


def c_second_open_permit(t: Traffic) -> dict:
    drop_unique("effects_dispatchpermit", "effect_id")
    attempt = RemoteEffectAttempt.objects.get(pk=t.granted.attempt_id)
    twin_attempt = copy_row("effects_remoteeffectattempt", attempt.pk, ordinal=attempt.ordinal + 1)
    twin = copy_row("effects_dispatchpermit", t.granted.pk, attempt_id=twin_attempt)
    return {"effect": t.granted.effect_id, "permits": [t.granted.pk, twin]}


def c_dispatching_without_permit(t: Traffic) -> dict:
    raw("UPDATE effects_dispatchpermit SET state = 'abandoned' WHERE id = %s", [t.granted.pk])
    return {"effect": t.granted.effect_id, "state": "dispatching", "permit": None,
            "problem": "dispatching without an open permit"}


def c_open_permit_of_prepared_effect(t: Traffic) -> dict:
    raw("UPDATE effects_remoteeffect SET state = 'prepared' WHERE id = %s", [t.granted.effect_id])
    return {"effect": t.granted.effect_id, "state": "prepared", "permit": t.granted.pk,
            "problem": "open permit of an effect that is not dispatching"}


def c_second_confirmation(t: Traffic) -> dict:
    attempt = RemoteEffectAttempt.objects.get(effect=t.finalized, outcome="remote_confirmed")
    twin = copy_row("effects_remoteeffectattempt", attempt.pk, ordinal=attempt.ordinal + 1)
    return {"effect": t.finalized.pk, "attempts": [attempt.pk, twin]}


def _delivered_children(t: Traffic) -> list[DeliveryOperation]:
    return list(t.delivered.children.order_by("frontier_order"))


def c_submitting_marker_lost(t: Traffic) -> dict:
    """The MAY_ATTEMPT marker of a SUBMITTING operation is lost; its attempt row remains."""
    raw("DELETE FROM effects_mayattemptmarker WHERE id = %s", [t.submit_attempt.marker_id])
    return {"operation": t.submitting.pk, "attempt_ordinal": 1, "marker": None, "attempt": t.submit_attempt.pk}


def c_submitting_commit_lost(t: Traffic) -> dict:
    """The CAS to SUBMITTING survives without the marker and attempt it committed with."""
    raw("DELETE FROM effects_deliveryattempt WHERE id = %s", [t.submit_attempt.pk])
    raw("DELETE FROM effects_mayattemptmarker WHERE id = %s", [t.submit_attempt.marker_id])
    return {"operation": t.submitting.pk, "attempt_ordinal": 1, "marker": None, "attempt": None}


def c_delivery_attempt_lost(t: Traffic) -> dict:
    """A delivered child's attempt row is lost; its MAY_ATTEMPT marker remains."""
    child = _delivered_children(t)[0]
    attempt = DeliveryAttempt.objects.get(operation=child)
    raw("DELETE FROM effects_deliveryattempt WHERE id = %s", [attempt.pk])
    return {"marker": attempt.marker_id, "operation": child.pk, "attempt_ordinal": attempt.ordinal}


def c_capacity_over(t: Traffic) -> dict:
    """A released reservation is reserved again and the semaphore shrinks to 1: two reserved against one."""
    child = _delivered_children(t)[0]
    raw("UPDATE effects_deliveryattempt SET capacity_state = 'reserved' WHERE operation_id = %s", [child.pk])
    raw("UPDATE effects_remotejobsemaphore SET capacity = 1 WHERE id = %s", [t.submit_attempt.semaphore_id])
    return {"semaphore": t.submit_attempt.semaphore_id, "capacity": 1, "reserved": 2}


def c_attempt_before_admission(t: Traffic) -> dict:
    """A child's attempt is dated before its parent's admission."""
    parent = t.submitting.parent
    raw("UPDATE effects_deliveryattempt SET created_at = %s WHERE id = %s",
        [parent.admitted_at - timedelta(seconds=1), t.submit_attempt.pk])
    return {"operation": t.submitting.pk, "parent": parent.pk, "parent_state": "ADMITTED"}


def c_child_of_planning_parent(t: Traffic) -> dict:
    """A parent with a child is back in PLANNING."""
    raw("UPDATE effects_deliveryparent SET state = 'PLANNING' WHERE id = %s", [t.submitting.parent_id])
    return {"operation": t.submitting.pk, "parent": t.submitting.parent_id, "parent_state": "PLANNING"}


def c_frontier_ahead(t: Traffic) -> dict:
    """The parent's frontier claims a third checkpoint: no child's full effect stands behind it."""
    raw("UPDATE effects_deliveryparent SET contiguous_checkpoint_frontier = 3 WHERE id = %s", [t.delivered.pk])
    return {"parent": t.delivered.pk, "frontier": 3, "promoted": 2, "out_of_frontier": []}


def c_promoted_out_of_order(t: Traffic) -> dict:
    """The second child is promoted while the first is only eligible, and the frontier says 1: the count agrees
    but the promoted child is not the frontier's prefix."""
    first, second = _delivered_children(t)
    raw("UPDATE effects_deliveryoperation SET state = 'final_full_eligible' WHERE id = %s", [first.pk])
    raw("UPDATE effects_deliveryparent SET contiguous_checkpoint_frontier = 1 WHERE id = %s", [t.delivered.pk])
    return {"parent": t.delivered.pk, "frontier": 1, "promoted": 1, "out_of_frontier": [first.pk, second.pk]}


CORRUPTIONS = [
    ("receipt_children_missing", c_due_lost),
    ("receipt_children_missing", c_component_lost),
    ("event_descendants_missing", c_projection_lost),
    ("execution_active_duplicate", c_second_active_execution),
    ("application_result_duplicate", c_second_result),
    ("execution_result_mismatch", c_result_digest),
    ("execution_result_mismatch", c_result_ref),
    ("execution_result_mismatch", c_result_lost),
    ("lane_high_water_mismatch", c_high_water_ahead),
    ("lane_high_water_mismatch", c_completed_above_high_water),
    ("remote_effect_not_exactly_one", c_effect_lost),
    ("remote_effect_not_exactly_one", c_second_effect),
    ("remote_effect_key_mismatch", c_effect_key),
    ("permit_outside_gate_set", c_permit_foreign_gate),
    ("permit_outside_gate_set", c_permit_no_gate),
    ("permit_open_duplicate", c_second_open_permit),
    ("dispatch_permit_mismatch", c_dispatching_without_permit),
    ("dispatch_permit_mismatch", c_open_permit_of_prepared_effect),
    ("remote_confirmed_attempt_duplicate", c_second_confirmation),
    ("delivery_submitting_without_marker", c_submitting_marker_lost),
    ("delivery_submitting_without_marker", c_submitting_commit_lost),
    ("delivery_marker_without_attempt", c_delivery_attempt_lost),
    ("delivery_capacity_over_semaphore", c_capacity_over),
    ("delivery_child_before_parent_admission", c_attempt_before_admission),
    ("delivery_child_before_parent_admission", c_child_of_planning_parent),
    ("delivery_checkpoint_without_full_effect", c_frontier_ahead),
    ("delivery_checkpoint_without_full_effect", c_promoted_out_of_order),
]


def test_every_invariant_has_a_corruption():
    assert {code for code, _ in CORRUPTIONS} == {i.code for i in INVARIANTS}


@DB
@pytest.mark.parametrize("code,corrupt", CORRUPTIONS, ids=[c.__name__[2:] for _, c in CORRUPTIONS])
def test_corruption_is_reported_exactly(traffic, code, corrupt):
    """The corrupted invariant, and only it, is reported once with the offending ids; the command exits 1 and
    prints them (text and JSON)."""
    assert invariant_check().ok
    expected = corrupt(traffic)
    report = invariant_check()
    assert report.codes() == {code}, [(v.invariant, v.ids) for v in report.violations]
    [violation] = report.violations
    ids = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in violation.ids.items()}
    assert {k: ids[k] for k in expected} == expected, ids

    passed, text = run_command()
    assert not passed
    assert f"VIOLATED  {code} (1)" in text and violation.as_text() in text
    assert text.count("VIOLATED") == 1
    passed, text = run_command("--json")
    data = json.loads(text)
    assert not passed and data["ok"] is False and data["totals"] == {code: 1}
    assert [v["invariant"] for v in data["violations"]] == [code]


@DB
def test_operator_mark_excuses_a_dispatching_effect_without_permit(traffic):
    """A `dispatching` effect without an open permit is waiting for an operator when it carries a
    quarantine_reason: not a violation."""
    raw("UPDATE effects_dispatchpermit SET state = 'abandoned' WHERE id = %s", [traffic.granted.pk])
    raw("UPDATE effects_remoteeffect SET quarantine_reason = 'OPERATOR_HOLD' WHERE id = %s",
        [traffic.granted.effect_id])
    assert invariant_check().ok


@DB
def test_child_checkpoint_without_full_effect_is_refused_by_the_schema(traffic):
    """Why `delivery_checkpoint_without_full_effect` has no per-child branch: a child's checkpoint axis without a
    verified full effect cannot be written, even with triggers and foreign keys off. Every contract tuple with
    a checkpoint (ELIGIBLE, PROMOTED) pairs it with FULLY_APPLIED and PASSED; `state` is held to the tuples by
    a CHECK constraint (not switched off by `session_replication_role`); the axis columns are generated from
    `state` and refuse writes."""
    for name, values in contract().tuples.items():
        axes = dict(zip(AXES, values))
        if axes["checkpoint"] != "BLOCKED":
            assert (axes["remote_effect"], axes["verification"]) == ("FULLY_APPLIED", "PASSED"), name
    child = _delivered_children(traffic)[0]
    for sql, error, match in (
            ("UPDATE effects_deliveryoperation SET state = 'final_partial_eligible' WHERE id = %s", IntegrityError,
             "delivery_state_is_legal_tuple"),
            ("UPDATE effects_deliveryoperation SET checkpoint = 'ELIGIBLE', remote_effect = 'UNKNOWN' WHERE id = %s",
             ProgrammingError, "can only be updated to DEFAULT")):
        with pytest.raises(error, match=match), transaction.atomic(), connection.cursor() as cursor:
            _replica(cursor)
            cursor.execute(sql, [child.pk])
    assert invariant_check().ok


@DB
def test_limit_caps_rows_but_totals_count_all(traffic):
    """`--limit` bounds what is listed; the total still counts every offending row."""
    raw("DELETE FROM connector_materializationdue")
    raw("DELETE FROM connector_receiptcomponent WHERE receipt_id IN (SELECT id FROM connector_receipt "
        "WHERE component_count = 3)")
    report = invariant_check(limit=1)
    assert report.totals["receipt_children_missing"] == 2 and len(report.of("receipt_children_missing")) == 1
    passed, text = run_command("--limit", "1", "--only", "receipt_children_missing")
    assert not passed and "... and 1 more" in text and "1 invariants checked" in text
