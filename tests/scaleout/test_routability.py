"""Every hot statement stays on the Citus path (issue 23, docs/scale-out.md, D-240..D-243).

The hot paths run once on a small world (the demo push world: admission over HTTP, materialization, lane advance,
claim, run with completion and outbound authoring, the batched claim, the egress step of claim + permit, marker,
exchange, settlement and finalization); every statement PostgreSQL receives is captured and read by `tests/scaleout/routing.py`
against the placement data of `connector.placement`. The bodies of the hot PL/pgSQL functions are read from
pg_proc and checked the same way. A statement that Citus could not send to one shard fails the test unless it is
listed, with what it would take, in `connector.placement.KNOWN_UNROUTABLE` (only the batched claim's multi-account
shapes, D-503, and the egress step's multi-effect ones, D-531); a listed entry that no longer occurs fails too, so
the list only shrinks. The batched claim over two accounts and the egress step over two effects run once more;
their findings must be exactly `connector.placement.SINGLE_NODE_ONLY` (D-246)."""
from __future__ import annotations

import time
from collections import defaultdict

import pytest
from celery.app.task import Task
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from connector import placement
from tests.scaleout.routing import body_statements, check
from tests.support import whole_seconds


def _capture_into(steps: dict[str, list[str]]):
    def capture(step, fn):
        with CaptureQueriesContext(connection) as q:
            out = fn()
        steps[step] += [x["sql"] for x in q.captured_queries]
        return out
    return capture


def _batch_claims(world, tag: str) -> dict[str, list[str]]:
    """The batched claim over two accounts with ready work, with no claimer group. Returns its statements."""
    from connector.services import execution
    from tests.crash.support import ready_execution

    steps: dict[str, list[str]] = defaultdict(list)
    for account in world.accounts[:2]:
        for i in range(2):
            ready_execution(account.account_key, f"rec-{tag}-{account.pk}-{i}")
    tokens = _capture_into(steps)("batch claim", lambda: execution.execution_claim_batch(holder="route-b", n=4))
    assert len(tokens) == 4 and len({t.account_id for t in tokens}) == 2, tokens
    return steps


def _run_hot_paths(world, receiver_url, settings) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    from connector.models import Receipt
    from connector.services import execution
    from connector.services.materialize import receipt_materialize
    from connector.services.signatures import sign
    from effects.services import worker
    from tests.connector.test_api_admission import admit, body, event, signing_secret
    from tests.crash.support import ready_execution

    settings.CONNECTOR = {**settings.CONNECTOR,
                          "EGRESS_BASE_URL": receiver_url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(2)}
    account = world.accounts[0]
    client = Client()
    steps: dict[str, list[str]] = defaultdict(list)
    capture = _capture_into(steps)

    for n in (1, 2):  # the first pass warms the process caches, as a running worker has them
        if n == 2:
            steps.clear()
        payload = body(event(id=f"e-route-{n}", record_id=f"r-route-{n}"))
        signature = sign(signing_secret(account.account_key), int(time.time()), payload)
        response = capture("admission", lambda: admit(client, payload, f"k-route-{n}", account=account.account_key,
                                                       signature=signature))
        assert response.status_code == 201, response.content
        receipt = Receipt.objects.get(pk=response.json()["receipt"])
        # Each entry point is called as the product calls it: with the account its message or token carries.
        out = capture("materialization", lambda: receipt_materialize(receipt_pk=receipt.pk,
                                                                     account_id=receipt.account_id))
        for lane in out.lanes:
            capture("lane advance", lambda: execution.lane_advance(lane_pk=lane, account_id=out.account_id))
        token = capture("claim", lambda: execution.execution_claim(holder="route", account_id=account.pk))
        done = capture("run, completion, authoring", lambda: execution.execution_run(token=token))
        assert done.state == "completed", done.state
        effect = capture("batched egress", lambda: worker.effect_dispatch_once(  # a batch of one (D-396, D-531)
            holder_name="route-h", account_id=account.pk))
        assert effect.state == "finalized", effect.state
    for i in range(2):  # a claimer given its shard group (one account)
        ready_execution(account.account_key, f"rec-route-batch-{i}")
    tokens = capture("batch claim", lambda: execution.execution_claim_batch(holder="route-b", n=2,
                                                                            account_ids=[account.pk]))
    assert len(tokens) == 2
    single_node = _batch_claims(world, "route")
    steps["batch claim"] += single_node["batch claim"]
    single_node["batched egress"] = _batched_egress(client, account)
    return steps, single_node


