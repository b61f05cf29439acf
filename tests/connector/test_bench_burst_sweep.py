"""`manage.py bench burst --clients 1,2,4,8,16` (issue 40, goal 5): the per-client table and the chart are drawn
from the report's phases, one per client count, and `--from-json` redraws them without running anything."""
from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from bench.burst_report import check_burst
from bench.burst_sweep import parse_clients, sweep_rows, sweep_table


def sweep_report() -> dict:
    phases = [{"phase": "analyzed", "clients": c, "end_to_end_events_per_s": rate, "load_average": [load, 0, 0],
               "cpu_per_event_ms": {"total": cpu, "postgresql": pg}, "admission": {"accepted": 10},
               "effects_finalized": 10,
               "receiver": {"records": 10, "applied_once": 10, "missing": 0, "applied_more_than_once": 0}}
              for c, rate, cpu, pg, load in ((1, 40.0, 30.0, 9.0, 1.1), (2, 70.5, 24.0, 7.5, 1.9),
                                             (8, 88.1, 21.9, 6.8, 2.6))]
    return {"bench": "burst", "deliveries": 10, "clients": [1, 2, 8], "machine": {"cpus": 2}, "phases": phases,
            "first_result_s": 0.4, "command": "manage.py bench burst --deliveries 10 --clients 1,2,8"}


def test_clients_parse_as_one_count_or_a_list_of_distinct_positive_counts():
    assert parse_clients("8") == (8,)
    assert parse_clients("1,2,4,8,16") == (1, 2, 4, 8, 16)
    for bad in ("", "0", "2,2", "1,-4"):
        with pytest.raises(ValueError):
            parse_clients(bad)


def test_each_phase_is_one_row_of_the_table_in_client_order():
    rows = sweep_rows(sweep_report())
    assert [(r["clients"], r["events_per_s"], r["cpu_ms_per_event"]) for r in rows] == [
        (1, 40.0, 30.0), (2, 70.5, 24.0), (8, 88.1, 21.9)]
    table = sweep_table(sweep_report())
    assert "| 2 | 70.5 | 24.0 | 7.5 | 1.90 |" in table
    assert table.count("\n") == 5


def test_a_broken_goal_names_the_client_count_of_its_phase():
    failures = check_burst(sweep_report(), {"min_end_to_end_events_per_s": 200.0}, deliveries=10,
                           first_result_budget=2)
    assert "analyzed at 2 clients: end to end 70.5 events/s < goal 200.0" in failures


def test_from_json_draws_the_chart_and_prints_the_table_without_running_anything(tmp_path, capsys):
    source = tmp_path / "sweep.json"
    source.write_text(json.dumps(sweep_report()))
    chart = tmp_path / "sweep.svg"
    call_command("bench", "burst", "--from-json", str(source), "--chart", str(chart), "--table")
    svg = chart.read_text()
    assert svg.startswith("<?xml") and "posting clients" in svg and "events/s" in svg
    assert "| 8 | 88.1 | 21.9 | 6.8 | 2.60 |" in capsys.readouterr().out
    first = svg
    call_command("bench", "burst", "--from-json", str(source), "--chart", str(chart))
    assert chart.read_text() == first, "a redraw from the same report is byte-identical"
