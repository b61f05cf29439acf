"""`bench activation --check`: the per-cardinality regression ceilings (moved here from bench/activation.py) and
issue 19's goals, read from the `goals` block of the budgets' `activation` section.

Goals are judged on the JSON report (`ActivationReport.as_dict()`), so `--from-json R.json --check` re-judges a
committed report. Per scenario (`first`, `cutover`, `successor`), a goal is one of:

- a ratio at every measured N: `transaction_over_raw` (the transaction, first lock to COMMIT, over the raw
  set-based shape of the same rows in the same run; goals 1 and 2) and `recovery_over_transaction` (SIGKILL to the
  retry's COMMIT over the transaction; goal 4);
- a ceiling at a named N: `transaction_ms`, `reread_ms` (before the transaction: the owner reread), and
  `readback_p99_ms`, each {"<N>": ms} (goals 1, 2, 3 and 6);
- `per_account_flatness`: the transaction per account at the run's largest N over its smallest (goal 5); WAL per
  account is reported beside it.

Each judgement is `passed`, `broken` or `not checked` (its N was not measured, the run has one N only, or the
figure is missing). A check never passes vacuously: not checked is never passed, and a run in which no goal could
be checked fails.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

BUDGET_SECTION = "activation"
GOALS_KEY = "goals"
SCOPED = ("cutover", "successor")  # scenarios whose ceilings sit under their own key ("first" at the top)
ROW_LOCKS_OVER_N = {"first": 1, "cutover": 2, "successor": 3}
# Ceiling headroom over a measurement (suggest_budgets): durations vary about 2x with the load other suites put on
# a shared 2-core machine (docs/benchmarks.md, history noise note); WAL bytes move with full-page images.
DURATION_HEADROOM = 3.0
WAL_HEADROOM = 1.5
SMALL_DURATION_FLOOR_MS = 50
RATIOS = {"transaction_over_raw": ("transaction", "raw"), "recovery_over_transaction": ("recovery", "transaction")}
CEILINGS = ("transaction_ms", "reread_ms", "readback_p99_ms")
PASSED, BROKEN, NOT_CHECKED, REPORTED = "passed", "broken", "not checked", "reported"


def _error(message: str) -> Exception:
    from bench.activation_world import ActivationBenchError

    return ActivationBenchError(message)


def _section(path: Path) -> dict:
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise _error(f"budget file {path} does not exist") from exc
    except ValueError as exc:
        raise _error(f"budget file {path} is not JSON: {exc}") from exc
    section = document.get(BUDGET_SECTION) if isinstance(document, dict) else None
    if not isinstance(section, dict):
        raise _error(f"budget file {path} has no {BUDGET_SECTION!r} section")
    return section


def load_budgets(path: Path) -> dict[str, dict[str, float]]:
    """The "activation" section of the budgets file: {"<accounts>": {figure: ceiling}}; its other keys
    ("description", ...) are comments."""
    section = _section(path)
    budgets = {k: v for k, v in section.items() if k.isdigit() and isinstance(v, dict)}
    for scenario in SCOPED:  # the other scenarios' ceilings, keyed by cardinality the same way
        scoped = section.get(scenario)
        if isinstance(scoped, dict):
            budgets[scenario] = {k: v for k, v in scoped.items() if k.isdigit() and isinstance(v, dict)}
    return budgets


def check_budgets(report, budgets: dict[str, dict[str, float]]) -> list[str]:
    """Every broken figure, named: a figure above its ceiling, a budgeted figure that was not measured, or a
    measured cardinality without a budget (a check never passes vacuously)."""
    broken = [f"{f['accounts']:,} accounts: not measured: {f['error']}" for f in report.failures]
    for r in report.results:
        scoped = budgets if r.scenario == "first" else budgets.get(r.scenario) or {}
        budget = scoped.get(str(r.accounts))
        label = "" if r.scenario == "first" else f"{r.scenario} "
        if budget is None:
            broken.append(f"{r.accounts:,} accounts: no {label}activation budget")
            continue
        figures = r.figures()
        for figure, ceiling in budget.items():
            if figure.startswith("_"):
                continue
            if figure not in figures:
                broken.append(f"{r.accounts:,} accounts: unknown {label}figure {figure!r} in the budget")
            elif figures[figure] is None:
                broken.append(f"{r.accounts:,} accounts: {label}{figure} was not measured (ceiling {ceiling:,})")
            elif figures[figure] > ceiling:
                broken.append(f"{r.accounts:,} accounts: {label}{figure} {figures[figure]:,} > ceiling {ceiling:,}")
    return broken


def _round_up(value: float) -> int:
    """Up to two significant digits."""
    if value <= 0:
        return 1
    step = 10 ** max(0, math.floor(math.log10(value)) - 1)
    return int(math.ceil(value / step) * step)


def suggest_budgets(report) -> dict[str, dict[str, int]]:
    """Ceilings from this run: durations x DURATION_HEADROOM (at least SMALL_DURATION_FLOOR_MS for the COMMIT,
    readback and lock-release figures), WAL bytes x WAL_HEADROOM, row locks exactly what the transaction locks
    (ROW_LOCKS_OVER_N: the gates and the epoch, N + 1; cutover N + 2 with the barrier set; successor N + 3 with
    both epochs and the barrier set, plus its lanes), all rounded up to two significant digits. The other
    scenarios' ceilings go under their own key."""
    section: dict[str, Any] = {}
    for r in report.results:
        f = r.figures()
        budget = {name: _round_up(f[name] * DURATION_HEADROOM) for name in
                  ("transaction_ms", "commit_ms", "readback_ms", "locks_released_ms", "recovery_ms")
                  if f[name] is not None}
        for name in ("commit_ms", "readback_ms", "locks_released_ms"):
            if name in budget:  # one fsync or scheduling hiccup on a shared machine is tens of milliseconds
                budget[name] = max(budget[name], SMALL_DURATION_FLOOR_MS)
        if f["wal_bytes"] is not None:
            budget["wal_bytes"] = _round_up(f["wal_bytes"] * WAL_HEADROOM)
        budget["row_locks"] = r.accounts + ROW_LOCKS_OVER_N[r.scenario] + r.rows.get("lane_rows", 0)
        (section if r.scenario == "first" else section.setdefault(r.scenario, {}))[str(r.accounts)] = budget
    return section


