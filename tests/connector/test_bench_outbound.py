"""`manage.py bench outbound` (issue 20, goals 1 and 3; D-340..D-343): a tiny run of both phases on the test
database counts the effects the real dispatch loop finalized and the baseline jobs done, and the receiver's
accounting finds a duplicate POST and a lost effect; `--check` enforces floors equal to the issue's goals.
Proves: CV2-14-002 (the bench's figures are measured, on PostgreSQL)."""
from __future__ import annotations

import os

import httpx
import psycopg
import pytest
from django.conf import settings
from django.db import connections

from bench import load_budgets
from bench.hot_pool import _conninfo
from bench.hot_raw import peer_schema_apply
from bench.outbound import (
    _accounting,
    _world,
    author_effects,
    check_report,
    receiver_accounting,
    run_phase,
    seed_baseline,
    summarize,
)
from tests.effects.receiver import Receiver
from tests.support import whole_seconds

pytestmark = pytest.mark.usefixtures("administrator")

DB = {"transaction": True, "databases": ["default", "journal"]}


def test_receiver_accounting_counts_duplicates_and_lost_keys():
    """A key requested twice is one duplicate key and one duplicate request; a key recorded done that never
    arrived and a key that arrived but is recorded open are each lost; a key neither done nor open (never
    authored) that arrived is lost too."""
    requests = [{"key": k} for k in ("a", "b", "b", "c", "d", "x")]
    out = receiver_accounting(requests, done_keys={"a", "b", "c", "z"}, open_keys={"d"})
    assert out["duplicate_keys"] == 1 and out["duplicate_requests"] == 1, out
    assert out["done_not_received"] == 1 and out["received_not_done"] == 2 and out["lost"] == 3, out
    assert out["requests"] == 6 and out["keys_received"] == 5 and out["done"] == 4, out
    clean = receiver_accounting([{"key": "a"}, {"key": "b"}], done_keys={"a", "b"}, open_keys={"c"})
    assert clean["duplicate_keys"] == clean["lost"] == 0, clean


def _report(rate_ratio_product: float, cpu_product: float, window: float = 21.0) -> dict:
    phases = [{"kind": "product", "count": int(rate_ratio_product * 100 * window), "seconds": window,
               "per_second": rate_ratio_product * 100,
               "cpu": {"workers_ms": cpu_product * rate_ratio_product * 100 * window, "backends_ms": 0.0,
                       "per_completion_ms": {"busy_ms": cpu_product}}},
              {"kind": "baseline", "count": 100 * int(window), "seconds": window, "per_second": 100.0,
               "cpu": {"workers_ms": 1.0 * 100 * int(window), "backends_ms": 0.0,
                       "per_completion_ms": {"busy_ms": 1.0}}}]
    for phase in phases:
        phase["window_cut_by_drain"] = window < 20
    report = {"seconds": 20.0 if window >= 20 else window, "phases": phases,
              "receiver": {"product": {"duplicate_keys": 0, "lost": 0}}}
    report.update(summarize(report))
    return report


def test_check_uses_floors_equal_to_the_issue_goals():
    """bench/budgets.json "outbound" holds the issue's goals (0.5x the baseline's rate, 3x its CPU per job, 20 s
    phases); a report just inside passes, one just outside each goal fails naming it, duplicates or a lost effect
    fail, and windows shorter than 20 s or cut by a drained backlog fail."""
    budget = load_budgets()["outbound"]
    assert (budget["min_effects_over_baseline"], budget["max_cpu_over_baseline"], budget["min_phase_seconds"]) \
        == (0.5, 3.0, 20)
    assert check_report(_report(0.51, 2.9), budget) == []
    slow = check_report(_report(0.49, 2.9), budget)
    assert len(slow) == 1 and "goal 1" in slow[0], slow
    costly = check_report(_report(0.51, 3.1), budget)
    assert len(costly) == 1 and "goal 3" in costly[0], costly
    short = check_report(_report(0.51, 2.9, window=5.0), budget)
    assert len(short) == 3 and "windows of 5.0 s" in short[0] and all("drained" in f for f in short[1:]), short
    twice = _report(0.6, 1.0)
    twice["receiver"]["product"] = {"duplicate_keys": 1, "lost": 2}
    assert len(check_report(twice, budget)) == 2


