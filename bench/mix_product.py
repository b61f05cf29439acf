"""`manage.py bench hot-account --product`: the hot-account mix the way the product runs it (issue 20, goal 2;
D-388..D-391).

The classic mix (bench/hot_account.py) has every client run the whole chain one item at a time through the old
separate steps. This mode splits the chain by role, as `make run` does:

  clients      N processes do what the web process does per event: `receipt_admit` of a fresh 1-event webhook body
               (the service the admission view calls; a GateNotServing refusal during a halt drill is retried with
               the same key after a short back-off, as a sender retries a 503). A client admits only while fewer than
               `inflight` events are admitted and not yet finalized (a shared counter), so the mix runs at the rate
               the workers finalize instead of piling up a backlog.
  materialize  processes running the batch materializer's step (connector.tasks: `_materialize`, an account's
               due receipts in one transaction), each on its slot of the account's receipts, as `materialize_due`
               does.
  claims       processes running the Celery task `connector.tasks.execution_claim_and_run` (batched fair claims,
               batched Runtime and result recording, outbound authoring), then the `lane_advance` tasks it published.
  egress       processes running the body of `effects.tasks.effect_dispatch`: `worker.effect_dispatch_batch`
               (one claim+permit transaction, the committed `sending` markers, the HTTP exchanges, one settlement +
               finalization transaction).
  control      one process running the halt / credential-revoke drills of the classic mix.

Celery's publishing is replaced in these processes (`Wakes`): a wake-up is counted by task name and not sent (the
workers poll instead, IDLE_SLEEP when a step found nothing); the `lane_advance` messages the claims step publishes
are run by the same process, as the `lanes` queue's worker would. So the Redis round trips of the wake-ups are not
in the figures (the burst bench measures them with the real processes).

Completions are counted in PostgreSQL: effects created in the phase whose state is `finalized` with `changed_at`
inside the window. After the window the workers drain the backlog; then every admitted event must have exactly one
finalized effect and the receiver must have applied each effect's idempotency key exactly once
(`accounting`). Busy CPU is measured per role over the window (`RoleCpu`: the pool's processes by role, their
PostgreSQL backends by the role holding the connection, the bench's own process with the receiver).
"""
from __future__ import annotations

import cProfile
import os
import time
from collections import deque

from bench.burst_cpu import BurstCpu

ADMIT_WAIT = 0.1  # seconds a client waits at most for room in the in-flight window before it looks at the clock
# scripts/run.py worker_pools() on 2 cores, and one process for beat's sweeps
DEFAULT_WORKERS = {"materialize": 2, "claims": 2, "egress": 2, "sweeper": 1}
WAKE_TIMEOUT = 0.5  # seconds an idle worker waits for a wake-up before it looks again anyway
SWEEP_EVERY = 5.0  # beat's schedule of the inbound and effects sweeps (config/settings/celery.py)
# The role a published task wakes (its Celery queue's worker); lane_advance is run by the claims process itself.
WAKES_ROLE = {"connector.tasks.materialize_due": "materialize", "connector.tasks.receipt_materialize": "materialize",
              "connector.tasks.execution_claim_and_run": "claims", "effects.tasks.effect_dispatch": "egress"}
DEFAULT_INFLIGHT_PER_CLIENT = 8
# The workers' lease (CONNECTOR["LEASE_SECONDS"], 60 by default) in this mode: a batch of executions claimed just as a
# halt drill closes the gate is refused before it runs and stays leased until the lease expires (then the sweep
# wakes a claimer); 10 s keeps the drain after the window short. The loopback receiver answers in milliseconds,
# far inside it.
LEASE_SECONDS = 10
DRAIN_SECONDS = LEASE_SECONDS + 15.0
IDLE_STOP = 0.5  # seconds of finding nothing after which a worker ends its drain
LANE_TASK = "connector.tasks.lane_advance"

SHARED = None  # the Shared of the pool, inherited by every pool process (`process_main`)


