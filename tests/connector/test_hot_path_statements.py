"""Pinned statement counts of the inbound hot path (STYLE R27, issue 18; docs/benchmarks.md, issue 18 section).

Each step runs in its own real transaction (a transactional test), as in production, so no step reuses another's
locks. The counted event is the second of the process: a first one warms the in-process caches of immutable facts
(routes, the Runtime's frozen definitions; STYLE R30), as a running worker has them. Statements are what
Django's connection records, BEGIN and COMMIT included. The ceilings are the counts measured after issue 18's
first slice and (materialization) of its set-based materialization (D-217); `before` is the same test on the code
before each (the serving guard in six statements per call, each call of a transaction locking again, the admitted
receipt's epoch read back with its preimage; materialization with a savepoint per Event and per new lane):

| step | before | after |
| --- | --- | --- |
| HTTP admission of a new one-event receipt (`POST .../receipts`, signed) | 19 | 13 |
| the same after issue 18 goal 1 (D-201..D-203): one hint read + `connector_receipt_admit` | 13 | 2 |
| the same with the process's verified hint (D-297): `connector_receipt_admit` only | 2 | 1 |
| `receipt_materialize` of that receipt | 21, then 16 | 12 |
| one `execution_claim_and_run` (claim, Runtime, result, completion) | 36 | 26 |
| the same after issue 23 (D-244: result recording reuses the projection it read before the lock) | 26 | 25 |
| one `execution_claim_batch` of up to n Executions over any number of accounts (D-204) | n `execution_claim` calls of 7 each (candidates, BEGIN, guard, lock, Attempt, lease, COMMIT) | 5 |
| one `execution_claim_batch_and_run` worker step of n Executions: claim, Runtime, completion (D-254..D-256) | 5 + 19n (24 for n = 1, 195 for n = 10) | 18 for any n |
| the same worker step on a route that pushes outbound (D-293, D-296) | 25 for n = 1, 196 for n = 10 (per-command path) | 23 for any n (19 + 6 per applied change with D-293 alone) |
"""
from __future__ import annotations

import time

import pytest
from celery.app.task import Task
from django.test import Client

from connector.demo import build_world
from connector.models import Receipt
from connector.services import execution
from connector.services.materialize import receipt_materialize
from connector.services.signatures import sign
from tests.connector.test_api_admission import admit, body, event, signing_secret

HTTP_ADMISSION = 1
MATERIALIZATION = 12
EXECUTION = 25


@pytest.fixture
def hot_world(transactional_db, monkeypatch):
    """The demo world; wake-ups are dropped instead of reaching the broker (each step is run explicitly)."""
    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: None)
    return build_world("h-")


def _one_event(client: Client, account: str, n: int, assert_max_num_queries=None) -> None:
    """Admit, materialize, advance and run one event; the three hot steps within their ceilings if given."""
    def within(ceiling):
        if assert_max_num_queries is None:
            from contextlib import nullcontext
            return nullcontext()
        return assert_max_num_queries(ceiling)

    payload = body(event(id=f"e-hot-{n}", record_id=f"r-hot-{n}"))
    signature = sign(signing_secret(account), int(time.time()), payload)
    with within(HTTP_ADMISSION):
        response = admit(client, payload, f"k-hot-{n}", account=account, signature=signature)
    assert response.status_code == 201, response.content
    receipt = Receipt.objects.get(pk=response.json()["receipt"])
    with within(MATERIALIZATION):
        out = receipt_materialize(receipt_pk=receipt.pk)
    assert out is not None and out.lanes
    for lane_pk in out.lanes:
        execution.lane_advance(lane_pk=lane_pk)
    with within(EXECUTION):
        done = execution.execution_claim_and_run(holder="hot-path-test", lease_seconds=60)
    assert done is not None and done.state == "completed", done and done.state


def test_inbound_hot_path_statement_counts(hot_world, django_assert_max_num_queries):
    """Admission over HTTP, materialization and one execution claim+run+completion each stay within their
    measured statement count. Proves: CV2-14-001 (capacity of the hot path), STYLE R27."""
    account = hot_world.accounts[0].account_key
    client = Client()
    _one_event(client, account, 1)
    _one_event(client, account, 2, django_assert_max_num_queries)


