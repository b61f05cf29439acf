"""The chart of a `bench outbound` report (issue 20): a pure function of the JSON the bench writes (`--json`), so
the chart in docs/benchmarks.md can be redrawn from the report committed beside it:
`manage.py bench outbound --from-json R.json --chart docs/benchmarks/outbound.svg`."""
from __future__ import annotations

from pathlib import Path


def chart_rows(report: dict) -> list[dict]:
    """One row per phase, in run order: its label, completions per second and busy CPU ms per completion."""
    rows, seen = [], {"product": 0, "baseline": 0}
    for phase in report.get("phases", []):
        seen[phase["kind"]] += 1
        per = ((phase.get("cpu") or {}).get("per_completion_ms") or {})
        rows.append({"label": f"{phase['kind']} {seen[phase['kind']]}", "kind": phase["kind"],
                     "per_second": phase["per_second"], "busy_ms": per.get("busy_ms")})
    return rows


def draw(report: dict, out: Path, goals: dict | None = None) -> Path:
    """Two panels: completions per second of each phase (product: effects finalized; baseline: jobs done) and busy
    CPU per completion; the goals (0.5x the baseline's mean rate, 3x its mean CPU) drawn dashed. Returns `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.chart import save

    goals = goals or {"min_effects_over_baseline": 0.5, "max_cpu_over_baseline": 3.0}
    rows = chart_rows(report)
    if not rows:
        raise ValueError("the report has no phases to draw")
    totals = report.get("totals") or {}
    base = totals.get("baseline") or {}
    colors = ["tab:blue" if r["kind"] == "product" else "tab:grey" for r in rows]
    labels = [r["label"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    fig.suptitle(f"bench outbound, {report.get('started_at', '')}, {report.get('worker_shape', '')}, "
                 f"{report.get('cpus', '?')} CPUs")
    ax1.bar(labels, [r["per_second"] or 0 for r in rows], color=colors)
    if base.get("per_second"):
        ax1.axhline(goals["min_effects_over_baseline"] * base["per_second"], linestyle="--", color="tab:red",
                    linewidth=0.8, label=f"goal 1: {goals['min_effects_over_baseline']}x baseline")
    ax1.set_title("completions per second (effects finalized / baseline jobs)")
    ax2.bar(labels, [r["busy_ms"] or 0 for r in rows], color=colors)
    if base.get("busy_ms_per_completion"):
        ax2.axhline(goals["max_cpu_over_baseline"] * base["busy_ms_per_completion"], linestyle="--",
                    color="tab:red", linewidth=0.8, label=f"goal 3: {goals['max_cpu_over_baseline']}x baseline")
    ax2.set_title("busy CPU ms per completion (workers, receiver, PostgreSQL)")
    ratios = report.get("ratios") or {}
    fig.text(0.01, 0.01, f"effects/s over baseline jobs/s {ratios.get('effects_over_baseline')}; CPU per effect over "
                         f"per job {ratios.get('cpu_over_baseline')}", fontsize="small")
    for ax in (ax1, ax2):
        ax.grid(True, axis="y", linewidth=0.3)
        ax.legend(fontsize="small")
        ax.tick_params(axis="x", labelsize="small")
    return save(fig, out)
