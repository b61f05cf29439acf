"""Due receipts of one account materialized in one transaction (issue 18 goal 5, D-294): the same rows as one
receipt after the other, a constant number of statements, and a kill inside the shared transaction leaves nothing
of any receipt. On real PostgreSQL, with a real process killed."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from connector import tasks
from connector.models import Event, MaterializationDue, OrderingLane, Projection, Receipt, ReceiptComponent
from connector.services import materialize, materialize_together
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


def test_together_derives_exactly_what_one_receipt_after_the_other_derives(two_accounts):
    """The same five deliveries to two accounts; account 1's are materialized in one transaction
    (`receipts_materialize`), account 2's one receipt after the other (`receipt_materialize`, ascending pk). Every
    Component (ordinal, disposition, conflict reason, its Event), every Event, every lane with its Projections in
    pk order (the lane's last tie-breaker) and the due rows are the same: the first component of a key inserts,
    an identical later one is a duplicate, different bytes are a conflict, across receipts as within one.
    Proves: CV2-05-011, CV2-05-016, CV2-05-017, CV2-05-018, CV2-14-001"""
    together_acct, single_acct = two_accounts.accounts
    together, single = _deliveries(two_accounts, together_acct), _deliveries(two_accounts, single_acct)
    taken, out = materialize_together.receipts_materialize(receipt_pks=[r.pk for r in together],
                                                           account_id=together_acct.pk)
    assert taken == {r.pk for r in together} and out.components == 6 and len(out.events) == 4
    for r in single:
        materialize.receipt_materialize(receipt_pk=r.pk, account_id=single_acct.pk)
    state = _state(together)
    assert state == _state(single)
    assert [c[1] for c in state[2][0]] == ["duplicate_event"] and state[3][0][0][2] == "EVENT_KEY_CONFLICT"
    assert state[-1] == 0
    # materialized: a second pass takes them and derives nothing more
    taken, again = materialize_together.receipts_materialize(receipt_pks=[r.pk for r in together],
                                                             account_id=together_acct.pk)
    assert taken == {r.pk for r in together} and again.components == 0 and _state(together) == state


def test_what_the_together_path_does_not_take_stays_for_the_single_path(two_accounts, monkeypatch, settings):
    """Receipts of another account are not read (each statement names its account); a gate that does not serve
    raises before anything is written, and `materialize_due` then materializes each receipt alone.
    Proves: CV2-05-011, CV2-03-015, CV2-13-001"""
    from connector.errors import GateNotServing

    first, second = two_accounts.accounts
    mine, theirs = _deliveries(two_accounts, first), _deliveries(two_accounts, second)
    taken, _ = materialize_together.receipts_materialize(receipt_pks=[r.pk for r in mine + theirs],
                                                         account_id=first.pk)
    assert taken == {r.pk for r in mine}
    assert MaterializationDue.objects.filter(receipt__in=theirs).count() == 5

    def refuse(**_kwargs):
        raise GateNotServing("test: the gate halts")

    monkeypatch.setattr(materialize_together, "lock_serving", refuse)
    alone = []
    real = materialize.receipt_materialize
    monkeypatch.setattr(materialize, "receipt_materialize", lambda **kw: alone.append(kw["receipt_pk"]) or real(**kw))
    monkeypatch.setattr(tasks.execution_claim_and_run, "delay", lambda *a, **k: None)
    settings.CONNECTOR = {**settings.CONNECTOR, "MATERIALIZE_SLOTS": 1}
    assert tasks.materialize_due(second.pk) == 5
    assert sorted(alone) == sorted(r.pk for r in theirs)
    assert MaterializationDue.objects.count() == 0


#: Statements of `receipts_materialize` for any number of fresh one-event receipts (D-294): BEGIN, the guard, the
#: receipts FOR UPDATE, their done Components, the Events, the Components, the lanes (read, insert), the
#: Projections, the due rows, COMMIT. One receipt alone through `receipt_materialize` is 12 (+ its read before the
#: transaction); 20 receipts one after the other were 20 x 13.
TOGETHER = 11


def test_together_statement_count_does_not_grow_with_the_receipts(two_accounts, django_assert_max_num_queries):
    """2 and 20 fresh receipts (each a new record) are materialized with the same, pinned number of statements.
    Proves: CV2-14-001, STYLE R27"""
    account = two_accounts.accounts[0]
    warm = [admit(two_accounts, WEBHOOK, webhook_body(webhook_event(f"w{i}", f"rec-w{i}", 1))) for i in range(2)]
    materialize_together.receipts_materialize(receipt_pks=[r.pk for r in warm], account_id=account.pk)
    counts = []
    for n in (2, 20):
        receipts = [admit(two_accounts, WEBHOOK, webhook_body(webhook_event(f"e{n}-{i}", f"rec-{n}-{i}", 1)))
                    for i in range(n)]
        with django_assert_max_num_queries(TOGETHER), CaptureQueriesContext(connection) as seen:
            taken, out = materialize_together.receipts_materialize(receipt_pks=[r.pk for r in receipts],
                                                                   account_id=account.pk)
        assert len(taken) == n and out.components == n and len(out.lanes) == n
        counts.append(len(seen.captured_queries))
    assert counts[0] == counts[1], counts
