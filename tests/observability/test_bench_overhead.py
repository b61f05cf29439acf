"""`manage.py bench overhead` (issue 21: "the hot-account bench run with metrics and tracing on: overhead <= 5% of
throughput, reported"): one short pair on the test database. The "on" arm really traces (the OTLP exporter's
batches reach the bench's sink and decode to spans) and really scrapes; the "off" arm exports nothing; both arms
complete deliveries exactly once at the receiver; the report carries the ratio it is for."""
from __future__ import annotations

import pytest

from bench.overhead import format_report, run_overhead
from connector import tracing
from connector.demo import build_world
from connector.models import ReceiptTrace

pytestmark = pytest.mark.usefixtures("administrator")


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_overhead_pair_traces_and_scrapes_only_in_the_on_arm(capsys):
    world = build_world("ovh-", push=True)
    report = run_overhead(account_key=world.accounts[0].account_key, clients=1, seconds=2.0, pairs=1,
                          interval=0.5, say=lambda _m: None)
    off, on = sorted(report["runs"], key=lambda r: r["arm"] != "off")
    assert (off["arm"], on["arm"]) == ("off", "on")
    assert off["completions_per_s"] > 0 and on["completions_per_s"] > 0
    assert off["spans_exported"] == 0 and off["scrape"] is None
    assert on["spans_exported"] > 0
    assert on["scrape"]["scrapes"] >= 2 and on["scrape"]["bytes"] > 1000
    assert off["errors"] == on["errors"] == 0
    assert report["receiver"]["requests"] == report["receiver"]["logical_effects_applied"] > 0
    assert report["state_problems"] == []
    assert report["on_over_off_median"] == round(on["completions_per_s"] / off["completions_per_s"], 4)
    # the on arm's receipts carry their admission span's context (written by the one admission statement)
    assert ReceiptTrace.objects.exists()
    assert not tracing.enabled()  # the bench switched only its own processes
    assert "overhead" in format_report(report)
