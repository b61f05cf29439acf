"""The hot-account report: the machine's and the world's facts, per-class figures, the printed table, the
budget check and the budgets derived from reports (bench/budgets.json)."""
from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from bench import load_budgets
from bench.hot_recorder import ALL_CLASSES, GATE_WAITS_FOR, REQUIRED_CLASSES, THROUGHPUT_CLASSES, _r, percentiles


def _stats_ms(latencies: list[float], seconds: float) -> dict:
    p = percentiles(latencies)
    return {"ops": len(latencies), "throughput": _r(len(latencies) / seconds if seconds else 0.0),
            "p50_ms": _r(p["p50"]), "p95_ms": _r(p["p95"]), "p99_ms": _r(p["p99"]), "max_ms": _r(p["max"])}


def _world_facts(account_key: str) -> dict:
    from connector.models import AccountServingGate, ConnectorAccount

    account = ConnectorAccount.objects.get(account_key=account_key)
    gate = AccountServingGate.objects.get(account_id=account.pk)
    return {"account_id": account.pk, "gate_mode": gate.mode, "gate_fence": gate.fence,
            "credential_generation": f"{account.account_key}.crm-api.g1"}


def _state_check(account_key: str) -> list[str]:
    from connector.models import CredentialGeneration, CredentialGenerationDispatchGate

    facts = _world_facts(account_key)
    problems = []
    if facts["gate_mode"] != "v2_serving":
        problems.append(f"gate is {facts['gate_mode']} after the run, not v2_serving")
    generation = CredentialGeneration.objects.get(generation_id=facts["credential_generation"])
    mode = CredentialGenerationDispatchGate.objects.get(credential_generation=generation).mode
    if mode != "enabled":
        problems.append(f"credential dispatch gate is {mode} after the run, not enabled")
    return problems


def machine_facts() -> dict:
    from django.db import connection

    facts = {"cpus": os.cpu_count() or 0, "python": sys.version.split()[0]}
    with connection.cursor() as cursor:
        for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers", "max_connections"):
            cursor.execute(f"SHOW {name}")
            facts[name] = cursor.fetchone()[0]
    return facts


# =================================================================================================================
# table, budgets, check
# =================================================================================================================

