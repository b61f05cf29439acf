"""`bench halt-drain`'s figures and check (issue 20, goal 5; D-383), on synthetic drills: no database."""
from __future__ import annotations

from bench.halt_drain import check_report, summarize

BUDGET = {"settle_to_halted_p99_ceiling_ms": 200.0, "min_drills": 40}


def _report(values: list[float], closed_after: int = 0) -> dict:
    figures = [{"k": k, "open_at_halt": 3, "closed_after_confirm": closed_after if k == 0 else 0,
                "halt_to_last_settled_ms": 90.0, "settle_to_halted_ms": v, "tries": 1}
               for k, v in enumerate(values)]
    return {"summary": summarize(figures, [[0, 1.0, 1.05, "ok", 1]]), "problems": []}


def test_the_check_holds_the_goal_as_the_ceiling_of_the_p99():
    """40 drills with p99 at 200 ms pass; one drill over it in 40 is the p99 and fails; fewer than 40 drills fail;
    a permit closed after the confirm fails whatever the latency. Proves: CV2-11-007"""
    assert check_report(_report([50.0] * 39 + [200.0]), BUDGET) == []
    assert any("p99 201.0 ms > 200.0" in f for f in check_report(_report([50.0] * 39 + [201.0]), BUDGET))
    assert any("< 40" in f for f in check_report(_report([50.0] * 39), BUDGET))
    assert any("closed after the confirm" in f for f in check_report(_report([50.0] * 40, closed_after=1), BUDGET))
