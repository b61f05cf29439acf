"""`bench burst --clients 1,2,4,8,16`: the burst's figures against the number of posting clients (issue 40, goal 5).

With more than one client count, `bench burst` runs one analyzed phase per count against the same processes (the
database analyzed once, before the first) and the report's `sweep` lists, per count, events/s end to end and the
product's CPU per event (all roles, PostgreSQL's backends included). `--chart FILE` draws both against clients;
`--from-json REPORT --chart FILE` redraws it from a saved report without running anything, so the chart in
docs/benchmarks.md always matches the JSON committed beside it.
"""
from __future__ import annotations

import json
from pathlib import Path

GOAL_EVENTS_PER_S = 200.0  # issue 40, goal 1
GOAL_CPU_MS_PER_EVENT = 8.0  # issue 40, goal 2


def add_sweep_arguments(parser) -> None:
    parser.add_argument("--chart", metavar="SVG",
                        help="draw events/s and CPU per event against clients (bench/burst_sweep.py) to SVG")
    parser.add_argument("--table", action="store_true", help="print the per-client table in Markdown")
    parser.add_argument("--from-json", metavar="REPORT",
                        help="run nothing: read a saved report and draw --chart / print --table from it")


def redraw(command, options: dict) -> None:
    """`--from-json REPORT`: the chart (`--chart`) and/or the table (`--table`, or when no chart is asked for)."""
    report = json.loads(Path(options["from_json"]).read_text(encoding="utf-8"))
    if options["chart"]:
        command.progress(f"chart written to {draw(report, Path(options['chart']))}")
    if options["table"] or not options["chart"]:
        command.stdout.write(sweep_table(report))


def parse_clients(text: str) -> tuple[int, ...]:
    """"8" or "1,2,4,8,16": positive, distinct, in the order given."""
    counts = tuple(int(part) for part in text.split(",") if part.strip())
    if not counts or any(c < 1 for c in counts) or len(set(counts)) != len(counts):
        raise ValueError("--clients is a positive count or a comma-separated list of distinct ones")
    return counts


def sweep_rows(report: dict) -> list[dict]:
    """One row per phase of a sweep: clients, events/s end to end, product CPU per event (ms), its PostgreSQL part,
    and the load average when the phase ended."""
    rows = []
    for phase in report.get("phases", []):
        cpu = phase.get("cpu_per_event_ms") or {}
        rows.append({"clients": phase.get("clients", report.get("clients")),
                     "events_per_s": phase.get("end_to_end_events_per_s"),
                     "cpu_ms_per_event": cpu.get("total"), "postgresql_ms_per_event": cpu.get("postgresql"),
                     "load_average": (phase.get("load_average") or [None])[0]})
    return rows


def sweep_table(report: dict) -> str:
    """The rows as a Markdown table (docs/benchmarks.md)."""
    def fmt(value, digits=1):
        return "—" if value is None else f"{value:.{digits}f}"

    lines = ["| clients | events/s end to end | CPU ms per event | of it PostgreSQL | load (1 min) |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    for row in sweep_rows(report):
        lines.append(f"| {row['clients']} | {fmt(row['events_per_s'])} | {fmt(row['cpu_ms_per_event'])} | "
                     f"{fmt(row['postgresql_ms_per_event'])} | {fmt(row['load_average'], 2)} |")
    return "\n".join(lines) + "\n"


def draw(report: dict, out: Path) -> Path:
    """Two panels against clients (log 2 axis): events/s end to end, and CPU per event with its PostgreSQL part;
    the goals dashed."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "bench-burst-sweep"  # stable element ids: a redraw is byte-identical
    import matplotlib.pyplot as plt

    from bench.chart import save

    rows = [r for r in sweep_rows(report) if r["clients"] is not None]
    clients = [r["clients"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))

    def series(ax, key, label, marker):
        points = [(r["clients"], r[key]) for r in rows if r[key] is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, label=label)

    series(ax1, "events_per_s", "single-event deliveries, end to end", "o")
    ax1.axhline(GOAL_EVENTS_PER_S, linestyle="--", color="grey", linewidth=0.8, label="goal (200 events/s)")
    ax1.set_title("events/s, first 201 to last finalized effect")
    ax1.set_ylabel("events per second")
    series(ax2, "cpu_ms_per_event", "product CPU (all roles)", "o")
    series(ax2, "postgresql_ms_per_event", "of it PostgreSQL backends", "s")
    ax2.axhline(GOAL_CPU_MS_PER_EVENT, linestyle="--", color="grey", linewidth=0.8, label="goal (8 ms)")
    ax2.set_title("busy CPU per finalized event")
    ax2.set_ylabel("milliseconds")
    ax2.set_ylim(bottom=0)
    ax1.set_ylim(bottom=0)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.set_xlabel("posting clients")
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize="small")
    machine = report.get("machine") or {}
    fig.text(0.01, 0.01, f"{report.get('deliveries')} deliveries per point; {machine.get('cpus', '?')} cores; "
                         f"{report.get('command', '')}", fontsize="x-small")
    return save(fig, out)