def format_report(report: dict) -> str:
    m = report.get("machine", {})
    lines = [(f"bench hot-account: account {report['account_key']}, PostgreSQL {m.get('server_version', '?')} "
              f"(fsync {m.get('fsync', '?')}, synchronous_commit {m.get('synchronous_commit', '?')}), "
              f"{m.get('cpus', '?')} CPUs, {report['seconds']:g} s per client count")]
    head = (f"{'class':<24} {'count':>6} {'ops/s':>7} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'max ms':>8} "
            f"{'lock95':>7} {'lock99':>7} {'cred99':>7} {'dl':>3} {'retry':>5} {'rej':>5} {'err':>4}")
    for run in report["runs"]:
        if run.get("classic") is False:
            lines += _product_lines(run)
            continue
        t = run["totals"]
        lines += ["", f"clients {run['clients']}: {run['rounds']} rounds in {run['seconds']:g} s, load "
                      f"{run['load_average']}, machine CPU busy {run.get('machine_cpu_busy_pct')}%, client "
                      f"processes' CPU {run.get('client_cpu_seconds')} s; control windows (s from start): "
                      + ", ".join(f"{w[0]} {w[1]:.2f}-{w[2]:.2f}" for w in run["control"]["windows"])
                      + f"; confirm_halted attempts {run['control']['confirm_halted_attempts']}, halt drain "
                      f"{run['control']['halt_drain_ms']} ms", head, "-" * len(head)]
        for cls in ALL_CLASSES:
            c = run["classes"][cls]
            lines.append(f"{cls:<24} {c['count']:>6} {c['throughput']:>7.2f} {c['p50_ms']:>7.2f} {c['p95_ms']:>7.2f} "
                         f"{c['p99_ms']:>7.2f} {c['max_ms']:>8.2f} {c['lock_wait_p95_ms']:>7.2f} "
                         f"{c['lock_wait_p99_ms']:>7.2f} {c['credential_lock_wait_p99_ms']:>7.2f} "
                         f"{c['deadlocks']:>3} {c['retries']:>5} "
                         f"{c['rejections_total']:>5} {c['errors']:>4}")
        lines.append(f"totals: deadlocks {t['deadlocks']}, retries {t['retries']}, errors {t['errors']}, "
                     f"availability rejections {t['rejections']} (unaccounted {t['unaccounted_rejections']}), "
                     f"gate-lock wait p99 (worst class) {t['lock_wait_p99_ms']:.2f} ms, longest single wait "
                     f"{t['starvation_ms']:.2f} ms ({t['starvation_class']})")
        for cls in ALL_CLASSES:
            c = run["classes"][cls]
            if c["rejections"]:
                lines.append(f"  rejections {cls}: " + ", ".join(f"{k} {v}" for k, v in sorted(c["rejections"].items())))
            if c["error_samples"]:
                lines.append(f"  errors {cls}: " + " | ".join(c["error_samples"]))
        a, raw, r = run["admission_only"], run["raw"], run["ratios"]
        lines.append(f"admission only: {a['throughput']:.1f} ops/s (p50 {a['p50_ms']:.2f}, p99 {a['p99_ms']:.2f} ms); "
                     f"raw baseline ({raw['counter']}): {raw['throughput']:.1f} ops/s (p50 {raw['p50_ms']:.2f}, "
                     f"p99 {raw['p99_ms']:.2f} ms, deadlocks {raw['deadlocks']})")
        lines.append(f"ratio product admission / raw: in the mix {r['admission_mix_over_raw']}, "
                     f"admission only {r['admission_only_over_raw']}")
        p = run["peer"]
        if p.get("available"):
            lines.append(f"peer baseline (procrastinate): {p['jobs']} jobs in {p['seconds']:.2f} s = "
                         f"{p['throughput']:.1f} jobs/s; ratio product claim-to-completion / procrastinate "
                         f"{r['claim_to_completion_over_peer']} (busy ms per completion: product "
                         f"{r['product_execution_busy_ms']}, procrastinate {r.get('peer_job_busy_ms')})")
        else:
            lines.append(f"peer baseline: unavailable ({p['reason']})")
        for problem in run["control"]["problems"] + run.get("state_problems", []):
            lines.append(f"  PROBLEM: {problem}")
        if run.get("cpu_per_completion_ms"):
            lines.append("classic busy CPU per completion (ms): "
                         + ", ".join(f"{k} {v}" for k, v in run["cpu_per_completion_ms"].items()))
        if run.get("statements_client0"):
            lines.append("classic client 0 statements by class: "
                         + ", ".join(f"{k} {v}" for k, v in sorted(run["statements_client0"].items())))
        lines += _product_lines(run)
    b = report.get("batch_receipt")
    if b:
        ms = b.get("receipt_ms") or {}
        lines += ["", f"batch receipt (1 client, {b['events_per_receipt']}-event receipts admitted and materialized): "
                      f"{b['receipts']} receipts, {b['events']} events in {b['seconds']:g} s = {b['events_per_s']:.1f} "
                      f"events/s (goal {b['goal_events_per_s']:g}); per receipt p50 {ms.get('p50', 0):.1f} ms, "
                      f"p99 {ms.get('p99', 0):.1f} ms; failures {b['failures']}"]
        for problem in b.get("state_problems", []):
            lines.append(f"  PROBLEM: {problem}")
    return "\n".join(lines)


def _product_lines(run: dict) -> list[str]:
    if "product" not in run:
        return []
    from bench.mix_product_run import product_lines

    return product_lines(run["product"])


