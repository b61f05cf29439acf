"""Due receipts of one account materialized in one transaction (D-294) and their lanes advanced in one transaction
(D-295), the one path of each step (D-521): the same rows as batches of one, a constant number of statements, and
a poison item split out of its batch and quarantined alone while the others go on. On real PostgreSQL (the kills
are in tests/crash/test_materialize_batch_crash.py)."""
from __future__ import annotations

import hashlib

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from connector import tasks
from connector.models import (
    Event,
    Execution,
    MaterializationDue,
    OrderingLane,
    Projection,
    Receipt,
    ReceiptComponent,
    SupersededDecision,
)
from connector.services import advance, execution, materialize
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import admit, build_inbound_world, webhook_body, webhook_event

WEBHOOK = "records.webhook"


@pytest.fixture
def two_accounts(transactional_db):
    return build_inbound_world("mt-", [PACK_A], account_keys=("acct-1", "acct-2"))


def _deliveries(world, account) -> list[Receipt]:
    """Five receipts: two events in one receipt, a later position of a record, an identical copy of an earlier
    event (a duplicate), the same event key with other bytes (a conflict), and a new record."""
    bodies = [
        webhook_body(webhook_event("ev-a", "rec-a", 1), webhook_event("ev-b", "rec-b", 1)),
        webhook_body(webhook_event("ev-c", "rec-a", 2)),
        webhook_body(webhook_event("ev-a", "rec-a", 1)),
        webhook_body(webhook_event("ev-b", "rec-b", 1, full_name="Someone Else")),
        webhook_body(webhook_event("ev-d", "rec-d", 1)),
    ]
    return [admit(world, WEBHOOK, body, account=account) for body in bodies]


def _state(receipts: list[Receipt]) -> list:
    """Everything materialized for these receipts, in their order, without identities (pks, digests of pks)."""
    out = []
    for r in receipts:
        components = [(c.ordinal, c.disposition, c.reason_code, c.event and c.event.source_event_key,
                       bytes(c.payload_digest))
                      for c in ReceiptComponent.objects.filter(receipt=r).select_related("event").order_by("ordinal")]
        events = [(e.source_event_key, e.partition, e.position, bytes(e.payload_digest), e.route, e.ordering_contract,
                   bytes(e.contract_digest))
                  for e in Event.objects.filter(receipt=r).order_by("source_event_key")]
        out.append((components, events))
    account = receipts[0].account_id
    lanes = {}
    for lane in OrderingLane.objects.filter(account_id=account).order_by("partition"):
        lanes[lane.partition] = [(p.event.source_event_key, p.position, bytes(p.input_digest), p.lane_status,
                                  p.execution_generation)
                                 for p in Projection.objects.filter(lane=lane).select_related("event").order_by("pk")]
    out.append(lanes)
    out.append(MaterializationDue.objects.filter(receipt__in=receipts).count())
    return out


def test_a_batch_derives_exactly_what_one_receipt_after_the_other_derives(two_accounts):
    """The same five deliveries to two accounts; account 1's are materialized in one transaction
    (`receipts_materialize`), account 2's as batches of one (`receipt_materialize`, ascending pk). Every
    Component (ordinal, disposition, conflict reason, its Event), every Event, every lane with its Projections in
    pk order (the lane's last tie-breaker) and the due rows are the same: the first component of a key inserts,
    an identical later one is a duplicate, different bytes are a conflict, across receipts as within one.
    Proves: CV2-05-011, CV2-05-016, CV2-05-017, CV2-05-018, CV2-14-001"""
    together_acct, single_acct = two_accounts.accounts
    together, single = _deliveries(two_accounts, together_acct), _deliveries(two_accounts, single_acct)
    out = materialize.receipts_materialize(receipt_pks=[r.pk for r in together], account_id=together_acct.pk)
    assert out.components == 6 and len(out.events) == 4
    for r in single:
        materialize.receipt_materialize(receipt_pk=r.pk, account_id=single_acct.pk)
    state = _state(together)
    assert state == _state(single)
    assert [c[1] for c in state[2][0]] == ["duplicate_event"] and state[3][0][0][2] == "EVENT_KEY_CONFLICT"
    assert state[-1] == 0
    # materialized: a second pass derives nothing more
    again = materialize.receipts_materialize(receipt_pks=[r.pk for r in together], account_id=together_acct.pk)
    assert again.components == 0 and _state(together) == state