# -- goals (issue 19, "What it must show") ---------------------------------------------------------------------

def load_goals(path: Path) -> dict[str, dict[str, Any]]:
    """The `goals` block of the `activation` section: {scenario: {goal: limit}}; keys starting with "_" or named
    "description" are comments."""
    goals = _section(path).get(GOALS_KEY)
    if not isinstance(goals, dict):
        raise _error(f"budget file {path} has no {BUDGET_SECTION!r}.{GOALS_KEY!r} block")
    return {k: v for k, v in goals.items() if isinstance(v, dict) and not k.startswith("_")}


def figure(result: dict, name: str) -> float | None:
    """A figure of one result of the JSON report, in ms unless named otherwise."""
    phases, figures = result.get("phases") or {}, result.get("figures") or {}
    raw = result.get("raw") or {}
    return {"transaction": phases.get("transaction_ms"), "transaction_ms": phases.get("transaction_ms"),
            "raw": raw.get("statement_ms"), "reread_ms": phases.get("reread_ms"),
            "recovery": figures.get("recovery_ms"), "readback_p99_ms": figures.get("readback_ms")}.get(name)


def _judgement(scenario: str, goal: str, accounts, value, limit, status: str | None = None,
               note: str = "") -> dict[str, Any]:
    if status is None:
        status = NOT_CHECKED if value is None else (PASSED if value <= limit else BROKEN)
    where = "" if accounts is None else f" at {accounts:,}" if isinstance(accounts, int) else f" at {accounts}"
    shown = "not measured" if value is None else f"{value:,.3g}" if value < 100 else f"{value:,.0f}"
    text = f"{scenario} {goal}{where}: {shown} (goal <= {limit:,}){': ' + note if note else ''} -> {status}"
    return {"scenario": scenario, "goal": goal, "accounts": accounts, "value": value, "limit": limit,
            "status": status, "text": text}


