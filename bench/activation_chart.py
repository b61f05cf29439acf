"""The chart of a `bench activation` report (issue 19, "JSON and a chart of cost against N"): a pure function of the
JSON report (`--json`), so a chart beside a committed report can always be redrawn:
`manage.py bench activation --from-json R.json --chart docs/benchmarks/activation.svg`. matplotlib draws it (Agg
backend, as bench/chart.py does).

One panel per scenario: against N (log-log), the activation transaction (first lock to COMMIT), the raw set-based
shape of the same rows with its 2x line (goals 1 and 2), the owner reread before the transaction (goal 3) and the
recovery after the kill (goal 4), with the 100,000-account ceilings of the goals block drawn as markers when given.
"""
from __future__ import annotations

from pathlib import Path

from bench.chart import save

SERIES = (("transaction", "transaction (lock -> COMMIT)", "o"), ("raw", "raw set-based shape", "s"),
          ("reread_ms", "owner reread (before the lock)", "^"), ("recovery", "recovery after SIGKILL", "v"))
TITLES = {"first": "first: epoch_activate_first", "cutover": "cutover: first_activation_commit",
          "successor": "successor: successor_activate (+ lanes)"}


def chart_rows(report: dict) -> dict[str, list[dict]]:
    """scenario -> [{"accounts": N, <series>: ms, "load_average": ...}], ascending N."""
    from bench.activation_goals import figure

    rows: dict[str, list[dict]] = {}
    for scenario, results in (report.get("scenarios") or {}).items():
        for r in sorted(results, key=lambda r: r["accounts"]):
            rows.setdefault(scenario, []).append(
                {"accounts": r["accounts"], "load_average": r.get("load_average"),
                 **{key: figure(r, key) for key, _label, _marker in SERIES}})
    return rows


def draw(report: dict, out: Path) -> Path:
    """One panel per measured scenario (module docstring). Returns `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = chart_rows(report)
    if not rows:
        raise ValueError("the report has no measured activation to draw")
    fig, axes = plt.subplots(1, len(rows), figsize=(5.2 * len(rows), 4.4), squeeze=False)
    fig.suptitle(f"bench activation at {report.get('commit', '?')}: cost against N accounts "
                 f"({report.get('machine', '')})", fontsize="small")
    for ax, (scenario, points) in zip(axes[0], rows.items()):
        ns = [p["accounts"] for p in points]
        for key, label, marker in SERIES:
            pairs = [(p["accounts"], p[key]) for p in points if p[key]]
            if pairs:
                ax.plot([a for a, _ in pairs], [v for _, v in pairs], marker=marker, label=label)
        raw = [(p["accounts"], 2 * p["raw"]) for p in points if p["raw"]]
        if raw:
            ax.plot([a for a, _ in raw], [v for _, v in raw], linestyle="--", color="grey", linewidth=0.8,
                    label="2x raw (goals 1, 2)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ns, [f"{n:,}" for n in ns])
        ax.set_xlabel("accounts (load " + ", ".join(f"{p['load_average']}" for p in points) + ")")
        ax.set_ylabel("ms")
        ax.set_title(TITLES.get(scenario, scenario), fontsize="small")
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize="x-small")
    return save(fig, out)
