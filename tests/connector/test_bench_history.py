"""`manage.py bench history`: the measuring function yields figures for every size, and the admission hot path
reads the retained history only through index scans (CV2-14-010, CV2-14-011)."""
from __future__ import annotations

import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from connector.actors import Actor
from connector.demo import build_world
from bench.history import HistoryReport, SizeResult, measure_history, measure_history_interleaved
from bench.history_data import analyze, generate_history
from bench.stats import Stats
from connector.models import Event, Receipt, ReceiptAdmissionKey
from connector.services.admission import receipt_admit
from connector.services.materialize import receipt_materialize

# The benchmarks create throwaway databases, CHECKPOINT and setval: the administrator, not the product's roles.
pytestmark = pytest.mark.usefixtures("administrator")

DB = {"transaction": True, "databases": ["default", "journal"]}
HISTORY_TABLES = ("connector_receipt", "connector_receiptadmissionkey", "connector_event")
BIG, ITERATIONS = 600, 12  # test_measure_history_reports_both_sizes; `make bench` measures 20,000 x 150
SEQ_SCAN = re.compile(r"Seq Scan on (" + "|".join(HISTORY_TABLES) + r")\b")


@pytest.mark.django_db(**DB)
def test_measure_history_reports_both_sizes():
    """The command's measuring function grows the account's retained history to each size in bulk SQL and
    reports admission and claim latency for both (p50 <= p95 <= p99 <= max). Proves: CV2-14-011"""
    world = build_world("b-")
    account = world.accounts[0]
    # small sizes: the figures and the bulk history are what is proven here; the scale runs are `make bench`
    report = measure_history(account_key=account.account_key, sizes=[BIG, 10], iterations=ITERATIONS, warmup=2)
    assert [r.size for r in report.results] == [10, BIG]
    for result in report.results:
        assert result.retained["receipts"] >= result.size
        for stats in (result.admission_ms, result.claim_ms):
            assert stats.n == ITERATIONS
            assert 0 < stats.min <= stats.p50 <= stats.p95 <= stats.p99 <= stats.max
    assert report.results[1].retained["receipts"] == BIG
    # the receipts admitted while measuring size 10 (warmup + iterations) count towards the BIG retained
    assert report.results[1].generated_rows == (BIG - 10 - (2 + ITERATIONS)) * 8
    # the history is real, constraint-abiding data: every retained receipt has its key, component and event
    assert Receipt.objects.filter(account=account).count() == ReceiptAdmissionKey.objects.filter(
        account=account).count() == Event.objects.filter(account=account).count() == BIG + 2 + ITERATIONS
    assert report.admission_ratio() > 0 and report.claim_ratio() > 0
    assert report.as_dict()["sizes"][1]["retained"]["receipts"] == BIG


@pytest.mark.django_db(**DB)
def test_interleaved_measurement_fills_every_size():
    """The interleaved mode (one database per size; here one size on the test database) grows the history,
    then times the operations in blocks until each size has `iterations` samples. Proves: CV2-14-011"""
    world = build_world("i-")
    report = measure_history_interleaved(account_key=world.accounts[0].account_key,
                                         databases={300: connections["default"]}, iterations=9, warmup=1, block=4)
    (result,) = report.results
    assert result.retained["receipts"] == 300
    assert result.admission_ms.n == result.claim_ms.n == 9  # blocks of 4, 4 and the last 1
    assert Receipt.objects.filter(account=world.accounts[0]).count() == 300 + 1 + 9


def _explain(sql: str) -> str:
    """The plan of a captured statement. One bound on the server (materialization's set-based inserts, D-261)
    carries `$n` placeholders instead of its values: it is prepared and explained with NULL arguments (its
    plan's scans do not depend on them: it reads only its parameters)."""
    n = max((int(m) for m in re.findall(r"\$(\d+)", sql)), default=0)
    with connection.cursor() as cursor:
        if not n:
            cursor.execute("EXPLAIN " + sql)
            return "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("PREPARE history_explain AS " + sql)
        try:
            cursor.execute("EXPLAIN EXECUTE history_explain(" + ", ".join(["NULL"] * n) + ")")
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE history_explain")