def _results(report: dict, scenario: str) -> dict[int, dict]:
    return {r["accounts"]: r for r in (report.get("scenarios") or {}).get(scenario, [])}


def check_goals(report: dict, goals: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Judge every goal of every scenario the report measured or failed (module docstring)."""
    failed = {(f.get("scenario", "first"), f["accounts"]) for f in report.get("failures", [])}
    scenarios = [s for s in goals if _results(report, s) or any(f[0] == s for f in failed)]
    judgements: list[dict[str, Any]] = []
    for scenario in scenarios:
        results, spec = _results(report, scenario), goals[scenario]
        for goal, limit in spec.items():
            if goal.startswith("_") or goal == "description":
                continue
            if goal in RATIOS:
                top, bottom = RATIOS[goal]
                for n, r in sorted(results.items()):
                    a, b = figure(r, top), figure(r, bottom)
                    judgements.append(_judgement(scenario, goal, n, None if not (a and b) else round(a / b, 3),
                                                 limit))
                for n in sorted(n for s, n in failed if s == scenario):
                    judgements.append(_judgement(scenario, goal, n, None, limit, note="the run failed"))
            elif goal in CEILINGS:
                for n, ceiling in sorted(limit.items(), key=lambda item: int(item[0])):
                    r = results.get(int(n))
                    judgements.append(_judgement(scenario, goal, int(n), None if r is None else figure(r, goal),
                                                 ceiling, note="" if r else "N not measured in this run"))
            elif goal == "per_account_flatness":
                judgements += _flatness(scenario, results, limit)
            else:
                judgements.append(_judgement(scenario, goal, None, None, limit, BROKEN,
                                             note="unknown goal in the budgets"))
    return judgements


def _flatness(scenario: str, results: dict[int, dict], limit: float) -> list[dict[str, Any]]:
    """Goal 5: transaction per account at the largest N over the smallest, and WAL per account (reported)."""
    out = []
    for n, r in sorted(results.items()):
        wal = (r.get("per_account") or {}).get("wal_bytes")
        out.append(_judgement(scenario, "wal_bytes_per_account", n, wal, math.inf, REPORTED))
    if len(results) < 2:
        return out + [_judgement(scenario, "per_account_flatness", None, None, limit,
                                 note="needs two cardinalities in one run")]
    lo, hi = min(results), max(results)
    a = (results[hi].get("per_account") or {}).get("transaction_us")
    b = (results[lo].get("per_account") or {}).get("transaction_us")
    return out + [_judgement(scenario, "per_account_flatness", f"{hi:,}/{lo:,}",
                             None if not (a and b) else round(a / b, 3), limit)]


def goal_failures(judgements: list[dict[str, Any]]) -> list[str]:
    """The broken goals, named; and one failure when no goal at all could be checked (never vacuous)."""
    broken = [j["text"] for j in judgements if j["status"] == BROKEN]
    if not any(j["status"] in (PASSED, BROKEN) for j in judgements):
        broken.append("no activation goal could be checked on this report")
    return broken


def format_goals(judgements: list[dict[str, Any]]) -> str:
    lines = ["goals (issue 19; bench/budgets.json activation.goals):"]
    lines += [f"  {j['text']}" for j in judgements if j["status"] != REPORTED]
    wal = [j for j in judgements if j["status"] == REPORTED]
    if wal:
        lines.append("  WAL per account (goal 5, reported): " + ", ".join(
            f"{j['scenario']} {j['accounts']:,}: {'-' if j['value'] is None else format(j['value'], ',.0f')} B"
            for j in wal))
    return "\n".join(lines)