class Shared:
    """What the product mode's processes share (created by the parent, inherited at spawn): the in-flight counters
    (events admitted, effects of the phase finalized), the materializer's debounce flag (the Redis `SET NX` key of
    `materialization_wake`) and one semaphore per worker role (its Celery queue: one release per message)."""

    def __init__(self, ctx, slots: int = 2) -> None:
        self.slots = slots
        self.admitted, self.finalized = ctx.Value("q", 0), ctx.Value("q", 0)
        self.pending = [ctx.Value("q", 0) for _ in range(slots)]  # per materialization slot
        self.queues = {role: ctx.Semaphore(0) for role in
                       ("claims", "egress", *(f"materialize-{k}" for k in range(slots)))}
        self.window = ctx.Semaphore(0)  # the in-flight window: a client takes one to admit, egress returns it

    def reset(self, inflight: int = 0) -> None:
        for value in (self.admitted, self.finalized, *self.pending):
            value.value = 0
        for sem in (*self.queues.values(), self.window):
            while sem.acquire(False):
                pass
        for _ in range(inflight):
            self.window.release()

    def wake(self, role: str, slot: int | None = None) -> None:
        self.queues[role if slot is None else f"{role}-{slot % self.slots}"].release()

    def materialization_wake(self, receipt_pk: int) -> bool:
        """The view's wake-up of the receipt's slot (`connector.tasks.slot_of`): sent only if none is pending (the
        debounce key); the run drops the flag when drained."""
        slot = receipt_pk % self.slots
        with self.pending[slot].get_lock():
            if self.pending[slot].value:
                return False
            self.pending[slot].value = 1
        self.wake("materialize", slot)
        return True


def process_main(index: int, setup: dict, inbox, outbox, shared) -> None:
    """A pool process that also holds the Shared, then the classic pool's command loop."""
    global SHARED
    SHARED = shared
    from bench.hot_client import _process_main

    _process_main(index, setup, inbox, outbox)


class Wakes:
    """Celery's `Task.apply_async` replaced in a product-mode process: nothing is published to a broker; each
    message is counted by task name and released on its role's semaphore (`Shared.queues`), and the `lane_advance`
    messages are kept to be run by this process."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.lanes: deque = deque()
        self.saved = None

    def install(self) -> Wakes:
        from celery.app.task import Task

        self.saved = Task.apply_async
        wakes = self

        def apply_async(task, args=None, kwargs=None, **_options):
            wakes.counts[task.name] = wakes.counts.get(task.name, 0) + 1
            if task.name == LANE_TASK:
                wakes.lanes.append((tuple(args or ()), dict(kwargs or {})))
            elif task.name in WAKES_ROLE and SHARED is not None:
                role = WAKES_ROLE[task.name]
                if role == "materialize":  # materialize_due(account, slot) / receipt_materialize(pk): slot 0
                    SHARED.wake(role, (args or (0, 0))[1] if task.name.endswith("due") and len(args or ()) > 1 else 0)
                else:
                    SHARED.wake(role)
            return None

        Task.apply_async = apply_async
        return self

    def uninstall(self) -> None:
        from celery.app.task import Task

        if self.saved is not None:
            Task.apply_async = self.saved


class Statements:
    """Statements this process sent to PostgreSQL (a `connection.execute_wrapper` on `default`), by step."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.step = "other"

    def __call__(self, execute, sql, params, many, context):
        self.counts[self.step] = self.counts.get(self.step, 0) + 1
        return execute(sql, params, many, context)


# -- the roles' steps --------------------------------------------------------------------------------------------

def materialize_step(account_id: int, slot: tuple[int, int], attempted: set[int]) -> int:
    """One read of the batch materializer (`connector.tasks.materialize_due`'s loop body): the slot's due receipts
    materialized together (their lanes advanced together); `attempted` (the run's skip set:
    a receipt refused during a halt is not retried in a loop) grows. Returns the receipts attempted."""
    from django.conf import settings

    from connector import tasks
    from connector.selectors import materialization

    size = max(1, int(settings.CONNECTOR.get("MATERIALIZE_BATCH", 50)))
    due = materialization.due_receipts(account_id=account_id, limit=size, skip=attempted, slot=slot)
    if not due:
        return 0
    claims = tasks._ClaimWakes()
    attempted.update(receipt_pk for receipt_pk, _ in due)
    tasks._materialize(due, claims)
    claims.flush()
    return len(due)


