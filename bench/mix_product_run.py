"""The product-mode phase of `bench hot-account --product` (bench/mix_product.py): run it, count completions from
PostgreSQL, check exactly-once at the receiver, summarize CPU by role (issue 20, goal 2; D-388..D-391)."""
from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

from bench.mix_product import DEFAULT_WORKERS, DRAIN_SECONDS, IDLE_STOP, measure_cpu, per_completion
from bench.outbound import receiver_accounting

GOAL_COMPLETIONS_PER_S = 100.0  # issue 20, goal 2
SETTLE_IDLE_STOP = 2.0  # the untimed settle step (no clients): a worker stops after finding nothing this long


def worker_plan(workers: dict[str, int], first_index: int, slots: int) -> dict[int, dict]:
    """Pool index -> {role, slot, slots} for the worker processes; the materializers take the account's slots in
    turn (`connector.tasks.slot_of`: receipt pk modulo MATERIALIZE_SLOTS), one process per slot at most."""
    plan, index = {}, first_index
    for role in ("materialize", "claims", "egress", "sweeper"):
        for k in range(int(workers.get(role, 0))):
            plan[index] = {"role": role, "slot": k % slots, "slots": slots}
            index += 1
    return plan


def parse_workers(text: str) -> dict[str, int]:
    """`--product-workers` "materialize=2,claims=2,egress=2" (missing roles keep DEFAULT_WORKERS)."""
    out = dict(DEFAULT_WORKERS)
    for part in filter(None, (p.strip() for p in text.split(","))):
        role, _, count = part.partition("=")
        if role not in DEFAULT_WORKERS or not count.isdigit() or not 1 <= int(count) <= 8:
            raise ValueError(f"--product-workers: {part!r} is not role=1..8 with role one of {sorted(DEFAULT_WORKERS)}")
        out[role] = int(count)
    return out


def _at(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc)


def marks(conninfo: str) -> dict:
    """Where the phase's rows begin: the greatest effect and receipt ids before it."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        effect = conn.execute("SELECT coalesce(max(id), 0) FROM effects_remoteeffect").fetchone()[0]
        receipt = conn.execute("SELECT coalesce(max(id), 0) FROM connector_receipt").fetchone()[0]
    return {"effect": effect, "receipt": receipt}


def accounting(conninfo: str, since: dict, start: float, deadline: float, requests: list[dict],
               admitted: int) -> dict:
    """The phase's figures from PostgreSQL and the receiver: completions = the phase's effects `finalized` with
    `changed_at` inside [start, deadline]; every admitted event must have exactly one effect, finalized after the
    drain (`lost` otherwise), and the receiver must have applied each finalized effect's key exactly once."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        effects = conn.execute(
            "SELECT c.provider_idempotency_key, e.state, e.changed_at FROM effects_remoteeffect e "
            "JOIN effects_outboundcommand c ON c.id = e.command_id WHERE e.id > %s", [since["effect"]]).fetchall()
    return tally(effects, start, deadline, requests, admitted)


def tally(effects: list[tuple], start: float, deadline: float, requests: list[dict], admitted: int) -> dict:
    """`accounting` on rows (key, state, changed_at): pure, so the test can feed it."""
    t0, t1 = _at(start), _at(deadline)
    states: dict[str, int] = {}
    for _key, state, _at_ in effects:
        states[state] = states.get(state, 0) + 1
    finalized = {k for k, s, _ in effects if s == "finalized"}
    in_window = sum(1 for _k, s, at in effects if s == "finalized" and t0 <= at <= t1)
    receiver = receiver_accounting(requests, finalized, {k for k, s, _ in effects if s != "finalized"})
    not_finalized = admitted - len(finalized)
    return {"completions": in_window, "per_second": round(in_window / (deadline - start), 2),
            "admitted": admitted, "effects": len(effects), "finalized_after_drain": len(finalized),
            "effect_states": states, "not_finalized": not_finalized, "receiver": receiver,
            "exactly_once": (receiver["duplicate_keys"] == 0 and receiver["lost"] == 0 and not_finalized == 0
                             and len(effects) == admitted)}


