"""`manage.py bench burst --check` against issue 40's goals (bench/budgets.json "burst", D-541): end to end to the last
finalized effect, product CPU per event, the first minute against the analyzed database, every effect exactly once at
the receiver; and `bench hot-account --check`'s admission-only / raw floor. Each goal broken is named."""
from __future__ import annotations

import threading

import pytest

from bench import load_budgets
from bench.burst_report import check_burst, receiver_check
from bench.hot_account import check_report
from demo.crm import DemoCrm

GOALS = {"min_end_to_end_events_per_s": 200.0, "max_cpu_ms_per_event": 8.0, "min_first_minute_ratio": 0.8}


def phase(name: str, *, rate: float = 250.0, cpu: float = 7.5, finalized: int = 100, once: int = 100) -> dict:
    return {"phase": name, "admission": {"accepted": 100}, "effects_finalized": finalized,
            "end_to_end_events_per_s": rate, "cpu_per_event_ms": {"total": cpu},
            "receiver": {"records": 100, "applied_once": once, "missing": 100 - once, "applied_more_than_once": 0}}


def report(*phases: dict, ratio: float | None = 0.9) -> dict:
    return {"first_result_s": 0.5, "phases": list(phases), "first_minute_ratio": ratio}


def test_the_goals_are_the_issues():
    assert {k: load_budgets()["burst"][k] for k in GOALS} == GOALS


def test_a_run_meeting_every_goal_passes():
    assert check_burst(report(phase("cold"), phase("analyzed")), GOALS, deliveries=100, first_result_budget=2) == []


@pytest.mark.parametrize(("broken", "message"), [
    (report(phase("cold", rate=150.0), phase("analyzed")), "cold: end to end 150.0 events/s < goal 200.0"),
    (report(phase("cold"), phase("analyzed", cpu=9.1)), "analyzed: product CPU 9.1 ms per event > goal 8.0"),
    (report(phase("cold"), phase("analyzed"), ratio=0.5), "first minute / analyzed 0.5 < goal 0.8"),
    (report(phase("cold"), phase("analyzed"), ratio=None), "first minute / analyzed not measured"),
    (report(phase("cold", finalized=99), phase("analyzed")), "cold: 99 effects finalized for 100 deliveries"),
    (report(phase("cold", once=98), phase("analyzed")), "cold: not every effect exactly once at the receiver"),
    (report(phase("cold", rate=None), phase("analyzed")), "cold: end to end None events/s"),
])
def test_each_broken_goal_is_named(broken, message):
    failures = check_burst(broken, GOALS, deliveries=100, first_result_budget=2)
    assert any(message in failure for failure in failures), failures


def test_the_receiver_check_counts_each_record_applied_once_twice_or_never():
    crm = DemoCrm(write=lambda line: None)
    server = crm.server(0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        crm.mutate("POST", "/v1/records/r-1", "k-1", b'{"name": "a"}')
        crm.mutate("POST", "/v1/records/r-1", "k-1", b'{"name": "a"}')  # a repeat of the key: changes nothing
        crm.mutate("POST", "/v1/records/r-2", "k-2", b'{"name": "b"}')
        crm.mutate("POST", "/v1/records/r-2", "k-3", b'{"name": "b"}')  # a second applied request: twice
        crm.mutate("POST", "/v1/records/other", "k-4", b'{"name": "c"}')
        figures = receiver_check(server.server_address[1], ["r-1", "r-2", "r-3"])
    finally:
        server.shutdown()
        server.server_close()
    assert figures == {"records": 3, "applied_once": 1, "missing": 1, "applied_more_than_once": 1, "repeats": 1}


def test_hot_account_check_holds_admission_only_to_the_raw_loop_at_8_clients():
    budgets = {"hot_account": {"admission_only_over_raw_floor": {"8": 1.0}}}
    run = {"clients": 8, "classic": False, "ratios": {"admission_only_over_raw": 0.93}}
    assert check_report({"runs": [run]}, budgets) == ["clients=8 admission only / raw loop 0.93 < goal 1.0"]
    run["ratios"]["admission_only_over_raw"] = 1.02
    assert check_report({"runs": [run]}, budgets) == []