def claims_step(wakes: Wakes, statements: Statements | None = None) -> int:
    """The `execution_claim_and_run` task (which advances its completed executions' lanes together since D-398), then
    the `lane_advance` tasks it still published (their statements counted apart). Returns executions run."""
    from connector import tasks

    done = tasks.execution_claim_and_run()
    if statements is not None:
        statements.step = "claims:lane_advance"
    while wakes.lanes:
        args, kwargs = wakes.lanes.popleft()
        tasks.lane_advance(*args, **kwargs)
    if statements is not None:
        statements.step = "claims"
    return done


def egress_step(since_effect: int = 0) -> tuple[int, int]:
    """The body of the `effect_dispatch` task (batched steps of EGRESS_BATCH, up to 20 effects). Returns (effects
    handled, effects of this phase (pk > `since_effect`) finalized)."""
    from effects.choices import EffectState
    from effects.services import worker

    done = finalized = 0
    size = worker.egress_batch_size()
    while done < 20:
        effects = worker.effect_dispatch_batch(n=min(size, 20 - done))
        if not effects:
            break
        done += len(effects)
        finalized += sum(1 for e in effects if e.state == EffectState.FINALIZED and e.pk > since_effect)
    return done, finalized


def _admit_loop(index: int, command: dict, stats: dict) -> None:
    from connector.actors import Actor
    from connector.demo import DEMO_CHANNEL, demo_event_body
    from connector.services.admission import receipt_admit
    from bench.hot_recorder import RECORDER, REJECTION_BACKOFF_SECONDS

    actor = Actor.system("bench-hot-account")
    admitted, deadline = SHARED.admitted, command["deadline"]
    tag, n, holding = f"{command['tag']}-p{index}", 0, False
    while time.time() < deadline:
        if not holding:
            if not SHARED.window.acquire(timeout=ADMIT_WAIT):
                stats["waits"] += 1
                continue
            holding = True
        key = f"{tag}-{n}"
        outcome, admission = RECORDER.op("transport_admission", lambda: receipt_admit(
            account_key=command["account_key"], channel=DEMO_CHANNEL, transport_key=f"bench-{key}",
            body=demo_event_body(key), actor=actor))
        if outcome == "ok":
            n, holding = n + 1, False
            with admitted.get_lock():
                admitted.value += 1
            SHARED.materialization_wake(admission.receipt.pk)  # the view's on-commit wake-up (debounced)
        elif outcome == "rejected":
            time.sleep(REJECTION_BACKOFF_SECONDS)  # the same key again, as a sender retries a 503
        else:
            n += 1  # an error is counted by the recorder; the next event takes a fresh key
    if holding:
        SHARED.window.release()
    stats["admitted"] = n


def _materialize_run(account_id: int, slot: tuple[int, int]) -> int:
    """One `materialize_due` run woken by a message: steps until nothing is due (its skip set), then the debounce
    flag dropped and one more look (`_wake_release`): work committed meanwhile continues this run unless a client
    took the flag (its message will run). Returns the receipts attempted."""
    from connector.selectors import materialization

    attempted: set[int] = set()
    done = 0
    pending = SHARED.pending[slot[0]]
    while True:
        did = materialize_step(account_id, slot, attempted)
        done += did
        if did:
            continue
        pending.value = 0
        if not materialization.due_receipts(account_id=account_id, limit=1, skip=attempted, slot=slot):
            return done
        with pending.get_lock():
            if pending.value:
                return done
            pending.value = 1


