"""The report of `manage.py bench burst` (bench/burst.py): the receiver's account of the effects, the printed table
and the `--check` against issue 40's goals (bench/budgets.json "burst", D-541)."""
from __future__ import annotations

import json
from urllib.parse import unquote

from bench.burst_cpu import cpu_lines


def receiver_check(receiver_port: int, record_ids: list[str]) -> dict:
    """Every effect exactly once at the receiver, from the demo CRM's own account (`GET /_demo/state`): each record
    the burst's deliveries name must exist once with version 1 (created by one applied request and never changed
    again). `missing` records the CRM never saw; `applied_more_than_once` records changed by more than one applied
    request; `repeats` requests whose Idempotency-Key the CRM had answered before (they change nothing)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", receiver_port, timeout=60)
    try:
        conn.request("GET", "/_demo/state")
        state = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    wanted = set(record_ids)
    versions: dict[str, list[int]] = {}
    for record in state["records"]:
        if record["external_key"] in wanted and not record.get("merged_into"):
            versions.setdefault(record["external_key"], []).append(record["version"])
    repeats = sum(1 for r in state["requests"] if r["kind"] == "repeat"
                  and unquote(r["path"][len(RECORDS_PATH):]) in wanted)
    return {"records": len(wanted), "applied_once": sum(1 for v in versions.values() if v == [1]),
            "missing": len(wanted - set(versions)),
            "applied_more_than_once": sum(1 for v in versions.values() if v != [1]), "repeats": repeats}


RECORDS_PATH = "/v1/records/"


def format_report(report: dict) -> str:
    adm = report.get("admission", {})
    lines = [f"bench burst: {report['deliveries']} deliveries from {report['clients']} clients, "
             f"{report['machine']['cpus']} CPUs, worker children {', '.join(report.get('worker_children', []))}",
             f"  admission: {adm.get('accepted', 0)} accepted (statuses {adm.get('statuses')}, transport errors "
             f"{adm.get('transport_error_count', 0)}) in {adm.get('seconds_first_to_last_201', 0):.1f} s "
             "(first to last 201)"]

    def s(value) -> str:
        return "-" if value is None else f"{value:.2f} s"

    lines += [f"  first ApplicationResult after the first 201: {s(report.get('first_result_s'))}",
              f"  last materialization after the first 201:   {s(report.get('last_materialization_s'))}",
              f"  last ApplicationResult after the first 201:  {s(report.get('last_result_s'))} "
              f"({report.get('application_results', 0)} results)",
              f"  ApplicationResults by 2/10/30/160 s after the first 201: {report.get('results_at_s')}",
              f"  each delivery, its 201 to its ApplicationResult: {_waits(report.get('delivery_wait_s'))}",
              f"  remote effects: {report.get('remote_effects')}"]
    for phase in report.get("phases") or [report]:
        lines += [f"  phase {phase.get('phase', 'cold')} ({phase.get('clients', report['clients'])} clients): "
                  f"{phase.get('admission', {}).get('accepted', 0)} accepted; "
                  f"last finalized effect after the first 201: {s(phase.get('last_finalized_s'))} "
                  f"({phase.get('effects_finalized', 0)} finalized): "
                  f"**{phase.get('end_to_end_events_per_s')} events/s end to end**; receiver {phase.get('receiver')}; "
                  f"load {phase.get('load_average')}",
                  *cpu_lines(phase.get("cpu"), phase.get("effects_finalized", 0))]
    if report.get("first_minute_ratio") is not None:
        lines.append(f"  first minute (cold planner) / analyzed, end to end: {report['first_minute_ratio']}")
    lines.append(f"  load average before {report['load_average_before']} after {report.get('load_average_after')}")
    return "\n".join(lines)


def check_burst(report: dict, goals: dict, *, deliveries: int, first_result_budget: float) -> list[str]:
    """Every broken goal of bench/budgets.json "burst" (issue 40), named; a goal that could not be measured fails."""
    failures = []
    first = report.get("first_result_s")
    if first is None or first > first_result_budget:
        failures.append(f"first ApplicationResult {first} s after the first 201 (budget {first_result_budget} s)")
    for phase in report.get("phases") or []:
        name = phase.get("phase") + (f" at {phase['clients']} clients" if "clients" in phase else "")
        accepted = phase.get("admission", {}).get("accepted", 0)
        if accepted != deliveries:
            failures.append(f"{name}: only {accepted} of {deliveries} accepted")
        if phase.get("effects_finalized", 0) < accepted:
            failures.append(f"{name}: {phase.get('effects_finalized')} effects finalized for {accepted} deliveries")
        receiver = phase.get("receiver") or {}
        if (receiver.get("applied_once") != accepted or receiver.get("missing")
                or receiver.get("applied_more_than_once")):
            failures.append(f"{name}: not every effect exactly once at the receiver: {receiver}")
        rate = phase.get("end_to_end_events_per_s")
        floor = goals.get("min_end_to_end_events_per_s")
        if floor is not None and (rate is None or rate < floor):
            failures.append(f"{name}: end to end {rate} events/s < goal {floor}")
        cpu = (phase.get("cpu_per_event_ms") or {}).get("total")
        ceiling = goals.get("max_cpu_ms_per_event")
        if ceiling is not None and (cpu is None or cpu > ceiling):
            failures.append(f"{name}: product CPU {cpu} ms per event > goal {ceiling}")
    floor = goals.get("min_first_minute_ratio")
    if floor is not None:
        ratio = report.get("first_minute_ratio")
        if ratio is None:
            failures.append(f"first minute / analyzed not measured (run with --phases cold,analyzed; goal {floor})")
        elif ratio < floor:
            failures.append(f"first minute / analyzed {ratio} < goal {floor}")
    return failures


def _waits(waits: dict | None) -> str:
    if not waits:
        return "-"
    return f"p50 {waits['p50']:.1f} s, p95 {waits['p95']:.1f} s, max {waits['max']:.1f} s"