def run_product_phase(pool, *, n: int, control: int, plan: dict[int, dict], base: dict, facts: dict,
                      seconds: float, conninfo: str, databases: list[str], tag: str, receiver, drills: int,
                      inflight: int, shared, profile_dir: str | None, say) -> dict:
    from bench.hot_recorder import _r, summarize_classes, unaccounted_rejections

    if n:  # first the leftovers of the classic mix (prepared effects, due receipts) drained, untimed
        run_product_phase(pool, n=0, control=control, plan=plan, base=base, facts=facts, seconds=0.0,
                          conninfo=conninfo, databases=databases, tag=f"{tag}-settle", receiver=receiver, drills=0,
                          inflight=1, shared=shared, profile_dir=None, say=lambda _m: None)
    since, first_request = marks(conninfo), len(receiver.requests)
    shared.reset(inflight if n else 0)
    lead = 0.5
    start = time.time() + lead
    deadline = start + seconds
    hold = max(0.2, 0.05 * seconds) if drills <= 1 else max(0.05, min(0.05 * seconds, 0.1 * seconds / drills))
    roles = {**{i: "client" for i in range(n)}, **{i: p["role"] for i, p in plan.items()}}
    (say if n else (lambda _m: None))(f"{n} client(s), product mode for {seconds:g} s: workers "
        + ", ".join(f"{r} {sum(1 for p in plan.values() if p['role'] == r)}"
                    for r in ("materialize", "claims", "egress", "sweeper"))
        + f", in-flight window {inflight}, {drills} drill period(s)")
    commands = {}
    profiled: set[str] = set()
    for i, role in roles.items():
        command = {**base, "kind": "call", "target": "bench.mix_product:cmd_role", "role": role, "tag": tag,
                   "idle_stop": SETTLE_IDLE_STOP if not n else IDLE_STOP,
                   "start_at": start, "deadline": deadline, "inflight": inflight, "drain_seconds": DRAIN_SECONDS,
                   "since_effect": since["effect"],
                   **plan.get(i, {})}
        if profile_dir and role not in profiled:  # the first process of each role under cProfile
            profiled.add(role)
            command["profile"] = str(Path(profile_dir) / f"product-{role}.prof")
        commands[i] = command
    if drills:  # 0: no drills (the untimed warm-up)
        commands[control] = {**base, "kind": "call", "target": "bench.mix_product:cmd_control", "start_at": start,
                             "deadline": deadline, "seconds": seconds,
                             "hold": hold, "credential_generation": facts["credential_generation"], "drills": drills}
    pids = pool_pids(pool, {**roles, control: "control"})
    pids[os.getpid()] = "bench+receiver"
    cpu = measure_cpu(conninfo, databases, pids, start, deadline)
    results = pool.run(commands, timeout=seconds + lead + DRAIN_SECONDS + 120, what=f"product mix with {n} clients")
    cpu["thread"].join(timeout=30)
    ctrl = results.pop(control) if drills else {"records": [], "windows": [], "drain_ms": None, "problems": []}
    stats = list(results.values())
    admitted = sum(s["admitted"] for s in stats if s["role"] == "client")
    if not n:
        return {"settled": [s["items"] for s in stats]}
    out = accounting(conninfo, since, start, deadline, receiver.requests[first_request:], admitted)
    records = [r for s in stats for r in s["records"]] + ctrl["records"]
    classes = summarize_classes(records, seconds)
    keep = ("transport_admission", "permit_abandon", "credential_revoke", "credential_reenable", "halt_v2",
            "confirm_halted", "resume_predecessor")
    out.update({
        "clients": n, "seconds": seconds, "inflight": inflight,
        "load_average": round(os.getloadavg()[0], 2),
        "workers": {r: sum(1 for p in plan.values() if p["role"] == r)
                    for r in ("materialize", "claims", "egress", "sweeper")},
        "cpu": cpu.get("result"), "cpu_per_completion_ms": per_completion(cpu.get("result"), out["completions"]),
        "classes": {c: {k: classes[c][k] for k in ("count", "throughput", "p50_ms", "p99_ms", "max_ms",
                                                    "rejections_total", "errors", "deadlocks")} for c in keep},
        "unaccounted_rejections": len(unaccounted_rejections(records, ctrl["windows"])),
        "control": {"halt_drain_ms": _r(ctrl["drain_ms"]) if ctrl["drain_ms"] is not None else None,
                    "permits_abandoned": ctrl.get("abandoned", 0),
                    "problems": ctrl["problems"], "drills": drills, "hold_seconds": hold},
        "roles": _role_summary(stats, out["completions"]),
    })
    return out


def pool_pids(pool, roles: dict[int, str]) -> dict[int, str]:
    return {pool.processes[i].pid: role for i, role in roles.items()}