def _sweep(wakes: Wakes) -> int:
    """Beat's inbound and effects sweeps, as their tasks run them while the broker answers (the batch materializers
    are running: receipts are materialized by the sweep only after MATERIALIZE_STUCK_SECONDS)."""
    from django.conf import settings

    from connector import tasks
    from connector.services import sweeper
    from effects import tasks as effect_tasks

    report = sweeper.inbound_sweep(materialize_grace_seconds=int(settings.CONNECTOR.get("MATERIALIZE_STUCK_SECONDS",
                                                                                          60)))
    for _ in range(min(-(-report.claimable // tasks._batch()), 8)):
        tasks.execution_claim_and_run.delay()
    effect_tasks.effects_sweep()
    return 0


def _work_loop(role: str, command: dict, stats: dict, wakes: Wakes, statements: Statements) -> None:
    """Wait for a message on the role's semaphore (or WAKE_TIMEOUT: then look anyway), run the task it names; the
    sweeper every SWEEP_EVERY s. After the window: until nothing arrived for IDLE_STOP s and every admitted event
    is finalized (or DRAIN_SECONDS)."""
    admitted, finalized = SHARED.admitted, SHARED.finalized
    account_id, deadline = command["account_id"], command["deadline"]
    drain_until = deadline + float(command.get("drain_seconds", DRAIN_SECONDS))
    slot = (int(command.get("slot", 0)), int(command.get("slots", 1)))
    queue = SHARED.queues.get(f"materialize-{slot[0]}" if role == "materialize" else role)
    statements.step = role
    busy_at = next_sweep = time.time()
    while True:
        now = time.time()
        if now >= drain_until or (now >= deadline + 0.5 and now - busy_at >= float(command.get("idle_stop", IDLE_STOP))
                                  and admitted.value <= finalized.value):
            break
        if role == "sweeper":
            time.sleep(max(0.0, min(next_sweep, drain_until) - now))
            next_sweep = time.time() + SWEEP_EVERY
            _sweep(wakes)
            stats["steps"] += 1
            continue
        if not queue.acquire(timeout=WAKE_TIMEOUT):
            stats["timeouts"] += 1  # no message: look anyway (the product would wait for the sweeper)
        if role == "materialize":
            did = _materialize_run(account_id, slot)
        elif role == "claims":
            did = claims_step(wakes, statements)
        else:
            did, done = egress_step(int(command.get("since_effect", 0)))
            if done:
                with finalized.get_lock():
                    finalized.value += done
                for _ in range(done):
                    SHARED.window.release()
        stats["steps"] += 1
        if not did:
            stats["idle"] += 1
        else:
            stats["items"] += did
            busy_at = time.time()


def cmd_role(index: int, command: dict) -> dict:
    """One product-mode process: a client (`role` client) or a worker (materialize, claims, egress), from the common
    start until the deadline (workers: until the backlog is drained); optionally under cProfile."""
    from django.db import connection

    from bench.hot_recorder import RECORDER, _sleep_until

    from django.conf import settings

    role = command["role"]
    saved_connector = settings.CONNECTOR
    settings.CONNECTOR = {**settings.CONNECTOR, "LEASE_SECONDS": LEASE_SECONDS}
    RECORDER.records = []
    wakes, statements = Wakes().install(), Statements()
    stats = {"role": role, "pid": os.getpid(), "admitted": 0, "waits": 0, "steps": 0, "items": 0, "idle": 0,
             "timeouts": 0}
    profile = cProfile.Profile(time.process_time) if command.get("profile") else None  # CPU, not wall time
    try:
        with connection.execute_wrapper(statements):
            _sleep_until(command["start_at"])
            cpu = time.process_time()
            if profile:
                profile.enable()
            if role == "client":
                statements.step = "admission"
                _admit_loop(index, command, stats)
            else:
                _work_loop(role, command, stats, wakes, statements)
            if profile:
                profile.disable()
                profile.dump_stats(command["profile"])
            stats["cpu_seconds"] = round(time.process_time() - cpu, 3)
    finally:
        wakes.uninstall()
        settings.CONNECTOR = saved_connector
    stats.update(wakes=wakes.counts, statements=statements.counts, records=RECORDER.records)
    RECORDER.records = []
    return stats


# -- CPU by role -------------------------------------------------------------------------------------------------

class RoleCpu(BurstCpu):
    """BurstCpu over a fixed map of processes to roles (the pool's processes and the bench's own), with their
    PostgreSQL backends attributed to the role holding the connection."""

    def __init__(self, conninfo: str, databases: list[str], roles: dict[int, str]) -> None:
        super().__init__(conninfo, databases, roots={}, client_pid=os.getpid())
        self.roles = dict(roles)

    def _processes(self) -> dict[int, str]:
        return dict(self.roles)


def per_completion(cpu: dict | None, completions: int) -> dict | None:
    """{role: busy ms per completion} (every role of the window, PostgreSQL's by client role), the PostgreSQL sum,
    the total of the measured processes, and the machine (reference)."""
    if not cpu or "roles" not in cpu or completions <= 0:
        return None
    roles = cpu["roles"]
    out = {role: round(entry["ms"] / completions, 2) for role, entry in sorted(roles.items())}
    out["postgresql"] = round(sum(e["ms"] for r, e in roles.items() if r.startswith("postgresql")) / completions, 2)
    out["total"] = round(sum(e["ms"] for e in roles.values()) / completions, 2)
    if cpu.get("machine_busy_ms") is not None:
        out["machine"] = round(cpu["machine_busy_ms"] / completions, 2)
    return out


def measure_cpu(conninfo: str, databases: list[str], roles: dict[int, str], t0: float, t1: float) -> dict:
    """Sample RoleCpu from t0 to t1 in this (the parent's) thread's companion; returns the result dict."""
    import threading

    sampler = RoleCpu(conninfo, databases, roles)
    box: dict = {}

    def run() -> None:
        try:
            sampler.open()
            time.sleep(max(0.0, t0 - time.time()))
            sampler.begin()
            while time.time() < t1:
                time.sleep(max(0.0, min(0.2, t1 - time.time())))
                sampler.poll()
            box["result"] = sampler.end()
        except Exception as exc:  # noqa: BLE001 - reported, the bench goes on
            box["result"] = {"error": repr(exc)}
        finally:
            sampler.close()

    thread = threading.Thread(target=run, name="role-cpu", daemon=True)
    thread.start()
    box["thread"] = thread
    return box


# -- the control drills ------------------------------------------------------------------------------------------

def abandon_fenced_out(actor) -> int:
    """The operator's step after a revocation drill (the admin's abandon action, `dispatch.permit_abandon`): every
    `granted` permit a revocation fenced out (its credential gate fence is no longer the gate's) is abandoned with
    that proof and its effect returns to `prepared`. The product's egress step refuses such a permit and leaves it
    open (egress_batch.win_sending_batch), so without this a later halt drill could never confirm."""
    from django.db.models import F

    from bench.hot_recorder import RECORDER
    from effects.models import DispatchPermit
    from effects.services import dispatch

    done = 0
    for pk in (DispatchPermit.objects.filter(state="granted").exclude(credential_gate_fence=F("credential_gate__fence"))
               .order_by("pk").values_list("pk", flat=True)):
        outcome, _ = RECORDER.op("permit_abandon", lambda pk=pk: dispatch.permit_abandon(permit_pk=pk, actor=actor))
        done += outcome == "ok"
    return done


def cmd_control(index: int, command: dict) -> dict:
    """The classic mix's drills (`_cmd_control`), with the operator's abandonment of fenced-out permits after each
    re-enablement and before each halt confirmation attempt."""
    from connector.actors import Actor
    from connector.services import gates
    from bench.hot_client import _cmd_control

    actor = Actor.system("bench-hot-account-operator")
    saved = gates.credential_gate_transition, gates.gate_transition
    abandoned = [0]

    def credential_gate_transition(**kwargs):
        out = saved[0](**kwargs)
        if kwargs.get("action") == "reenable":
            abandoned[0] += abandon_fenced_out(actor)
        return out

    def gate_transition(**kwargs):
        if kwargs.get("action") == "confirm_halted":
            abandoned[0] += abandon_fenced_out(actor)
        return saved[1](**kwargs)

    gates.credential_gate_transition, gates.gate_transition = credential_gate_transition, gate_transition
    try:
        result = _cmd_control(index, command)
    finally:
        gates.credential_gate_transition, gates.gate_transition = saved
    result["abandoned"] = abandoned[0]
    return result
