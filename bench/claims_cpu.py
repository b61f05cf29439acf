"""The busy CPU per completion of `bench claims` (issue 18, goal 4; decision D-271): the window sampler handed to
its `_run_workers`, the ratio of each product mode to procrastinate, the `--check` budget and the text report."""
from __future__ import annotations

CPU_GOAL = 2.0  # issue 18 goal 4: busy CPU per completion (workers + their backends) <= 2x procrastinate's per job


class CpuOfWindow:
    """`on_start` for `_run_workers`: samples the busy CPU of the workers and of the PostgreSQL backends serving
    them (and the machine's) over exactly the measured window [start + warm, start + warm + seconds] (D-271)."""

    def __init__(self, setup: dict, conninfo: str, warm: float, seconds: float) -> None:
        from bench.cpu import CpuWindow

        self.window = CpuWindow(conninfo, list(setup["names"].values()))
        self.warm, self.seconds, self.thread = warm, seconds, None

    def __call__(self, start_at: float, pids: list[int]) -> None:
        self.window.pids = list(pids)
        t0 = start_at + self.warm
        self.thread = self.window.run_between(t0, t0 + self.seconds)

    def result(self, completions: int) -> dict | None:
        from bench.cpu import per_completion

        if self.thread is None:
            return None
        self.thread.join(timeout=30)
        cpu = self.window.result
        if not cpu:
            return None
        return {**cpu, "per_completion_ms": per_completion(cpu, completions)}


def cpu_ratios(throughput: list[dict], peer: dict) -> dict:
    """Busy ms per completion of each product mode over procrastinate's per job (goal 4: <= CPU_GOAL)."""
    def busy(phase: dict) -> float | None:
        per = (phase.get("cpu") or {}).get("per_completion_ms") or {}
        return per.get("busy_ms")

    base = busy(peer)
    return {f"{t['mode']}_cpu_over_peer": round(busy(t) / base, 3) if busy(t) and base else None
            for t in throughput}


def cpu_check(report: dict) -> str:
    """The goal-4 budget for `--check`: the batched mode (the worker's step) over procrastinate; '' when it holds."""
    ratio = report["ratios"].get("batch_cpu_over_peer")
    if ratio is None:
        return "busy CPU per completion: the batch mode or the peer was not measured (batch_cpu_over_peer is None)"
    if ratio > CPU_GOAL:
        return f"busy CPU per completion batch / procrastinate {ratio} > {CPU_GOAL:g} (issue 18 goal 4)"
    return ""


def cpu_lines(report: dict) -> list[str]:
    """The text report of the busy CPU per completion (goal 4)."""
    lines = []
    for phase in [*report["throughput"], {**report["peer"], "mode": "procrastinate"}]:
        cpu = phase.get("cpu") or {}
        per = cpu.get("per_completion_ms")
        if not per:
            lines.append(f"busy CPU {phase['mode']}: not measured ({cpu.get('error', 'no completions')})")
            continue
        lines.append(f"busy CPU {phase['mode']}: {per['busy_ms']:.3f} ms per completion (workers "
                     f"{per['workers_ms']:.3f} + PostgreSQL backends {per['backends_ms']:.3f}; {phase['count']} "
                     f"completions, {cpu['workers']} workers, {cpu['backends']} backends, {cpu['window_seconds']} s; "
                     f"machine {per.get('machine_busy_ms')} ms per completion, {cpu.get('machine_busy_pct')}% busy)")
    for mode_ratio, value in report["ratios"].items():
        if mode_ratio.endswith("_cpu_over_peer"):
            lines.append(f"busy CPU per completion {mode_ratio.replace('_cpu_over_peer', '')} / procrastinate: "
                         f"{value} (goal 4: <= {CPU_GOAL:g})")
    return lines
