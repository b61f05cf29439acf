"""Entry points carry the account with their key (issue 23, docs/scale-out.md, D-244, D-245).

The routability test calls every hot step as the product calls it, with the account. These tests prove the other
side: a step called the old way (a task message from before the upgrade, without the account) still works and is
what the routability checker refuses, so the test would fail if a product caller stopped passing the account; an
account that is not the row's finds nothing (the filter is real); and the admission hint's account pk per key is
forgotten when its gate row is gone."""
from __future__ import annotations

import pytest
from celery.app.task import Task
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.scaleout.routing import check


@pytest.fixture
def world(transactional_db, monkeypatch):
    from connector.demo import build_world

    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: None)
    return build_world("ep-", push=True)


def _admit(account, n: int):
    from connector.actors import Actor
    from connector.demo import DEMO_CHANNEL, demo_event_body
    from connector.services.admission import receipt_admit

    return receipt_admit(account_key=account.account_key, channel=DEMO_CHANNEL, transport_key=f"k-ep-{n}",
                         body=demo_event_body(f"ep-{n}"), actor=Actor.system("entry-points-test")).receipt


def _findings(statements: list[str]) -> set[tuple[str, str]]:
    return {(f.table, f.problem) for sql in statements for f in check(sql).findings}


def test_a_task_message_without_the_account_still_works_and_is_what_the_checker_refuses(world):
    """The old message shape (`receipt_materialize(pk)`, `lane_advance(pk)`) materializes and mints as before, and
    its first reads are exactly the unpinned statements the routability test would report; the new shape (the
    account as second argument) has none. Proves: CV2-14-001, CV2-05-017"""
    from connector import tasks
    from connector.models import Execution, MaterializationDue, OrderingLane

    account = world.accounts[0]
    old, new = _admit(account, 1), _admit(account, 2)
    with CaptureQueriesContext(connection) as old_calls:
        tasks.receipt_materialize(old.pk)
        for lane in OrderingLane.objects.filter(account=account).values_list("pk", flat=True):
            tasks.lane_advance(lane)
    assert not MaterializationDue.objects.filter(receipt_id=old.pk).exists()
    assert {("connector_receipt", "unpinned"), ("connector_orderinglane", "unpinned")} <= _findings(
        [q["sql"] for q in old_calls.captured_queries])
    minted = Execution.objects.count()
    assert minted >= 1
    with CaptureQueriesContext(connection) as new_calls:
        tasks.receipt_materialize(new.pk, account.pk)
        for lane in OrderingLane.objects.filter(account=account).values_list("pk", flat=True):
            tasks.lane_advance(lane, account.pk)
    assert not MaterializationDue.objects.filter(receipt_id=new.pk).exists()
    assert Execution.objects.count() > minted
    statements = [q["sql"] for q in new_calls.captured_queries]
    assert _findings(statements) == set(), [s[:300] for s in statements if check(s).findings]


def test_an_entry_point_given_another_account_finds_nothing(world):
    """The account a message carries is a filter, not a label: another account's id finds no row and writes
    nothing. Proves: CV2-14-001"""
    from connector.models import MaterializationDue, Receipt
    from connector.services import execution
    from connector.services.materialize import receipt_materialize

    account, other = world.accounts[0], world.accounts[1]
    receipt = _admit(account, 3)
    with pytest.raises(Receipt.DoesNotExist):
        receipt_materialize(receipt_pk=receipt.pk, account_id=other.pk)
    assert MaterializationDue.objects.filter(receipt_id=receipt.pk).exists()
    out = receipt_materialize(receipt_pk=receipt.pk, account_id=account.pk)
    assert out.account_id == account.pk and out.lanes
    from connector.models import OrderingLane

    with pytest.raises(OrderingLane.DoesNotExist):
        execution.lane_advance(lane_pk=next(iter(out.lanes)), account_id=other.pk)


def test_the_admission_hint_reads_the_gate_by_the_account_and_forgets_a_vanished_pk(world,
                                                                                   django_assert_num_queries):
    """A warm hint is one statement, the gate read by the account pk (routable); a pk whose gate row is gone is
    forgotten and the key resolved again. Proves: CV2-14-001, CV2-03-016"""
    from connector.models import AccountServingGate
    from connector.services import admission

    account = world.accounts[0]
    admission._ACCOUNT_PKS.pop(account.account_key, None)
    with django_assert_num_queries(2):  # cold: the key (reference table), then the gate by account
        hint = admission.admission_hint_get(account.account_key)
    assert hint.account_pk == account.pk
    with django_assert_num_queries(1) as warm:
        assert admission.admission_hint_get(account.account_key) == hint
    (sql,) = [q["sql"] for q in warm.captured_queries]
    assert "connector_accountservinggate" in sql and check(sql).routable, sql
    admission._ACCOUNT_PKS[account.account_key] = 10**9  # a pk with no gate (a deleted world's)
    assert admission.admission_hint_get(account.account_key) == hint
    assert admission._ACCOUNT_PKS[account.account_key] == account.pk
    assert AccountServingGate.objects.filter(account=account).exists()
