"""Charts and the scaling table of a `bench hot-account` report (issue 18, "draws a chart generated from its
JSON" and goal 9's scaling table).

Both are pure functions of the JSON report the bench writes (`--json`), so a chart in docs/benchmarks.md can
always be redrawn from the report committed beside it: `manage.py bench hot-account --from-json R.json --chart
docs/benchmarks/hot-account.svg --table`. matplotlib draws the SVG (Agg backend: no display needed).
"""

from __future__ import annotations

from pathlib import Path

# Issue 18's goals that the chart draws as reference lines.
GOAL_ADMISSION_OVER_RAW = 1.0
GOAL_COMPLETION_OVER_PEER = 5.0
GOAL_CONTROL_WAIT_P99_MS = 100.0
GOAL_BATCH_EVENTS_PER_S = 2000.0

CONTROL_CLASSES = ("halt_v2", "credential_revoke")


def _class(run: dict, name: str) -> dict:
    return run.get("classes", {}).get(name, {})


def scaling_rows(report: dict) -> list[dict]:
    """One row per client count: completions per second of the whole mix, admission only and the raw psycopg
    loop (ops/s), their ratio, the procrastinate peer's jobs/s and the ratio to it, the control transitions' p99
    and the load average of that run."""
    rows = []
    for run in report.get("runs", []):
        ratios = run.get("ratios", {})
        adm, raw, peer = run.get("admission_only") or {}, run.get("raw") or {}, run.get("peer") or {}
        rows.append({
            "clients": run["clients"],
            "completions_per_s": _class(run, "runtime_completion").get("throughput"),
            "admission_only_per_s": adm.get("throughput"),
            "raw_per_s": raw.get("throughput"),
            "admission_over_raw": ratios.get("admission_only_over_raw"),
            "peer_jobs_per_s": peer.get("throughput"),
            "completion_over_peer": ratios.get("claim_to_completion_over_peer"),
            "halt_v2_p99_ms": _class(run, "halt_v2").get("p99_ms"),
            "credential_revoke_p99_ms": _class(run, "credential_revoke").get("p99_ms"),
            "load_average": run.get("load_average"),
        })
    return rows


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def scaling_table(report: dict) -> str:
    """The scaling table in Markdown (goal 9), from the report alone."""
    head = ("| clients | completions/s (mix) | admission only ops/s | raw loop ops/s | admission ÷ raw "
            "| procrastinate jobs/s | completions ÷ procrastinate | halt_v2 p99 ms | credential_revoke p99 ms "
            "| load |")
    lines = [head, "|" + " ---: |" * 10]
    for row in scaling_rows(report):
        lines.append("| " + " | ".join([
            str(row["clients"]), _fmt(row["completions_per_s"]), _fmt(row["admission_only_per_s"]),
            _fmt(row["raw_per_s"]), _fmt(row["admission_over_raw"], 3), _fmt(row["peer_jobs_per_s"]),
            _fmt(row["completion_over_peer"], 3), _fmt(row["halt_v2_p99_ms"]),
            _fmt(row["credential_revoke_p99_ms"]), _fmt(row["load_average"], 2)]) + " |")
    batch = report.get("batch_receipt")
    if batch:
        lines.append("")
        lines.append(f"Batch receipts ({batch['events_per_receipt']} events each, 1 client): "
                     f"{_fmt(batch['events_per_s'])} events/s (goal {_fmt(batch.get('goal_events_per_s'), 0)}).")
    return "\n".join(lines) + "\n"


def draw(report: dict, out: Path) -> Path:
    """Three panels by client count: throughput (completions, admission only, raw loop; log scale), the two
    ratios against their goals, and the control transitions' p99 against the 100 ms goal. Returns `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = scaling_rows(report)
    if not rows:
        raise ValueError("the report has no client runs to draw (a --batch-only report?)")
    clients = [r["clients"] for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.6))
    title = f"bench hot-account, {report.get('started_at', '')}"
    machine = report.get("machine") or {}
    if machine.get("cpus"):
        title += f", {machine['cpus']} CPUs"
    fig.suptitle(title)

    def series(ax, key, label, marker):
        points = [(c, r[key]) for c, r in zip(clients, rows) if r[key] is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, label=label)

    series(ax1, "admission_only_per_s", "admission only (ops/s)", "o")
    series(ax1, "raw_per_s", "raw psycopg loop (ops/s)", "s")
    series(ax1, "completions_per_s", "mix completions (per s)", "^")
    series(ax1, "peer_jobs_per_s", "procrastinate (jobs/s)", "v")
    ax1.set_yscale("log")
    ax1.set_title("throughput")
    ax1.set_xlabel("client processes")

    series(ax2, "admission_over_raw", "admission only ÷ raw", "o")
    series(ax2, "completion_over_peer", "completions ÷ procrastinate", "^")
    ax2.axhline(GOAL_ADMISSION_OVER_RAW, linestyle="--", color="tab:blue", linewidth=0.8, label="goal 1 (1.0)")
    ax2.axhline(GOAL_COMPLETION_OVER_PEER, linestyle="--", color="tab:orange", linewidth=0.8, label="goal 3 (5.0)")
    ax2.set_yscale("log")
    ax2.set_title("ratios (goals dashed)")
    ax2.set_xlabel("client processes")

    series(ax3, "halt_v2_p99_ms", "halt_v2 p99 ms", "o")
    series(ax3, "credential_revoke_p99_ms", "credential_revoke p99 ms", "s")
    ax3.axhline(GOAL_CONTROL_WAIT_P99_MS, linestyle="--", color="grey", linewidth=0.8, label="goal 6 (100 ms)")
    ax3.set_title("control transitions during the mix")
    ax3.set_xlabel("client processes")

    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize="small")
    batch = report.get("batch_receipt")
    if batch:
        fig.text(0.01, 0.01, f"batch receipts: {batch['events_per_s']:,.0f} events/s at 1 client "
                             f"(goal {GOAL_BATCH_EVENTS_PER_S:,.0f})", fontsize="small")
    return save(fig, out)


def save(fig, out: Path) -> Path:
    """Lay out and write a matplotlib figure to `out` (its suffix names the format, SVG by default; an SVG carries
    no date, so a redraw from the same JSON is byte-identical), close it, and return the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format=out.suffix.lstrip(".") or "svg", metadata={"Date": None} if out.suffix == ".svg" else None)
    plt.close(fig)
    return out