def _batched_egress(client, account) -> list[str]:
    """The egress step over two effects of one account (its statements name several effects' children:
    SINGLE_NODE_ONLY, D-396); the hot run above took a batch of one."""
    from connector.services import execution
    from connector.services.materialize import receipt_materialize
    from connector.services.signatures import sign
    from effects.services import worker
    from tests.connector.test_api_admission import admit, body, event, signing_secret

    for i in range(2):
        payload = body(event(id=f"e-route-egress-{i}", record_id=f"r-route-egress-{i}"))
        signature = sign(signing_secret(account.account_key), int(time.time()), payload)
        response = admit(client, payload, f"k-route-egress-{i}", account=account.account_key, signature=signature)
        out = receipt_materialize(receipt_pk=response.json()["receipt"], account_id=account.pk)
        for lane in out.lanes:
            execution.lane_advance(lane_pk=lane, account_id=out.account_id)
        token = execution.execution_claim(holder="route", account_id=account.pk)
        assert execution.execution_run(token=token).state == "completed"
    assert worker.egress_batch_size() > 1
    steps: dict[str, list[str]] = defaultdict(list)
    done = _capture_into(steps)("batched egress", lambda: worker.effect_dispatch_batch(
        n=4, holder_name="route-eb", account_id=account.pk))
    assert sorted(e.state for e in done) == ["finalized", "finalized"], [e.state for e in done]
    return steps["batched egress"]


def _findings(steps: dict[str, list[str]]) -> tuple[set[tuple[str, str, str]], dict]:
    found, examples = set(), {}
    for step, statements in steps.items():
        for sql in statements:
            for f in check(sql).findings:
                key = (step, f.table, f.problem)
                found.add(key)
                examples.setdefault(key, sql)
    return found, examples


@pytest.fixture
def hot_world(transactional_db, monkeypatch):
    from connector.demo import build_world

    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: None)
    return build_world("s-", push=True)


def test_every_hot_statement_is_routable_by_account(hot_world, settings):
    """Each hot statement touches distributed tables only with an equality on their distribution column (or a
    join on it with a pinned co-located table), all on one account, and locks rows only when single-shard;
    exactly the documented exceptions remain. Proves: CV2-14-001 (the hot path scales by account)."""
    from tests.effects.receiver import Receiver

    receiver = Receiver().start()
    try:
        steps, single_node = _run_hot_paths(hot_world, receiver.url, settings)
    finally:
        receiver.stop()
    assert set(steps) == set(placement.HOT_STEPS) - set(placement.SINGLE_NODE_STEPS), sorted(steps)
    found, examples = _findings(steps)
    known = set(placement.KNOWN_UNROUTABLE)
    assert {k[0] for k in known} == {"batch claim", "batched egress"}, (
        "only the batched claim's multi-account shapes (D-503) and the egress step's multi-effect ones (D-531)")
    new = sorted(found - known)
    assert not new, "unroutable hot statements:\n" + "\n".join(f"{k}\n    {examples[k][:400]}" for k in new)
    assert not sorted(known - found), f"listed as unroutable but routable now (remove them): {sorted(known - found)}"
    # The batched claim over two accounts has exactly its four multi-account shapes (D-246) and the batched egress
    # step over two effects its four multi-effect ones (D-396), no other.
    single_found, single_examples = _findings(single_node)
    assert single_found == set(placement.SINGLE_NODE_ONLY), (
        sorted(single_found ^ set(placement.SINGLE_NODE_ONLY)),
        {k: single_examples[k][:300] for k in single_found - set(placement.SINGLE_NODE_ONLY)})
    locked = {t for sqls in steps.values() for sql in sqls for t in check(sql).reference_locks}
    assert locked == placement.REFERENCE_ROW_LOCKS, locked
    touched = {t for sqls in steps.values() for sql in sqls for t in check(sql).pinned_via_parent}
    hot_children = {t for t, p in placement.distributed().items() if p.backfill and p.hot}
    assert touched <= hot_children, touched - hot_children


def test_the_hot_functions_bodies_are_routed_by_their_account_argument(db):
    """The statements inside connector_receipt_admit and connector_lock_serving (read from pg_proc, as installed)
    are each pinned to the account argument; the one advisory lock is the gate's. Proves: CV2-14-001"""
    with connection.cursor() as cursor:
        for name, routine in placement.ROUTINES.items():
            cursor.execute("SELECT prosrc, proargnames FROM pg_proc WHERE proname = %s", [name])
            (source, args), = cursor.fetchall()
            assert routine.distribution_arg in args, (name, args)
            statements = body_statements(source, routine.account_names)
            assert len(statements) >= 3, statements
            for sql in statements:
                verdict = check(sql)
                assert verdict.routable, (name, sql, [str(f) for f in verdict.findings])


