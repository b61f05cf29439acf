"""Account flatness of the inbound hot path (issue 18 goal 7): it never loads a ServingEpoch's preimage (D-251),
and a worker serving many accounts compiles each route once per epoch, not once per account (D-252).

The preimage grows with the service (about 1.2 KB per account: 12 MB at 10,000 accounts, 60 MB at 50,000), so
one statement that selects it makes every event's cost grow with the number of accounts, the defect CV2-14-011
forbids for history. Every guard compares only the epoch's id, state and digest (connector_lock_serving, migration
0012); a step that needs the epoch's profile reads it with the preimage deferred.

The test records the SQL of every statement one event's whole chain sends, on the application and the journal
connections, from a cold process (the in-process route and definition caches filled on the way, as a worker's
first event fills them): signed HTTP admission, materialization, lane advance, a single claim with Runtime (with
outbound authoring: the world's route pushes), ApplicationResult and completion; then a second event through the
batched claim. No statement may name the `preimage` column. Breaking it (the Runtime reading its epoch with
`.first()` and no `.only()`, or `lane_advance` reading the relocked lane's `.epoch`) fails it:
docs/decisions/admission.md D-251.
"""
from __future__ import annotations

import re
import time
from contextlib import ExitStack

import pytest
from celery.app.task import Task
from django.db import connections
from django.test import Client

from connector.demo import build_world
from connector.models import Receipt, ServingEpoch
from connector.services import execution
from connector.services.materialize import receipt_materialize
from connector.services.signatures import sign
from tests.connector.test_api_admission import admit, body, event, signing_secret

_PREIMAGE = re.compile(r"\bpreimage\b", re.IGNORECASE)


class _Statements:
    """Every statement sent on the `default` and `journal` connections inside the block, with its SQL text."""

    def __init__(self) -> None:
        self.sql: list[str] = []
        self._stack = ExitStack()

    def _record(self, execute, sql, params, many, context):
        self.sql.append(sql)
        return execute(sql, params, many, context)

    def __enter__(self) -> _Statements:
        for alias in ("default", "journal"):
            self._stack.enter_context(connections[alias].execute_wrapper(self._record))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def loading_preimage(self) -> list[str]:
        return [sql for sql in self.sql if _PREIMAGE.search(sql)]


@pytest.fixture
def push_world(transactional_db, monkeypatch):
    """The demo world with a pushing route (Runtime authors outbound commands under the guard); wake-ups are
    dropped instead of reaching the broker (each step is run explicitly)."""
    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: None)
    return build_world("pi-", push=True)


def _admit_and_advance(client: Client, account: str, n: int) -> int:
    payload = body(event(id=f"e-pre-{n}", record_id=f"r-pre-{n}"))
    response = admit(client, payload, f"k-pre-{n}", account=account,
                     signature=sign(signing_secret(account), int(time.time()), payload))
    assert response.status_code == 201, response.content
    out = receipt_materialize(receipt_pk=Receipt.objects.get(pk=response.json()["receipt"]).pk)
    assert out is not None and len(out.lanes) == 1
    (lane_pk,) = out.lanes
    minted = execution.lane_advance(lane_pk=lane_pk)
    assert minted is not None
    return minted.pk


def test_inbound_chain_never_loads_the_epoch_preimage(push_world):
    """One event's whole inbound chain (HTTP admission, materialization, lane advance, claim, Runtime with
    outbound authoring, ApplicationResult, completion), single and batched claim, from a cold process: no
    statement selects the ServingEpoch preimage, whose size grows with the number of accounts in the service.
    Proves: CV2-14-011 (hot-path work independent of the size of what is retained: here, the service's accounts),
    CV2-14-001 (capacity of the hot path)."""
    from connector.selectors import routes

    account = push_world.accounts[0]
    client = Client()
    routes.clear_caches()  # a cold worker: the first event fills the route and mapping caches
    with _Statements() as seen:
        first = _admit_and_advance(client, account.account_key, 1)
        done = execution.execution_claim_and_run(holder="preimage-test", lease_seconds=60)
        assert done is not None and done.pk == first and done.state == "completed", done and done.state
        second = _admit_and_advance(client, account.account_key, 2)
        tokens = execution.execution_claim_batch(holder="preimage-test", n=4, account_ids=[account.pk])
        assert [t.execution_pk for t in tokens] == [second]
        assert execution.execution_run(token=tokens[0]).state == "completed"
    assert len(seen.sql) > 40, "the chain ran its statements through the recorded connections"
    assert seen.loading_preimage() == []

    # The detector itself: a whole-row read of the epoch (what the chain used to send) is caught.
    with _Statements() as control:
        ServingEpoch.objects.filter(pk=push_world.active_epoch.pk).first()
    assert len(control.loading_preimage()) == 1


def test_a_compiled_route_serves_every_account_of_the_epoch(push_world):
    """The compiled route program is cached by the exact epoch (digest and pk) and channel, not per account: a
    second account's first route lookup costs one statement (which routes it enables), never another definition
    reread and compile, so a worker serving many accounts does not rebuild the program per account (D-252).
    A channel the account does not enable still finds nothing; another digest is another cache entry.
    Proves: CV2-14-011 (hot-path work independent of the size of the service), CV2-02-026 (exact route through
    the frozen epoch only)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from connector.selectors import routes
    from connector.selectors.routes import ChannelNotFound, route_for

    epoch = push_world.active_epoch
    first, second = push_world.accounts[:2]
    routes.clear_caches()
    program = route_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), account_id=first.pk,
                        channel="records.webhook")
    with CaptureQueriesContext(connection) as queries:
        other = route_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), account_id=second.pk,
                          channel="records.webhook")
    assert other is program
    assert [("serviceconfigurationaccount" in q["sql"]) for q in queries.captured_queries] == [True]
    with CaptureQueriesContext(connection) as queries:
        route_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), account_id=second.pk,
                  channel="records.webhook")
    assert queries.captured_queries == []
    with pytest.raises(ChannelNotFound):
        route_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), account_id=second.pk, channel="not.enabled")
    with CaptureQueriesContext(connection) as queries:  # another digest is another key: never served from this one
        route_for(epoch_pk=epoch.pk, epoch_digest=b"\x00" * 32, account_id=second.pk, channel="records.webhook")
    assert queries.captured_queries


def test_bench_accounts_check_reads_its_budget(tmp_path):
    """`bench accounts --check` takes its limit from bench/budgets.json's "accounts" section, which holds the
    goal itself (1.2: the measured figure meets it, D-253); without the section the goal is the default.
    Proves: CV2-14-011 (the flatness bound is declared and checked)."""
    import json

    from bench import accounts_ratio_limit, load_budgets

    assert load_budgets()["accounts"]["max_p50_ratio"] == pytest.approx(1.2)
    assert accounts_ratio_limit(default=9.0) == pytest.approx(1.2)
    path = tmp_path / "budgets.json"
    path.write_text(json.dumps({"history": {"max_p50_admission_ratio": 1.2}}))
    assert accounts_ratio_limit(default=1.5, path=path) == 1.5
    path.write_text(json.dumps({"accounts": {"max_p50_ratio": 1.1}}))
    assert accounts_ratio_limit(default=1.5, path=path) == pytest.approx(1.1)