def check_report(report: dict, budgets: dict) -> list[str]:
    """Every figure of `report` that breaks the "hot_account" budget section, named. A run whose client count has
    no budget entry is not checked; no budgeted run at all is itself a failure."""
    section = budgets.get("hot_account") or {}
    per_n = section.get("clients") or {}
    failures, checked = [], 0
    ratio_floors = section.get("admission_only_over_raw_floor") or {}
    for run in report["runs"]:
        floor = ratio_floors.get(str(run["clients"]))
        if floor is not None and "ratios" in run:  # issue 40 goal 4: the admission path does less work than raw
            checked += 1
            ratio = run["ratios"].get("admission_only_over_raw")
            if ratio is None or ratio < floor:
                failures.append(f"clients={run['clients']} admission only / raw loop {ratio} < goal {floor}")
        if "product" in run:
            from bench.mix_product_run import check_product

            checked += 1
            failures += check_product(run["product"], section.get("product") or {})
        budget = per_n.get(str(run["clients"]))
        if budget is None or run.get("classic") is False:
            continue
        checked += 1
        where = f"clients={run['clients']}"
        classes, totals = run["classes"], run["totals"]
        for cls, floor in (budget.get("throughput_floor_ops_s") or {}).items():
            if classes[cls]["throughput"] < floor:
                failures.append(f"{where} {cls} throughput {classes[cls]['throughput']:.2f} ops/s < floor {floor}")
        for cls, ceiling in (budget.get("p95_ceiling_ms") or {}).items():
            if classes[cls]["p95_ms"] > ceiling:
                failures.append(f"{where} {cls} p95 {classes[cls]['p95_ms']:.2f} ms > ceiling {ceiling}")
        for cls, ceiling in (budget.get("p99_ceiling_ms") or {}).items():
            if classes[cls]["p99_ms"] > ceiling:
                failures.append(f"{where} {cls} p99 {classes[cls]['p99_ms']:.2f} ms > ceiling {ceiling}")
        for cls in REQUIRED_CLASSES:
            if cls in (budget.get("p99_ceiling_ms") or {}) and classes[cls]["count"] == 0:
                failures.append(f"{where} {cls} never succeeded")
        limit = budget.get("gate_lock_wait_p99_ceiling_ms")
        if limit is not None:
            for cls, c in classes.items():
                if c["lock_wait_p99_ms"] > limit:
                    failures.append(f"{where} {cls} gate-lock wait p99 {c['lock_wait_p99_ms']:.2f} ms > ceiling "
                                    f"{limit}")
        for key, figure in (("deadlocks_max", "deadlocks"), ("retries_max", "retries"), ("errors_max", "errors"),
                            ("unaccounted_rejections_max", "unaccounted_rejections")):
            if key in budget and totals[figure] > budget[key]:
                failures.append(f"{where} {figure} {totals[figure]} > {key} {budget[key]}")
        if "starvation_max_ms" in budget and totals["starvation_ms"] > budget["starvation_max_ms"]:
            failures.append(f"{where} longest single wait {totals['starvation_ms']:.2f} ms "
                            f"({totals['starvation_class']}) > starvation bound {budget['starvation_max_ms']}")
        drain = run["control"]["halt_drain_ms"]
        if "halt_drain_max_ms" in budget and (drain is None or drain > budget["halt_drain_max_ms"]):
            failures.append(f"{where} halt drain {drain} ms > halt_drain_max_ms {budget['halt_drain_max_ms']}")
        for problem in run["control"]["problems"] + run.get("state_problems", []):
            failures.append(f"{where} {problem}")
    batch, floor = report.get("batch_receipt"), (section.get("batch_receipt") or {}).get("events_per_s_floor")
    if floor is not None:
        if not batch:
            failures.append("batch receipt phase missing (budgeted in hot_account.batch_receipt)")
        else:
            if batch["events_per_s"] < floor:
                failures.append(f"batch receipt {batch['events_per_s']:.1f} events/s < floor {floor}")
            if batch["failures"]:
                failures.append(f"batch receipt failures {batch['failures']} > 0")
            for problem in batch.get("state_problems", []):
                failures.append(f"batch receipt {problem}")
    if not checked and report["runs"]:
        failures.append("no run of this report has a budget entry in hot_account.clients "
                        f"(budgeted client counts: {sorted(per_n) or 'none'})")
    return failures