def test_another_accounts_receipt_refuses_the_batch_and_writes_nothing(two_accounts):
    """A batch naming a receipt of another account raises Receipt.DoesNotExist (every statement names its account)
    and writes nothing for any receipt of it. Proves: CV2-05-011, CV2-03-015"""
    first, second = two_accounts.accounts
    mine, theirs = _deliveries(two_accounts, first), _deliveries(two_accounts, second)
    with pytest.raises(Receipt.DoesNotExist):
        materialize.receipts_materialize(receipt_pks=[r.pk for r in mine + theirs[:1]], account_id=first.pk)
    assert ReceiptComponent.objects.count() == 0 and MaterializationDue.objects.count() == 10


def test_a_poison_receipt_is_split_out_of_its_batch_and_held_while_the_others_materialize(two_accounts, monkeypatch,
                                                                                           settings):
    """Five due receipts of one account, the third of which fails deterministically whenever it is materialized:
    `materialize_due` splits the failing batch until that receipt stands alone, holds it with
    MATERIALIZATION_FAILED and a StepFailure, and materializes the four others (their lanes advanced); the held
    receipt keeps no child. Before that, a gate that does not serve leaves every receipt due and holds none
    (transient). Proves: CV2-13-001, CV2-05-017"""
    from connector.choices import StepFailureReason
    from connector.errors import GateNotServing
    from connector.models import StepFailure

    account = two_accounts.accounts[0]
    receipts = _deliveries(two_accounts, account)
    poison = receipts[2].pk
    real_derive, real_guard = materialize._derive_events, materialize.lock_serving

    def derive(todo, *args, **kwargs):
        if any(r.pk == poison for r in todo):
            raise ValueError("test: this receipt's bytes break the parser")
        return real_derive(todo, *args, **kwargs)

    def halted(**_kwargs):
        raise GateNotServing("test: the gate halts")

    monkeypatch.setattr(tasks.execution_claim_and_run, "delay", lambda *a, **k: None)
    settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_SLOTS": 1}
    monkeypatch.setattr(materialize, "lock_serving", halted)
    assert tasks.materialize_due(account.pk) == 5
    assert MaterializationDue.objects.filter(held_reason="").count() == 5 and StepFailure.objects.count() == 0
    monkeypatch.setattr(materialize, "lock_serving", real_guard)
    monkeypatch.setattr(materialize, "_derive_events", derive)
    assert tasks.materialize_due(account.pk) == 5
    held = MaterializationDue.objects.get()
    assert (held.receipt_id, held.held_reason) == (poison, StepFailureReason.MATERIALIZATION_FAILED)
    assert StepFailure.objects.get().entity_id == str(poison)
    assert not ReceiptComponent.objects.filter(receipt_id=poison).exists()
    assert ReceiptComponent.objects.filter(receipt__in=receipts).count() == 5


#: Statements of `receipts_materialize` for any number of fresh one-event receipts, one included (D-294, D-521):
#: BEGIN, the guard, the receipts FOR UPDATE, their done Components, the Events, the Components, the lanes (read,
#: insert), the Projections, the due rows, COMMIT.
TOGETHER = 11


def test_materialization_statement_count_does_not_grow_with_the_receipts(two_accounts,
                                                                        django_assert_max_num_queries):
    """1, 2 and 20 fresh receipts (each a new record) are materialized with the same, pinned number of statements.
    Proves: CV2-14-001, STYLE R27"""
    account = two_accounts.accounts[0]
    warm = [admit(two_accounts, WEBHOOK, webhook_body(webhook_event(f"w{i}", f"rec-w{i}", 1))) for i in range(2)]
    materialize.receipts_materialize(receipt_pks=[r.pk for r in warm], account_id=account.pk)
    counts = []
    for n in (1, 2, 20):
        receipts = [admit(two_accounts, WEBHOOK, webhook_body(webhook_event(f"e{n}-{i}", f"rec-{n}-{i}", 1)))
                    for i in range(n)]
        with django_assert_max_num_queries(TOGETHER), CaptureQueriesContext(connection) as seen:
            out = materialize.receipts_materialize(receipt_pks=[r.pk for r in receipts], account_id=account.pk)
        assert out.components == n and len(out.lanes) == n
        counts.append(len(seen.captured_queries))
    assert counts[0] == counts[1] == counts[2], counts


