"""`manage.py bench hot-account`: one short run of the complete mix against one account (1 client process plus the
control process, a couple of seconds) reports every operation class, the raw baseline ran, and `--check` fails,
naming the figure, against an impossibly strict budget file (CV2-14-002, CV2-14-003, CV2-14-008 on PostgreSQL)."""
from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from bench import history_ratio_limit, load_budgets
from bench.hot_recorder import ALL_CLASSES, REQUIRED_CLASSES, THROUGHPUT_CLASSES
from bench.hot_report import budgets_from_reports, check_report, format_report, write_budget_section
from bench.hot_account import run_hot_account
from connector.demo import build_world
from connector.models import AccountServingGate

# The benchmarks create throwaway databases, CHECKPOINT and setval: the administrator, not the product's roles.
pytestmark = pytest.mark.usefixtures("administrator")

DB = {"transaction": True, "databases": ["default", "journal"]}


@pytest.mark.django_db(**DB)
def test_hot_account_run_reports_every_class_and_check_enforces_budgets(tmp_path, capsys):
    """A 1-client, 3-second run on the test database: every operation class of the mix and of the control
    process has a nonzero count and figures; the control drills produced only accounted availability rejections;
    the raw psycopg baseline ran; budgets derived from the run pass; an impossibly strict budget file makes
    `bench hot-account --check` fail and name the broken figures. Proves: CV2-14-002, CV2-14-003"""
    world = build_world("hot-", push=True)
    account = world.accounts[0]
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (before,) = cursor.fetchone()
    report = run_hot_account(account_key=account.account_key, clients=[1], seconds=3.0, raw_seconds=1.0,
                             peer=False, warm_rounds=1, drop_raw=True, replay_every=2, drills=2)

    (run,) = report["runs"]
    assert run["clients"] == 1 and run["rounds"] > 0
    assert set(run["classes"]) == set(ALL_CLASSES)
    for cls in REQUIRED_CLASSES:
        figures = run["classes"][cls]
        assert figures["count"] > 0, (cls, figures)
        assert 0 < figures["p50_ms"] <= figures["p95_ms"] <= figures["p99_ms"] <= figures["max_ms"], (cls, figures)
    for cls in THROUGHPUT_CLASSES:
        assert run["classes"][cls]["throughput"] > 0, cls
    # the serving guard's lock wait was measured wherever the guard runs
    assert run["classes"]["transport_admission"]["lock_wait_p99_ms"] > 0
    assert run["classes"]["halt_v2"]["lock_wait_p99_ms"] > 0
    totals = run["totals"]
    assert totals["errors"] == 0, [c["error_samples"] for c in run["classes"].values() if c["errors"]]
    assert totals["deadlocks"] == 0
    assert totals["unaccounted_rejections"] == 0, totals["unaccounted_samples"]
    assert totals["starvation_ms"] > 0 and totals["starvation_class"] in ALL_CLASSES
    # two drill periods (--drills 2): each control transition measured twice (issue 18, goal 6's samples)
    assert [w[0] for w in run["control"]["windows"]] == ["credential", "halt", "credential", "halt"]
    for cls in ("credential_revoke", "credential_reenable", "halt_v2", "confirm_halted", "resume_predecessor"):
        assert run["classes"][cls]["count"] == 2, (cls, run["classes"][cls])
    assert run["control"]["halt_drain_ms"] is not None and not run["control"]["problems"]
    assert not run["state_problems"]
    assert AccountServingGate.objects.get(account=account).mode == "v2_serving"
    # the raw baseline ran from the same process and the ratio is reported
    assert run["raw"]["ops"] > 0 and run["raw"]["throughput"] > 0 and run["raw"]["failures"] == 0
    assert run["admission_only"]["ops"] > 0
    # the measured window plans with statistics: ANALYZE ran after the warm-up (D-403)
    assert report["analyzed_after_warm_up"] is True
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'effects_remoteeffect'")
        (analyzed,) = cursor.fetchone()
    assert analyzed is not None and analyzed >= before
    assert run["ratios"]["admission_only_over_raw"] > 0 and run["ratios"]["admission_mix_over_raw"] > 0
    assert run["peer"] == {"available": False, "reason": "not requested (--no-peer)"}
    assert "peer baseline: unavailable (not requested (--no-peer))" in format_report(report)
    assert report["receiver"]["requests"] >= run["classes"]["egress_send"]["count"]
    # the batch receipt phase (issue 18, goal 2): 100-event receipts admitted and materialized by one client
    batch = report["batch_receipt"]
    assert batch["events_per_receipt"] == 100 and batch["receipts"] > 0 and batch["failures"] == 0
    assert batch["events"] == 100 * batch["receipts"] and batch["events_per_s"] > 0
    assert not batch["state_problems"] and "batch receipt (1 client, 100-event receipts" in format_report(report)

    # budgets derived from this very run hold; an impossible one fails, naming each broken figure
    derived = {"hot_account": budgets_from_reports([report])}
    assert check_report(report, derived) == []
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(report))
    lenient = tmp_path / "lenient.json"
    lenient.write_text(json.dumps(derived))
    call_command("bench", "hot-account", "--from-json", str(saved), "--check", "--budgets", str(lenient))
    assert "check passed" in capsys.readouterr().out

    # the chart and the scaling table are drawn from the saved JSON alone (issue 18: "draws a chart generated
    # from its JSON"; goal 9's table)
    chart = tmp_path / "hot.svg"
    call_command("bench", "hot-account", "--from-json", str(saved), "--chart", str(chart), "--table")
    out = capsys.readouterr().out
    svg = chart.read_text(encoding="utf-8")
    assert svg.startswith("<?xml") and "<svg" in svg and "admission only" in svg and "goal 6 (100 ms)" in svg
    row = next(line for line in out.splitlines() if line.startswith("| 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[4]) == pytest.approx(run["ratios"]["admission_only_over_raw"], abs=0.001)
    assert "Batch receipts (100 events each, 1 client)" in out

    strict = tmp_path / "strict.json"
    strict.write_text(json.dumps({"hot_account": {"clients": {"1": {
        "throughput_floor_ops_s": {"transport_admission": 1e9},
        "p99_ceiling_ms": {"runtime_completion": 0.001},
        "gate_lock_wait_p99_ceiling_ms": 0.0001,
        "starvation_max_ms": 0.001,
        "deadlocks_max": 0,
    }}, "batch_receipt": {"events_per_s_floor": 1e9}}}))
    with pytest.raises(CommandError) as caught:
        call_command("bench", "hot-account", "--from-json", str(saved), "--check", "--budgets", str(strict))
    message = str(caught.value)
    assert "transport_admission throughput" in message and "< floor 1000000000.0" in message
    assert "runtime_completion p99" in message
    assert "gate-lock wait p99" in message
    assert "longest single wait" in message
    assert "batch receipt" in message and "events/s < floor 1000000000.0" in message
    # a budget file without an entry for the measured client count is a failure too, not a silent pass
    assert check_report(report, {"hot_account": {"clients": {"8": {}}}})[0].startswith("no run of this report")


def test_budget_sections_are_kept_and_history_limit_is_read(tmp_path):
    """Writing the hot_account section keeps every other section (e.g. "history", "activation") and the batch
    receipt and product-mode floors inside it (measured by their own phases, D-218, D-403); `bench history
    --check` reads its ratio limit from the "history" section, with the built-in default when absent."""
    path = tmp_path / "budgets.json"
    path.write_text(json.dumps({"history": {"max_p50_admission_ratio": 1.5}, "activation": {"x": 1},
                                "hot_account": {"batch_receipt": {"events_per_s_floor": 5.0},
                                                "product": {"clients": {"8": {"completions_per_s_floor": 100.0}}}}}))
    write_budget_section(path, {"clients": {}})
    data = load_budgets(path)
    assert data == {"history": {"max_p50_admission_ratio": 1.5}, "activation": {"x": 1},
                    "hot_account": {"clients": {}, "batch_receipt": {"events_per_s_floor": 5.0},
                                    "product": {"clients": {"8": {"completions_per_s_floor": 100.0}}}}}
    assert history_ratio_limit(default=1.2, path=path) == 1.5
    assert history_ratio_limit(default=1.2, path=tmp_path / "absent.json") == 1.2


def test_repository_budget_file_has_both_sections():
    """bench/budgets.json is one JSON object with the hot_account budgets per client count (covering the
    `make bench` quick run: 1 and 2 clients) and the history check's ratio limit."""
    data = load_budgets()
    assert {"hot_account", "history"} <= set(data)
    assert {"1", "2"} <= set(data["hot_account"]["clients"])
    assert data["history"]["max_p50_admission_ratio"] == pytest.approx(1.2)
    # issue 20, goal 2: the product mode's floor is the goal itself
    assert data["hot_account"]["product"]["clients"]["8"]["completions_per_s_floor"] == pytest.approx(100.0)
    for budget in data["hot_account"]["clients"].values():
        assert budget["deadlocks_max"] == 0
        assert set(budget["throughput_floor_ops_s"]) == set(THROUGHPUT_CLASSES)