@pytest.mark.django_db(**DB)
def test_tiny_run_counts_finalized_effects_baseline_jobs_and_a_duplicate():
    """6 effects authored through the outbound author, 1 egress process for a 2 s window: every effect is
    finalized, counted in the window, and its key reached the receiver once; 5 baseline jobs: every row done and
    its key received once. A repeated POST of one product key, sent straight to the receiver, then shows as 1
    duplicate; a baseline row recorded done whose key never arrived shows as lost."""
    world = _world(2)
    author_effects(world, 6, say=lambda _: None)
    receiver = Receiver().start()
    created_peer = False
    try:
        default, journal = connections["default"].settings_dict, connections["journal"].settings_dict
        conninfo = _conninfo(default)
        setup = {"settings_module": os.environ["DJANGO_SETTINGS_MODULE"],
                 "names": {"default": default["NAME"], "journal": journal["NAME"]},
                 "connector": {"EGRESS_BASE_URL": receiver.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(5),
                               "SECRET_BACKEND_DIR": settings.CONNECTOR["SECRET_BACKEND_DIR"]}}
        connections.close_all()
        product = run_phase(setup, conninfo, kind="product", workers=1, warm=0.0, seconds=2.0, say=lambda _: None)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            created_peer = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0] is None
        peer_schema_apply(conninfo)
        queue = seed_baseline(conninfo, 1, 5)
        baseline = run_phase(setup, conninfo, kind="baseline", workers=1, warm=0.0, seconds=2.0, queue=queue,
                             url=receiver.url, say=lambda _: None)
        assert product["count"] == 6 and product["per_worker"] == [{"dispatched": 6}], product
        assert baseline["count"] == 5, baseline
        clean = _accounting(conninfo, receiver)
        assert clean["product"]["done"] == 6 and clean["product"]["keys_received"] == 6, clean
        assert clean["product"]["duplicate_keys"] == 0 and clean["product"]["lost"] == 0, clean
        assert clean["product"]["effect_states"] == {"finalized": 6}, clean
        assert clean["baseline"]["done"] == 5 and clean["baseline"]["lost"] == 0, clean
        assert clean["baseline"]["duplicate_keys"] == 0, clean

        key = next(r["key"] for r in receiver.requests if not r["key"].startswith("baseline-"))
        httpx.post(receiver.url + "/v1/records/again", content=b"{}", headers={"Idempotency-Key": key})
        again = _accounting(conninfo, receiver)
        assert again["product"]["duplicate_keys"] == 1 and again["product"]["duplicate_requests"] == 1, again
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("INSERT INTO bench_outbound_baseline (phase, method, path, body, idem_key, done_at) "
                         "VALUES (9, 'POST', '/x', '', 'baseline-never-sent', now())")
        lost = _accounting(conninfo, receiver)
        assert lost["baseline"]["done_not_received"] == 1 and lost["baseline"]["lost"] == 1, lost
    finally:
        receiver.stop()
        with psycopg.connect(_conninfo(connections["default"].settings_dict), autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS bench_outbound_baseline")
            if created_peer:  # procrastinate's whole schema, which this test applied: later tests dump the database
                _drop_peer_schema(conn)
            elif conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0] is not None:
                conn.execute("DELETE FROM procrastinate_events WHERE job_id IN (SELECT id FROM procrastinate_jobs "
                             "WHERE queue_name LIKE 'bench_outbound_%%')")
                conn.execute("DELETE FROM procrastinate_jobs WHERE queue_name LIKE 'bench_outbound_%%'")


def _drop_peer_schema(conn) -> None:
    """Drop every object procrastinate's schema created (tables, functions, types named procrastinate_*)."""
    for kind, sql in (("TABLE", "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                                "AND tablename LIKE 'procrastinate%%'"),
                      ("FUNCTION", "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n "
                                   "ON n.oid = p.pronamespace WHERE n.nspname = current_schema() "
                                   "AND p.proname LIKE 'procrastinate%%'"),
                      ("TYPE", "SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
                               "WHERE n.nspname = current_schema() AND t.typname LIKE 'procrastinate%%' "
                               "AND t.typtype = 'e'")):
        for (name,) in conn.execute(sql).fetchall():
            conn.execute(f"DROP {kind} IF EXISTS {name} CASCADE")