#: Statements of `receipt_materialize` for a receipt of fresh events on fresh records (issue 18, goal 2; D-217),
#: BEGIN and COMMIT included: 12 for 1, 2 and 100 events. Before the set-based materialization (main at cfc1d42,
#: same test) it was 16 for one event, 25 for two and 907 for 100 (9 more per event).
BATCH_MATERIALIZATION = 12


def _batch_materialize_statements(account: str, tag: str, events: int) -> tuple[int, object, list[str]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench.hot_client import batch_body
    from connector.actors import Actor
    from connector.demo import DEMO_CHANNEL
    from connector.services.admission import receipt_admit

    admission = receipt_admit(account_key=account, channel=DEMO_CHANNEL, transport_key=f"k-{tag}",
                              body=batch_body(tag, events), actor=Actor.system("hot-path-test"))
    with CaptureQueriesContext(connection) as captured:
        out = receipt_materialize(receipt_pk=admission.receipt.pk)
    assert len(out.events) == events and len(out.lanes) == events
    return len(captured.captured_queries), admission.receipt, [q["sql"] for q in captured.captured_queries]


def test_batch_receipt_materialization_statements_do_not_grow_with_events(hot_world):
    """Materializing a 100-event receipt takes the same number of statements as a 2-event one, within the
    measured ceiling: Events, Components, lanes and Projections are one statement each for the whole receipt.
    Proves: CV2-14-001 (capacity of the hot path), CV2-05-011 (children derived from the receipt), STYLE R27/R31."""
    from connector.models import Event, Projection, ReceiptComponent

    account = hot_world.accounts[0].account_key
    _batch_materialize_statements(account, "warm", 2)  # route cache, as a running worker has it
    small, _, _ = _batch_materialize_statements(account, "small", 2)
    large, receipt, statements = _batch_materialize_statements(account, "large", 100)
    assert large == small, (small, large)
    assert large <= BATCH_MATERIALIZATION, large
    # The set-based inserts run on a server-binding cursor (D-261): it is counted like any other cursor.
    inserts = [sql.split(" (")[0] for sql in statements if sql.startswith("INSERT INTO")]
    assert inserts == ['INSERT INTO "connector_event"', 'INSERT INTO "connector_receiptcomponent"',
                       'INSERT INTO "connector_orderinglane"', 'INSERT INTO "connector_projection"'], inserts
    components = list(ReceiptComponent.objects.filter(receipt=receipt).order_by("ordinal")
                      .values_list("ordinal", "disposition", "event__source_event_key"))
    assert components == [(i, "event", f"bench-ev-large-{i}") for i in range(100)]
    assert Projection.objects.filter(event__receipt=receipt, lane_status="pending").count() == 100
    assert Event.objects.filter(receipt=receipt).count() == 100


BATCH_CLAIM = 5  # candidates, BEGIN, every account's guard, lease CAS + Attempts, COMMIT (D-204)


def test_batch_claim_statement_count_does_not_grow_with_the_batch(hot_world, django_assert_max_num_queries):
    """One `execution_claim_batch` (candidates, the guard of every account involved, the lease CAS with its
    Attempts) runs a fixed number of statements however many Executions and accounts it claims: 2 from one
    account and 8 from two accounts cost the same. Proves: CV2-14-001, CV2-14-010, STYLE R27, R31"""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.crash.support import ready_execution

    first, second = hot_world.accounts[:2]
    for i in range(4):
        ready_execution(first.account_key, f"rec-b{i}")
        ready_execution(second.account_key, f"rec-c{i}")
    with CaptureQueriesContext(connection) as small:
        tokens = execution.execution_claim_batch(holder="pin", n=2, account_ids=[first.pk])
    assert len(tokens) == 2
    with django_assert_max_num_queries(BATCH_CLAIM), CaptureQueriesContext(connection) as large:
        tokens = execution.execution_claim_batch(holder="pin", n=8)
    assert len(tokens) == 6
    assert len(large.captured_queries) == len(small.captured_queries)


#: Statements of one `execution_claim_batch_and_run` step of n Executions on the batch path (D-254..D-256), BEGIN and
#: COMMIT included, for n = 1 and n = 10 alike: the claim (5), the claimed Executions (1, shared by both batches),
#: Runtime's batch (BEGIN, stored results, CrmRecords FOR UPDATE, changes + ApplicationResults, COMMIT: 5; the
#: epochs named are cached by exact digest), the completion batch (result receipts read back 1, BEGIN, every
#: account's guard, lanes FOR UPDATE, Executions FOR UPDATE, completions + audit + lanes, COMMIT: 7). Before (the
#: one-by-one run, as on main at 8953204, removed by D-503): 5 + 19 per Execution (24 for n = 1, 195 for n = 10).
BATCH_RUN = 18


def test_batch_run_statement_count_does_not_grow_with_the_batch(hot_world, django_assert_max_num_queries):
    """One worker step claiming and running 1 Execution and one claiming and running 10 (over two accounts) run
    the same, pinned, number of statements: claim, Runtime and completion are each a constant number of
    statements for the batch. Proves: CV2-14-001, CV2-14-010, STYLE R27, R31"""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.crash.support import ready_execution

    first, second = hot_world.accounts[:2]
    ready_execution(first.account_key, "rec-warm")
    assert len(execution.execution_claim_batch_and_run(holder="pin", n=1)) == 1  # warms the route caches
    ready_execution(first.account_key, "rec-one")
    for i in range(5):
        ready_execution(first.account_key, f"rec-d{i}")
        ready_execution(second.account_key, f"rec-e{i}")
    with CaptureQueriesContext(connection) as small:
        done = execution.execution_claim_batch_and_run(holder="pin", n=1, account_ids=[first.pk])
    assert [e.state for e in done] == ["completed"]
    with django_assert_max_num_queries(BATCH_RUN), CaptureQueriesContext(connection) as large:
        done = execution.execution_claim_batch_and_run(holder="pin", n=10)
    assert len(done) == 10 and {e.state for e in done} == {"completed"}
    assert len(large.captured_queries) == len(small.captured_queries)



#: The same worker step on a route that pushes outbound (D-293): the batch path above, + 1 for the guard of the
#: pushing accounts (one statement for all of them, before the CrmRecords), + the outbound commands of every
#: applied change, set-based (D-296): the slots' RemoteLinks, the existing commands, the commands, their
#: RemoteEffects (4 for any n). Before: the per-command path for every pushing route (25 for n = 1, 196 for 10),
#: then D-293 alone (19 + 6 per applied change: two reads, SAVEPOINT, two inserts, RELEASE).
BATCH_RUN_PUSH_BASE = BATCH_RUN + 1 + 4
BATCH_RUN_PUSH_PER_COMMAND = 0


def test_batch_run_of_a_pushing_route_statement_count(transactional_db, monkeypatch,
                                                      django_assert_max_num_queries):
    """A worker step of 1 and of 10 Executions of a pushing route over two accounts: the batch's constant
    statements, the guard once, the set-based authoring's four, pinned: the same for 1 and for 10.
    Proves: CV2-14-001, CV2-10-005, STYLE R27"""
    from tests.crash.support import ready_execution

    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: None)
    world = build_world("hp-", push=True)
    first, second = world.accounts[:2]
    ready_execution(first.account_key, "rec-warm")
    ready_execution(second.account_key, "rec-warm")
    assert len(execution.execution_claim_batch_and_run(holder="pin", n=2)) == 2  # warms both accounts' caches
    ready_execution(first.account_key, "rec-one")
    for i in range(5):
        ready_execution(first.account_key, f"rec-d{i}")
        ready_execution(second.account_key, f"rec-e{i}")
    for n, accounts in ((1, [first.pk]), (10, None)):
        with django_assert_max_num_queries(BATCH_RUN_PUSH_BASE + n * BATCH_RUN_PUSH_PER_COMMAND):
            done = execution.execution_claim_batch_and_run(holder="pin", n=n, account_ids=accounts)
        assert len(done) == n and {e.state for e in done} == {"completed"}
