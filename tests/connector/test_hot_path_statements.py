"""Pinned statement counts of the inbound hot path (STYLE R27, issue 18; docs/benchmarks.md, issue 18 section).

Each step runs in its own real transaction (a transactional test), as in production, so no step reuses another's
locks. The counted event is the second of the process: a first one warms the in-process caches of immutable facts
(routes, the Runtime's frozen definitions; STYLE R30), as a running worker has them. Statements are what
Django's connection records, BEGIN and COMMIT included. The ceilings are the counts measured after issue 18's
first slice; `before` is the same test on the code before it (the serving guard in six statements per call, each
call of a transaction locking again, the admitted receipt's epoch read back with its preimage):

| step | before | after |
| --- | --- | --- |
| HTTP admission of a new one-event receipt (`POST .../receipts`, signed) | 19 | 13 |
| `receipt_materialize` of that receipt | 21 | 16 |
| one `execution_claim_and_run` (claim, Runtime, result, completion) | 36 | 26 |
| one `execution_claim_batch` of up to n Executions over any number of accounts (D-204) | n `execution_claim` calls of 7 each (candidates, BEGIN, guard, lock, Attempt, lease, COMMIT) | 5 |
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

HTTP_ADMISSION = 13
MATERIALIZATION = 16
EXECUTION = 26


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