def _lanes_state(account) -> dict:
    """Every lane of the account after its advance, by partition, without identities."""
    out = {}
    for lane in OrderingLane.objects.filter(account=account).order_by("partition"):
        active = Execution.objects.filter(pk=lane.active_execution_id).select_related("projection__event").first()
        out[lane.partition] = (
            lane.fence, lane.state, lane.high_water, lane.gap_since is not None,
            active and (active.projection.event.source_event_key, active.generation, active.state, active.lane_id == lane.pk,
                        bytes(active.execution_ref_digest) == hashlib.sha256(bytes(active.execution_ref)).digest()),
            [(p.event.source_event_key, p.lane_status, p.execution_generation)
             for p in Projection.objects.filter(lane=lane).select_related("event").order_by("position", "pk")],
            sorted((d.reason, d.position, d.selected_position) for d in SupersededDecision.objects.filter(lane=lane)))
    return out


def test_lanes_advanced_together_decide_exactly_as_one_lane_after_the_other(two_accounts):
    """The same deliveries to two accounts, materialized one by one; account 1's lanes are advanced in one
    transaction (`lanes_advance`), account 2's as batches of one (`lane_advance`, ascending pk). Every lane
    (fence, state, high-water, gap, its active Execution and that Execution's ExecutionRef), every Projection's
    status and generation and every superseded decision are the same, including a lane whose lower position is
    superseded by a higher one. A second pass finds every lane busy and mints nothing.
    Proves: CV2-06-001, CV2-06-004, CV2-06-014, CV2-14-001"""
    together_acct, single_acct = two_accounts.accounts
    for account in (together_acct, single_acct):
        for r in _deliveries(two_accounts, account):
            materialize.receipt_materialize(receipt_pk=r.pk, account_id=account.pk)
    lanes = list(OrderingLane.objects.filter(account=together_acct).values_list("pk", flat=True))
    minted = advance.lanes_advance(lane_pks=lanes, account_id=together_acct.pk)
    assert len(minted) == 3
    for lane_pk in sorted(OrderingLane.objects.filter(account=single_acct).values_list("pk", flat=True)):
        execution.lane_advance(lane_pk=lane_pk, account_id=single_acct.pk)
    state = _lanes_state(together_acct)
    assert state == _lanes_state(single_acct)
    assert [d[0] for d in state["rec-a"][6]] == ["lower_than_selected"]  # ev-a (position 1) under ev-c (2)
    assert [p[1] for p in state["rec-a"][5]] == ["superseded", "minted"]
    assert advance.lanes_advance(lane_pks=lanes, account_id=together_acct.pk) == []
    assert _lanes_state(together_acct) == state


#: Statements of `lanes_advance` for any number of fresh lanes that each mint, one included (D-295, D-521): BEGIN,
#: the guard, the lanes FOR UPDATE (with their epoch's compared columns), their pending Projections, the
#: generations, the Executions, the lanes, COMMIT.
ADVANCE_TOGETHER = 8


def test_lanes_advance_statement_count_does_not_grow_with_the_lanes(two_accounts, django_assert_max_num_queries):
    """1, 2 and 20 fresh lanes, each with one pending Projection, are advanced with the same, pinned number of
    statements. Proves: CV2-14-001, STYLE R27"""
    account = two_accounts.accounts[0]
    counts = []
    for n in (1, 2, 20):
        receipts = [admit(two_accounts, WEBHOOK, webhook_body(webhook_event(f"a{n}-{i}", f"rec-a{n}-{i}", 1)))
                    for i in range(n)]
        out = materialize.receipts_materialize(receipt_pks=[r.pk for r in receipts], account_id=account.pk)
        with django_assert_max_num_queries(ADVANCE_TOGETHER), CaptureQueriesContext(connection) as seen:
            minted = advance.lanes_advance(lane_pks=out.lanes, account_id=account.pk)
        assert len(minted) == n
        counts.append(len(seen.captured_queries))
    assert counts[0] == counts[1] == counts[2], counts