def _ceil_to(value: float, step: float) -> float:
    return float(math.ceil(value / step) * step) if value > 0 else step


def budgets_from_reports(reports: Sequence[dict], *, floor_fraction: float = 0.5, ceiling_factor: float = 3.0
                         ) -> dict:
    """The "hot_account" budget section derived from measured reports: per client count the worst figure over the
    reports, floors at `floor_fraction` of the lowest throughput, ceilings at `ceiling_factor` times the highest
    p99 / lock wait / longest wait (rounded up), deadlocks, errors and unaccounted rejections 0, retries
    max(10, 3x measured)."""
    per_n: dict[str, dict] = {}
    for report in reports:
        for run in report["runs"]:
            entry = per_n.setdefault(str(run["clients"]), {"runs": []})
            entry["runs"].append(run)
    clients = {}
    for n, entry in sorted(per_n.items(), key=lambda kv: int(kv[0])):
        runs = entry["runs"]
        floors = {cls: round(floor_fraction * min(r["classes"][cls]["throughput"] for r in runs), 2)
                  for cls in THROUGHPUT_CLASSES}
        ceilings = {cls: _ceil_to(ceiling_factor * max(r["classes"][cls]["p99_ms"] for r in runs), 5)
                    for cls in REQUIRED_CLASSES}
        # A transition runs once per run (its p99 is one sample) and its FOR UPDATE waits for every guarded
        # transaction in flight: a gate transition for the longest (runtime completion), a credential transition
        # for permit acquisition. Their ceilings are at least those operations' ceilings.
        for cls, waits_for in GATE_WAITS_FOR.items():
            ceilings[cls] = max(ceilings[cls], ceilings[waits_for])
        lock = max(max(r["totals"]["lock_wait_p99_ms"] for r in runs) * ceiling_factor,
                   ceilings["runtime_completion"]) / ceiling_factor
        starvation = max(r["totals"]["starvation_ms"] for r in runs)
        drain = max((r["control"]["halt_drain_ms"] or 0) for r in runs)
        retries = max(r["totals"]["retries"] for r in runs)
        clients[n] = {
            "throughput_floor_ops_s": floors, "p99_ceiling_ms": ceilings,
            "gate_lock_wait_p99_ceiling_ms": _ceil_to(ceiling_factor * lock, 1),
            "deadlocks_max": 0, "errors_max": 0, "unaccounted_rejections_max": 0,
            "retries_max": max(10, int(ceiling_factor * retries)),
            "starvation_max_ms": _ceil_to(ceiling_factor * starvation, 50),
            "halt_drain_max_ms": _ceil_to(ceiling_factor * drain, 50),
            "measured_runs": len(runs),
        }
    return {
        "description": ("bench hot-account budgets per client count. Floors: "
                        f"{floor_fraction:.0%} of the lowest measured throughput; ceilings: {ceiling_factor:g}x the "
                        "highest measured p99 latency, gate-lock wait p99, longest single wait and halt drain "
                        "(rounded up); a gate or credential transition's p99 and the gate-lock wait ceiling are at "
                        "least the ceiling of the guarded operation its FOR UPDATE waits for; deadlocks, errors and "
                        f"unaccounted availability rejections 0; retries max(10, {ceiling_factor:g}x measured). "
                        "See docs/benchmarks.md, 'Hot-account capacity'."),
        "derived_from": [f"{r.get('started_at', '?')} clients {r['clients']} x {r['seconds']:g} s" for r in reports],
        "clients": clients,
    }


def write_budget_section(path: Path, section: dict) -> None:
    """Replace only the "hot_account" section's derived budgets; every other section is kept as it is, and so are
    the floors inside it that other phases own: the batch receipt's (D-218) and the product mode's (D-403)."""
    data = load_budgets(path) if path.exists() else {}
    old = data.get("hot_account") or {}
    kept = {key: old[key] for key in ("batch_receipt", "product") if old.get(key) and key not in section}
    data["hot_account"] = {**section, **kept}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