@pytest.mark.parametrize("routine, pinned, unpinned", [
    ("connector_receipt_admit", "k.account_id = account_pk", "k.channel = p_channel"),
    ("connector_lock_serving", "FROM connector_accountservinggate g WHERE g.account_id = p_account FOR SHARE",
     "FROM connector_accountservinggate g WHERE g.mode = 'v2_serving' FOR SHARE"),
])
def test_a_function_body_that_loses_its_account_filter_is_refused(db, routine, pinned, unpinned):
    """The installed body with one account filter replaced (as a careless edit of the migration would) has a
    finding: the body check reads what is installed, statement by statement."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", [routine])
        (source,), = cursor.fetchall()
    assert pinned in source
    broken = source.replace(pinned, unpinned, 1)
    findings = [f for sql in body_statements(broken, placement.ROUTINES[routine].account_names)
                for f in check(sql).findings]
    assert any(f.problem in ("unpinned", "row lock not single-shard") for f in findings), findings


@pytest.mark.parametrize("sql, problem", [
    ('SELECT "connector_receipt"."id" FROM "connector_receipt" WHERE "connector_receipt"."id" = 5', "unpinned"),
    ('SELECT "connector_receipt"."id" FROM "connector_receipt" WHERE ("connector_receipt"."account_id" = 1 '
     'OR "connector_receipt"."id" = 5)', "unpinned"),
    ('SELECT "connector_receipt"."id" FROM "connector_receipt" WHERE (("connector_receipt"."account_id" = 1 AND '
     '"connector_receipt"."id" = 5) OR "connector_receipt"."id" = 6)', "unpinned"),
    ('SELECT "connector_receipt"."id" FROM "connector_receipt" WHERE "connector_receipt"."account_id" IN (1, 2)',
     "unpinned"),
    ('SELECT "connector_execution"."id" FROM "connector_execution" WHERE "connector_execution"."state" = \'ready\' '
     'LIMIT 1 FOR UPDATE SKIP LOCKED', "row lock not single-shard"),
    ('SELECT "connector_receipt"."id" FROM "connector_receipt" INNER JOIN "connector_event" ON '
     '("connector_event"."receipt_id" = "connector_receipt"."id") WHERE "connector_receipt"."account_id" = 1',
     "unpinned"),
    ('SELECT "connector_event"."id" FROM "connector_event" INNER JOIN "connector_receipt" ON '
     '("connector_event"."receipt_id" = "connector_receipt"."id") WHERE ("connector_event"."account_id" = 1 AND '
     '"connector_receipt"."account_id" = 2)', "two distribution values"),
    ('INSERT INTO "connector_event" ("account_id", "route") SELECT * FROM unnest(\'{1,2}\'::bigint[], '
     '\'{a,b}\'::varchar[])', "two distribution values"),
    ('INSERT INTO "connector_event" ("account_id", "route") SELECT u.c0, $1::varchar FROM unnest($2::bigint[]) '
     'AS u(c0) RETURNING "id"', "unpinned"),
    ('SELECT * FROM "connector_brand_new_table" WHERE "connector_brand_new_table"."id" = 1', "no placement"),
    ('SELECT "connector_receipt"."id" FROM "connector_receipt", "connector_event" WHERE '
     '"connector_receipt"."account_id" = 1', "reference not recognised"),
    ("SELECT s.* FROM unnest('{1,2}'::bigint[]) AS a(account_id) CROSS JOIN LATERAL "
     "connector_lock_serving(a.account_id, 2) AS s", "routine called without one constant account"),
])
def test_the_checker_refuses_unscoped_statements(sql, problem):
    """Crafted statements that Citus could not route to one shard are findings: no account filter, an account
    filter under OR, several accounts, an unpinned row lock, an unpinned joined table, an unknown table, a table
    the checker cannot read as a reference (fail closed) and the guard function over a set of accounts."""
    assert problem in [f.problem for f in check(sql).findings], [str(f) for f in check(sql).findings]


@pytest.mark.parametrize("sql", [
    'SELECT "connector_receipt"."id" FROM "connector_receipt" WHERE ("connector_receipt"."account_id" = 1 AND '
    '"connector_receipt"."id" = 5) FOR UPDATE OF "connector_receipt"',
    'SELECT "connector_event"."id" FROM "connector_event" INNER JOIN "connector_receipt" ON '
    '("connector_event"."account_id" = "connector_receipt"."account_id") WHERE "connector_receipt"."account_id" = 3',
    'INSERT INTO "connector_receiptcomponent" ("receipt_id", "ordinal") VALUES (7, 0), (7, 1)',
    'INSERT INTO "connector_event" ("account_id", "route") SELECT $1::bigint, u.c1 FROM unnest($2::varchar[]) '
    'AS u(c1) RETURNING "id"',
    "SELECT * FROM connector_lock_serving(1, 2)",
])
def test_the_checker_accepts_single_shard_statements(sql):
    """The same shapes pinned to one account (or one parent row) are routable."""
    assert check(sql).routable, [str(f) for f in check(sql).findings]