@pytest.mark.django_db(**DB)
def test_admission_hot_path_uses_index_scans():
    """With a few thousand retained receipts/events after ANALYZE, every query of admission (key lookup by
    account, channel and transport key; guard; Receipt, key and MaterializationDue inserts), of a duplicate
    retry, and of materialization plans without a sequential scan of connector_receipt,
    connector_receiptadmissionkey or connector_event. Proves: CV2-14-010, CV2-14-011"""
    world = build_world("x-")
    account = world.accounts[0]
    generate_history(account=account, epoch=world.active_epoch, start=0, count=4000)
    analyze()
    body = (b'{"events":[{"data":{"email":"e@example.com","name":"E"},"id":"ev-x",'
            b'"occurred_at":"2025-01-01T00:00:00Z","record_id":"rec-x","sequence":1,"type":"record.updated"}]}')
    actor = Actor.system("explain")
    with CaptureQueriesContext(connection) as captured:
        admission = receipt_admit(account_key=account.account_key, channel="records.webhook",
                                  transport_key="explain-1", body=body, actor=actor)
        receipt_materialize(receipt_pk=admission.receipt.pk)
        retry = receipt_admit(account_key=account.account_key, channel="records.webhook",
                              transport_key="explain-1", body=body, actor=actor)
    assert retry.outcome == "duplicate" and retry.receipt.pk == admission.receipt.pk
    statements = [q["sql"] for q in captured.captured_queries
                  if q["sql"].lstrip().upper().startswith(("SELECT", "INSERT", "UPDATE", "DELETE"))]
    key_lookups = [s for s in statements if 'FROM "connector_receiptadmissionkey"' in s and "transport_key" in s]
    assert key_lookups, "the admission key lookup was not captured"
    # The new receipt is written by one statement (`connector_receipt_admit`, D-201); its key lookup is the
    # ordered path's, taken by the duplicate retry.
    assert any("connector_receipt_admit" in s for s in statements)
    plans = {s: _explain(s) for s in statements}
    scans = {s[:120]: SEQ_SCAN.findall(p) for s, p in plans.items() if SEQ_SCAN.search(p)}
    assert not scans, scans
    for lookup in key_lookups:
        assert "connector_admissionkey_unique_key" in plans[lookup], plans[lookup]


def _report(p50s: tuple[float, float]) -> HistoryReport:
    report = HistoryReport(account_key="a", iterations=1)
    for size, p50 in zip((10, 1_000_000), p50s):
        stats = Stats.of([p50])
        report.results.append(SizeResult(size=size, retained={"receipts": size}, generated_rows=0,
                                         generation_seconds=0, admission_ms=stats, claim_ms=stats))
    return report


def test_check_ratio_and_percentiles():
    """--check compares the p50 admission latency of the largest size with the smallest one's."""
    assert _report((10.0, 11.9)).admission_ratio() == pytest.approx(1.19)
    assert _report((10.0, 12.5)).admission_ratio() > 1.2
    stats = Stats.of([float(v) for v in range(1, 101)])
    assert (stats.p50, stats.mean, stats.min, stats.max) == (50.5, 50.5, 1.0, 100.0)
    assert 95 <= stats.p95 <= 96 and 99 <= stats.p99 <= 100


def test_history_arguments_are_validated_before_any_database_work():
    """Bad arguments fail before the command creates its throwaway database."""
    with pytest.raises(CommandError, match="comma-separated integers"):
        call_command("bench", "history", sizes="10,many")
    with pytest.raises(CommandError, match="two sizes"):
        call_command("bench", "history", sizes="10", check=True)
    with pytest.raises(CommandError, match="must match"):
        call_command("bench", "history", database_name="Bad-Name;")


@pytest.mark.django_db(**DB)
def test_claim_hot_path_uses_index_scans():
    """With a few thousand retained (completed) executions after ANALYZE, lane_advance and execution_claim
    plan without a sequential scan of connector_projection or connector_execution: the pending-projection and
    claimable-execution partial indexes hold only live work. Proves: CV2-14-010, CV2-14-011"""
    from connector.models import Projection
    from connector.services.execution import execution_claim, lane_advance

    world = build_world("y-")
    account = world.accounts[0]
    generate_history(account=account, epoch=world.active_epoch, start=0, count=4000)
    analyze()
    body = (b'{"events":[{"data":{"email":"e@example.com","name":"E"},"id":"ev-y",'
            b'"occurred_at":"2025-01-01T00:00:00Z","record_id":"rec-y","sequence":1,"type":"record.updated"}]}')
    admission = receipt_admit(account_key=account.account_key, channel="records.webhook",
                              transport_key="explain-2", body=body, actor=Actor.system("explain"))
    receipt_materialize(receipt_pk=admission.receipt.pk)
    lane_pk = Projection.objects.get(event__receipt=admission.receipt).lane_id
    with CaptureQueriesContext(connection) as captured:
        minted = lane_advance(lane_pk=lane_pk)
        token = execution_claim(holder="explain", account_id=account.pk)
    assert minted is not None and token is not None and token.execution_pk == minted.pk
    seq = re.compile(r"Seq Scan on (connector_projection|connector_execution)\b")
    statements = [q["sql"] for q in captured.captured_queries
                  if q["sql"].lstrip().upper().startswith(("SELECT", "INSERT", "UPDATE", "DELETE"))]
    scans = {s[:120]: seq.findall(p) for s in statements if seq.search(p := _explain(s))}
    assert not scans, scans