def test_a_poison_lane_is_split_out_of_its_batch_and_halted_while_the_others_advance(two_accounts, monkeypatch):
    """Four fresh lanes of one account, one of which fails deterministically whenever it is advanced: the lane step
    (`tasks._advance`, the materializer's and the claims task's) splits the failing batch until that lane stands
    alone, halts it with LANE_STEP_FAILED and a StepFailure, and mints an Execution on each of the three others.
    Proves: CV2-13-001, CV2-06-014"""
    from connector.choices import LaneState, StepFailureReason
    from connector.models import StepFailure

    account = two_accounts.accounts[0]
    receipts = [admit(two_accounts, WEBHOOK, webhook_body(webhook_event(f"p{i}", f"rec-p{i}", 1))) for i in range(4)]
    out = materialize.receipts_materialize(receipt_pks=[r.pk for r in receipts], account_id=account.pk)
    poison = sorted(out.lanes)[1]
    real = advance.apply_contract

    def contract(lane, pending, route):
        if lane.pk == poison:
            raise KeyError("test: this lane's route definition lost its ordering key")
        return real(lane, pending, route)

    monkeypatch.setattr(advance, "apply_contract", contract)
    assert tasks._advance(out.lanes, account.pk) == 3
    halted = OrderingLane.objects.get(pk=poison)
    assert (halted.state, halted.halt_reason) == (LaneState.HALTED, StepFailureReason.LANE_STEP_FAILED)
    assert StepFailure.objects.get().entity_id == str(poison)
    assert sorted(OrderingLane.objects.filter(active_execution__isnull=False).values_list("pk", flat=True)) == sorted(
        set(out.lanes) - {poison})



def test_a_claims_step_advances_its_completed_lanes_together(two_accounts, monkeypatch):
    """Two records, each with an execution minted for position 1 and position 2 materialized behind it: the claims
    task runs both executions, then mints both successors in ONE lane transaction (`lanes_advance`, D-398)
    instead of two `lane_advance` tasks, and wakes one claimer for them. Proves: CV2-07-001, CV2-14-001"""
    from celery.app.task import Task

    account = two_accounts.accounts[0]
    for position in (1, 2):
        for record in ("x", "y"):
            receipt = admit(two_accounts, WEBHOOK, webhook_body(webhook_event(f"ev-{record}{position}",
                                                                             f"rec-{record}", position)),
                            account=account)
            materialize.receipt_materialize(receipt_pk=receipt.pk)
        if position == 1:
            for lane in OrderingLane.objects.filter(account_id=account.pk).order_by("pk"):
                execution.lane_advance(lane_pk=lane.pk)
    assert Execution.objects.filter(account_id=account.pk).count() == 2
    sent = []
    monkeypatch.setattr(Task, "apply_async", lambda self, args=None, kwargs=None, **kw: sent.append((self.name, args)))
    with CaptureQueriesContext(connection) as queries:
        assert tasks.execution_claim_and_run(limit=2) == 2
    assert sent == [("connector.tasks.execution_claim_and_run", ())], sent  # no per-lane task, one wake-up
    lane_locks = [q["sql"] for q in queries.captured_queries
                  if "connector_orderinglane" in q["sql"] and "FOR UPDATE" in q["sql"]]
    assert len(lane_locks) == 2, lane_locks  # the result recording's, then the lanes' advance
    rows = Execution.objects.filter(account_id=account.pk).select_related("projection__event").order_by("pk")
    assert [(e.state, e.projection.event.source_event_key) for e in rows] == [
        ("completed", "ev-x1"), ("completed", "ev-y1"), ("ready", "ev-x2"), ("ready", "ev-y2")]