def _role_summary(stats: list[dict], completions: int) -> dict:
    """Per role: processes, steps, items, idle polls, statements per completion (over the whole phase, drain
    included, so per finalized effect), wake-ups counted."""
    out: dict[str, dict] = {}
    for s in stats:
        entry = out.setdefault(s["role"], {"processes": 0, "steps": 0, "items": 0, "idle": 0, "statements": 0,
                                           "wakes": {}, "cpu_seconds": 0.0, "admission_waits": 0, "timeouts": 0})
        entry["timeouts"] += s["timeouts"]
        entry["processes"] += 1
        entry["steps"] += s["steps"]
        entry["items"] += s["items"]
        entry["idle"] += s["idle"]
        entry["admission_waits"] += s["waits"]
        entry["statements"] += sum(s["statements"].values())
        by_step = entry.setdefault("statements_by_step", {})
        for step, count in s["statements"].items():
            by_step[step] = by_step.get(step, 0) + count
        entry["cpu_seconds"] = round(entry["cpu_seconds"] + s.get("cpu_seconds", 0.0), 3)
        for name, count in s["wakes"].items():
            entry["wakes"][name] = entry["wakes"].get(name, 0) + count
    return out


def product_lines(p: dict) -> list[str]:
    """The printed section of one product-mode run."""
    r = p["receiver"]
    workers = ", ".join(f"{k} {v}" for k, v in p["workers"].items())
    lines = ["", f"product mode, {p['clients']} clients (workers: {workers}"
             + f"; in-flight window {p['inflight']}; load {p['load_average']}):",
             f"  completions (effects finalized inside the {p['seconds']:g} s window): {p['completions']} = "
             f"{p['per_second']:.1f}/s (goal {GOAL_COMPLETIONS_PER_S:g}); admitted {p['admitted']}, effects "
             f"{p['effects']}, finalized after the drain {p['finalized_after_drain']}, not finalized "
             f"{p['not_finalized']}; states {p['effect_states']}",
             f"  receiver: {r['requests']} requests, {r['keys_received']} keys, duplicate keys {r['duplicate_keys']}, "
             f"lost {r['lost']}: exactly once {'yes' if p['exactly_once'] else 'NO'}"]
    per = p.get("cpu_per_completion_ms")
    if per:
        lines.append("  busy CPU per completion (ms): " + ", ".join(f"{k} {v}" for k, v in per.items()))
    for role, e in p["roles"].items():
        lines.append(f"  {role}: {e['processes']} processes, {e['steps']} steps, {e['items']} items, {e['idle']} empty "
                     f"steps ({e['timeouts']} without a message), {e['statements']} statements, cpu "
                     f"{e['cpu_seconds']} s, wakes {e['wakes']}"
                     + (f", admission waits {e['admission_waits']}" if role == "client" else ""))
    c = p["classes"]
    lines.append("  p99 ms: " + ", ".join(f"{k} {v['p99_ms']} ({v['count']})" for k, v in c.items())
                 + f"; unaccounted rejections {p['unaccounted_rejections']}; halt drain {p['control']['halt_drain_ms']}"
                 + f" ms; permits abandoned by the operator step {p['control'].get('permits_abandoned', 0)}; errors "
                 + str(sum(v['errors'] for v in c.values())))
    for problem in p["control"]["problems"]:
        lines.append(f"  PROBLEM: {problem}")
    return lines


def check_product(p: dict, section: dict) -> list[str]:
    """What breaks in one product-mode run: exactly-once at the receiver, every admitted event finalized, no error,
    deadlock or unaccounted rejection, no drill problem; and the completions floor of `section` (budgets.json
    "hot_account" -> "product" -> "clients" -> N -> "completions_per_s_floor") when there is one."""
    where = f"product clients={p['clients']}"
    failures = []
    if not p["exactly_once"]:
        r = p["receiver"]
        failures.append(f"{where} not exactly once: duplicate keys {r['duplicate_keys']}, lost {r['lost']}, "
                        f"admitted {p['admitted']}, effects {p['effects']}, not finalized {p['not_finalized']}")
    for cls, c in p["classes"].items():
        if c["errors"] or c["deadlocks"]:
            failures.append(f"{where} {cls}: errors {c['errors']}, deadlocks {c['deadlocks']}")
    if p["unaccounted_rejections"]:
        failures.append(f"{where} unaccounted rejections {p['unaccounted_rejections']}")
    failures += [f"{where} {problem}" for problem in p["control"]["problems"] + p.get("state_problems", [])]
    floor = ((section.get("clients") or {}).get(str(p["clients"])) or {}).get("completions_per_s_floor")
    if floor is not None and p["per_second"] < floor:
        failures.append(f"{where} completions {p['per_second']:.1f}/s < floor {floor}")
    return failures
