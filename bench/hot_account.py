"""`manage.py bench hot-account`: capacity of the complete transaction mix against ONE account (CV2-14-001..004,
CV2-14-008), on PostgreSQL, with a raw psycopg baseline and a procrastinate peer baseline.

For each client count N the run spawns N client processes (multiprocessing, 'spawn' context, each with its own
database connection). Each loops over the complete mix for one account of the demo world (push=True) for a fixed
duration:

  transport_admission     receipt_admit of a fresh key (1-event webhook body)
  materialization         receipt_materialize of that Receipt
  lane_advance            lane_advance of the new lane (mints the Execution)
  execution_claim         execution_claim for the account (FOR UPDATE SKIP LOCKED)
  runtime_completion      execution_run: Runtime applies the record and authors the outbound command, then the
                          result is recorded (lane high-water advances)
  outbound_authoring      the authoring call inside Runtime's transaction (timed inside runtime_completion)
  effect_claim            effect_claim for the account
  permit_acquire          DispatchPermit acquisition (guard + credential dispatch gate FOR SHARE)
  egress_send             the sole egress adapter: granted -> sending, HTTP to the loopback receiver, settlement
  permit_settlement       permit_settle (timed inside egress_send)
  effect_finalize         remote_confirmed -> finalized with the RemoteLink
  replay_admission        every 2nd round (about every 20th operation): replay_request_admit of an already-
                          completed event
  replay_materialization  its receipt_materialize
  permit_abandon          only when egress refused a granted permit (revocation fenced it out)

One control process meanwhile revokes and re-enables the outbound credential generation (credential_revoke,
credential_reenable) and runs a halt cycle (halt_v2, confirm_halted retried until the open-permit set is empty,
resume_predecessor). Operations refused because of those (GateNotServing, PermitRefused, EgressRefused, and
claims that found nothing while the gate was not serving) are availability rejections, counted per class; work a
client could not finish is retried after the gate serves again.

Gate-lock wait is measured in the processes by wrapping connector.locks.serving_for_share (the guard's one
round trip) / epoch_for_share / gate_for_update (and, separately, the credential dispatch gate's share/update locks) with timers: the time of
those locking statements, summed per operation (nested operations count it in both). The product is unchanged.

After the mix, the same N processes run a product admission-only phase, then the raw baseline (the serving
guard's lock-insert-update shape in psycopg 3 without Django, on `raw_` tables) and then the peer baseline
(procrastinate deferring and working as many trivial jobs as the product completed executions).
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import multiprocessing
import os
import queue as queue_module
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import BUDGETS_PATH, load_budgets
from bench.cpu import busy_percent, cpu_sample
from bench.options import integer_list

Progress = Callable[[str], None]

CLIENT_CLASSES = (
    "transport_admission", "materialization", "lane_advance", "execution_claim", "runtime_completion",
    "outbound_authoring", "effect_claim", "permit_acquire", "egress_send", "permit_settlement", "effect_finalize",
    "replay_admission", "replay_materialization", "permit_abandon",
)
CONTROL_CLASSES = ("credential_revoke", "credential_reenable", "halt_v2", "confirm_halted", "resume_predecessor")
ALL_CLASSES = CLIENT_CLASSES + CONTROL_CLASSES
# Classes every run must show with a nonzero count (permit_abandon happens only if a revocation fences out a permit
# between acquisition and egress).
REQUIRED_CLASSES = tuple(c for c in ALL_CLASSES if c != "permit_abandon")
# What each control transition's FOR UPDATE waits for (budgets_from_reports).
GATE_WAITS_FOR = {"halt_v2": "runtime_completion", "confirm_halted": "runtime_completion",
                  "resume_predecessor": "runtime_completion", "credential_revoke": "permit_acquire",
                  "credential_reenable": "permit_acquire"}
# Classes with a throughput floor in the budget (the client mix; control transitions run once per run).
THROUGHPUT_CLASSES = tuple(c for c in CLIENT_CLASSES if c != "permit_abandon")
REPLAY_EVERY = 2  # rounds: a round is about 10 operations, so a replay admission every ~20th operation
REJECTION_SLACK_SECONDS = 1.0  # a rejection this long after a control window closed is still accounted to it
REJECTION_BACKOFF_SECONDS = 0.02
DEFAULT_DATABASE = "connector_bench_hot"
PEER_QUEUE_PREFIX = "bench_hot_"


# =================================================================================================================
# statistics
# =================================================================================================================

def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max/mean of `values` (inclusive quantiles, as `bench history`); zeros when empty."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
    if len(ordered) == 1:
        v = ordered[0]
        return {"p50": v, "p95": v, "p99": v, "max": v, "mean": v}
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"p50": cuts[49], "p95": cuts[94], "p99": cuts[98], "max": ordered[-1], "mean": statistics.fmean(ordered)}


def _r(value: float, digits: int = 2) -> float:
    return round(float(value), digits)


# =================================================================================================================
# in-process recording (client and control processes)
# =================================================================================================================

class Recorder:
    """Records one tuple per operation attempt: (class, latency ms, gate-lock ms, credential-gate-lock ms,
    outcome, detail, wall time). Outcomes: ok, rejected (detail = exception class), empty, blocked, race,
    deadlock, error (detail = message)."""

    def __init__(self) -> None:
        self.records: list[tuple] = []
        self.enabled = True
        self.stack: list[list[float]] = []  # [gate ms, credential-gate ms] of every operation in progress
        self.names: list[str] = []  # the classes of the operations in progress (innermost last)

    def add_lock_time(self, index: int, ms: float) -> None:
        for frame in self.stack:
            frame[index] += ms

    def op(self, cls: str, fn: Callable[[], object], *, expected: tuple = ()) -> tuple[str, object]:
        """Run `fn` as one operation of class `cls`, classify how it ended, record it. Returns (outcome, value)."""
        from django.db import IntegrityError, OperationalError
        from psycopg import errors as pg_errors

        from connector.errors import FenceStale, GateNotServing
        from effects.errors import EgressRefused, PermitRefused

        frame = [0.0, 0.0]
        self.stack.append(frame)
        self.names.append(cls)
        value, outcome, detail = None, "ok", ""
        began = time.perf_counter()
        try:
            value = fn()
        except (GateNotServing, PermitRefused, EgressRefused) as exc:
            outcome, detail = "rejected", type(exc).__name__
        except FenceStale:
            outcome, detail = "race", "FenceStale"
        except expected as exc:
            outcome, detail = "blocked", type(exc).__name__
        except (OperationalError, IntegrityError) as exc:
            cause = exc.__cause__
            if isinstance(cause, pg_errors.DeadlockDetected):
                outcome, detail = "deadlock", str(cause).splitlines()[0][:200]
            elif isinstance(cause, (pg_errors.SerializationFailure, pg_errors.LockNotAvailable)):
                outcome, detail = "race", type(cause).__name__
            else:
                outcome, detail = "error", f"{type(exc).__name__}: {exc}"[:300]
        except Exception as exc:  # noqa: BLE001 - every other failure is counted as an error of its class
            outcome, detail = "error", f"{type(exc).__name__}: {exc}"[:300]
        finally:
            elapsed = (time.perf_counter() - began) * 1000
            self.stack.pop()
            self.names.pop()
        if self.enabled:
            self.records.append((cls, elapsed, frame[0], frame[1], outcome, detail, time.time()))
        return outcome, value

    def reclassify_last(self, cls: str, outcome: str, detail: str) -> None:
        if self.enabled and self.records and self.records[-1][0] == cls:
            last = self.records[-1]
            self.records[-1] = (*last[:4], outcome, detail, last[6])

    def note(self, cls: str, outcome: str, detail: str = "") -> None:
        """A retry or race observed without a failed attempt (e.g. a duplicate resolution)."""
        if self.enabled:
            self.records.append((cls, None, 0.0, 0.0, outcome, detail, time.time()))


RECORDER = Recorder()


def _install_timers() -> None:
    """Wrap the gate/epoch and credential-gate lock functions and the two nested operations (outbound authoring
    inside Runtime, permit settlement inside egress) with timers. Bench processes only."""
    from connector import hooks, locks
    from effects.services import dispatch

    def timed_lock(fn, index):
        def wrapper(*args, **kwargs):
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                RECORDER.add_lock_time(index, (time.perf_counter() - began) * 1000)
        wrapper.__wrapped__ = fn
        return wrapper

    for name in ("serving_for_share", "epoch_for_share", "gate_for_update", "epoch_for_update"):
        setattr(locks, name, timed_lock(getattr(locks, name), 0))
    for name in ("credential_gate_for_share", "credential_gate_for_update"):
        setattr(locks, name, timed_lock(getattr(locks, name), 1))
    # A new transport receipt takes the guard's locks inside its one statement (connector_receipt_admit, D-201):
    # the statement's whole time is counted as its lock time, an upper bound of the wait.
    from connector.services import admission

    admission._admit_statement = timed_lock(admission._admit_statement, 0)

    hooks.author_outbound = _nested("outbound_authoring", hooks.author_outbound)
    dispatch.permit_settle = _nested("permit_settlement", dispatch.permit_settle)


def _nested(cls: str, fn: Callable):
    """A timer for an operation that runs inside another one: records it, then returns its value or re-raises its
    exception unchanged."""
    def wrapper(*args, **kwargs):
        box: dict = {}

        def call():
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as exc:
                box["exc"] = exc
                raise
            return box["value"]
        RECORDER.op(cls, call)
        if "exc" in box:
            raise box["exc"]
        return box["value"]
    wrapper.__wrapped__ = fn
    return wrapper


# =================================================================================================================
# bench processes
# =================================================================================================================

def _bootstrap(setup: dict) -> None:
    """Django in a spawned bench process: the throwaway databases, the secret directory and egress URL of the
    parent, quiet logs, the timers."""
    os.environ["DJANGO_SETTINGS_MODULE"] = setup["settings_module"]
    os.environ["CONNECTOR_EGRESS_BASE_URL"] = setup["connector"]["EGRESS_BASE_URL"]
    import django

    django.setup()
    from django.conf import settings
    from django.db import connections

    settings.DEBUG = False
    for alias, name in setup["names"].items():
        connections[alias].settings_dict["NAME"] = name
    settings.CONNECTOR = {**settings.CONNECTOR, **setup["connector"]}
    for name in ("connector", "effects", "cutover", "procrastinate", "httpx", "httpcore", "django.db.backends"):
        logging.getLogger(name).setLevel(logging.WARNING)
    _install_timers()


def process_setup(egress_url: str) -> dict:
    """What a spawned bench process needs from its parent (`_bootstrap`): the settings module, the databases the
    parent's connections point at, the secret directory and the egress URL of the loopback receiver."""
    from django.conf import settings
    from django.db import connections

    return {"settings_module": os.environ.get("DJANGO_SETTINGS_MODULE") or settings.SETTINGS_MODULE,
            "names": {alias: connections[alias].settings_dict["NAME"] for alias in ("default", "journal")},
            "connector": {"EGRESS_BASE_URL": egress_url,
                          "SECRET_BACKEND_DIR": settings.CONNECTOR["SECRET_BACKEND_DIR"],
                          "EGRESS_TIMEOUT_SECONDS": settings.CONNECTOR.get("EGRESS_TIMEOUT_SECONDS", 5)}}


def _process_main(index: int, setup: dict, inbox, outbox) -> None:
    """A bench process: bootstrap once, then run each command from `inbox` and put its result on `outbox`."""
    try:
        _bootstrap(setup)
        outbox.put(("ready", index, None))
    except BaseException:  # noqa: BLE001
        outbox.put(("failed", index, traceback.format_exc()))
        return
    while True:
        command = inbox.get()
        if command is None:
            break
        try:
            handlers = {"warm": _cmd_warm, "mix": _cmd_mix, "control": _cmd_control, "admission": _cmd_admission,
                        "batch": _cmd_batch, "raw": _cmd_raw, "peer": _cmd_peer}
            # "call": a command of another bench module run in this pool ("module:function", e.g. bench.overhead)
            handler = handlers.get(command["kind"]) or _imported(command["target"])
            outbox.put(("result", index, handler(index, command)))
        except BaseException:  # noqa: BLE001
            outbox.put(("failed", index, traceback.format_exc()))
        finally:
            from django.db import connections

            connections.close_all()


def _imported(target: str) -> Callable[[int, dict], dict]:
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _sleep_until(at: float) -> None:
    delay = at - time.time()
    if delay > 0:
        time.sleep(delay)


class Client:
    """One client process's loop over the complete mix against one account."""

    def __init__(self, index: int, command: dict) -> None:
        from connector.actors import Actor
        from connector.models import AccountServingGate
        from effects.services import dispatch

        self.index = index
        self.account_id = command["account_id"]
        self.account_key = command["account_key"]
        self.tag = f"{command['tag']}-c{index}"
        self.actor = Actor.system("bench-hot-account")
        self.holder = dispatch.holder_register(holder_id=f"bench-{self.tag}-{os.getpid()}")
        gate = AccountServingGate.objects.select_related("epoch").get(account_id=self.account_id)
        self.epoch_id, self.epoch_digest = gate.epoch.epoch_id, bytes(gate.epoch.digest)
        self.pending_materialize: list[tuple[str, int]] = []
        self.pending_lanes: list[int] = []
        self.pending_tokens: list = []
        self.pending_claims: list = []
        self.rounds = 0
        self.replay_every = int(command.get("replay_every") or REPLAY_EVERY)

    # -- helpers ---------------------------------------------------------------------------------------------
    def _gate_serving(self) -> bool:
        from connector.models import AccountServingGate

        mode = AccountServingGate.objects.filter(account_id=self.account_id).values_list("mode", flat=True).first()
        return mode == "v2_serving"

    def _empty_or_rejected(self, cls: str) -> str:
        """A claim that found nothing: an availability rejection if the gate was not serving, else empty."""
        if self._gate_serving():
            RECORDER.reclassify_last(cls, "empty", "")
            return "empty"
        RECORDER.reclassify_last(cls, "rejected", "GateNotServing(claim skipped)")
        return "rejected"

    # -- the chain -------------------------------------------------------------------------------------------
    def materialize(self, receipt_pk: int, cls: str = "materialization") -> str:
        from connector import tracing
        from connector.models import ReceiptTrace
        from connector.services.materialize import receipt_materialize

        # As the materialize task's entry point does: a span continuing the receipt's stored trace (tracing off: a
        # shared no-op; `bench overhead` turns it on).
        with tracing.stage("receipt_materialize", ReceiptTrace, receipt_id=receipt_pk):
            outcome, out = RECORDER.op(cls, lambda: receipt_materialize(receipt_pk=receipt_pk))
        if outcome == "rejected":
            self.pending_materialize.append((cls, receipt_pk))
        elif outcome == "ok" and cls == "materialization":
            for lane in sorted(out.lanes):
                self.advance(lane)
        return outcome

    def advance(self, lane_pk: int) -> str:
        from connector.services.execution import lane_advance

        outcome, minted = RECORDER.op("lane_advance", lambda: lane_advance(lane_pk=lane_pk))
        if outcome == "rejected":
            self.pending_lanes.append(lane_pk)
        elif outcome == "ok" and minted is None:
            RECORDER.reclassify_last("lane_advance", "empty", "")
        return outcome

    def claim_and_run(self) -> str:
        from connector.services.execution import execution_claim

        outcome, token = RECORDER.op("execution_claim", lambda: execution_claim(
            holder=f"bench-{self.tag}", lease_seconds=60, account_id=self.account_id))
        if outcome == "ok" and token is None:
            return self._empty_or_rejected("execution_claim")
        if outcome != "ok":
            return outcome
        return self.run(token)

    def run(self, token) -> str:
        from connector.services.execution import execution_run

        outcome, _ = RECORDER.op("runtime_completion", lambda: execution_run(token=token))
        if outcome == "rejected":
            self.pending_tokens.append(token)
        return outcome

    def dispatch(self) -> str:
        from effects.services import dispatch

        outcome, claim = RECORDER.op("effect_claim", lambda: dispatch.effect_claim(
            holder=self.holder, lease_seconds=60, account_id=self.account_id))
        if outcome == "ok" and claim is None:
            return self._empty_or_rejected("effect_claim")
        if outcome != "ok":
            return outcome
        return self.acquire_and_send(claim)

    def acquire_and_send(self, claim) -> str:
        from effects import egress_batch
        from effects.services import dispatch

        outcome, permit = RECORDER.op("permit_acquire", lambda: dispatch.permit_acquire(claim=claim))
        if outcome == "rejected":
            self.pending_claims.append(claim)
            return outcome
        if outcome != "ok":
            return outcome
        outcome, effect = RECORDER.op("egress_send", lambda: egress_batch.send(
            permit_pk=permit.pk, holder_id=self.holder.holder_id, holder_fence=permit.holder_fence,
            credential_gate_fence=permit.credential_gate_fence))
        if outcome == "rejected":
            # A revocation fenced this granted permit out: abandon it with that proof (the effect returns to
            # `prepared` and is claimed again), so the open-permit set drains and the halt can complete.
            RECORDER.op("permit_abandon", lambda: dispatch.permit_abandon(permit_pk=permit.pk, actor=self.actor))
            return outcome
        if outcome != "ok":
            return outcome
        if effect.state == "remote_confirmed":
            slot = effect.command.path.rstrip("/").rsplit("/", 1)[-1]
            outcome, _ = RECORDER.op("effect_finalize", lambda: dispatch.effect_finalize(effect_pk=effect.pk,
                                                                                         owner_slot=slot))
        return outcome

    def replay(self, tag: str) -> str:
        from connector.models import Execution, ReceiptComponent
        from connector.services.replay import replay_request_admit

        # Untimed: the newest completed transport event of the account and its exact component bytes.
        event_id = (Execution.objects.filter(account_id=self.account_id, state="completed",
                                             projection__suppress_external_effects=False)
                    .order_by("-pk").values_list("projection__event_id", flat=True).first())
        if event_id is None:
            return "empty"
        payload = ReceiptComponent.objects.filter(event_id=event_id, disposition="event").values_list(
            "payload", flat=True).first()
        outcome, admission = RECORDER.op("replay_admission", lambda: replay_request_admit(
            account_key=self.account_key, request_id=f"bench-replay-{tag}", target_epoch_id=self.epoch_id,
            target_epoch_digest=self.epoch_digest, predecessor_event_id=event_id,
            predecessor_payload_digest=hashlib.sha256(bytes(payload)).digest(),
            reason="bench hot-account: replay of a completed event", principal="bench-hot-account",
            mode="suppress_external_effects", actor=self.actor))
        if outcome == "ok":
            if admission.outcome != "created":
                RECORDER.note("replay_admission", "race", f"resolved as {admission.outcome}")
            return self.materialize(admission.receipt.pk, "replay_materialization")
        return outcome

    def retry_pending(self) -> bool:
        """Retry work refused while the gate or the credential was unavailable. False if still refused."""
        for items, attempt in ((self.pending_materialize, lambda item: self.materialize(item[1], item[0])),
                               (self.pending_lanes, self.advance), (self.pending_tokens, self.run),
                               (self.pending_claims, self.acquire_and_send)):
            while items:
                item = items.pop(0)
                if attempt(item) == "rejected":
                    return False  # `attempt` queued the item again
        return True

    def round(self) -> None:
        from connector import tracing
        from connector.demo import DEMO_CHANNEL, demo_event_body
        from connector.services.admission import receipt_admit

        rejected = not self.retry_pending()
        tag = f"{self.tag}-{self.rounds}"
        self.rounds += 1
        with tracing.server_span("receipt_admit", {}):  # as the admission view: a new trace (off: a no-op)
            outcome, admission = RECORDER.op("transport_admission", lambda: receipt_admit(
                account_key=self.account_key, channel=DEMO_CHANNEL, transport_key=f"bench-{tag}",
                body=demo_event_body(tag), actor=self.actor))
        if outcome == "ok":
            if admission.outcome != "created":
                RECORDER.note("transport_admission", "race", f"resolved as {admission.outcome}")
            outcome = self.materialize(admission.receipt.pk)
        rejected = rejected or outcome == "rejected"
        rejected = self.claim_and_run() == "rejected" or rejected
        rejected = self.dispatch() == "rejected" or rejected
        if self.rounds % self.replay_every == 0:
            rejected = self.replay(tag) == "rejected" or rejected
        if rejected:
            time.sleep(REJECTION_BACKOFF_SECONDS)

    def drain(self, until: float) -> None:
        """Untimed: finish refused work and dispatch what this client left, so the next run starts clean."""
        saved, RECORDER.enabled = RECORDER.enabled, False
        try:
            while time.time() < until and (self.pending_materialize or self.pending_lanes or self.pending_tokens
                                           or self.pending_claims):
                if not self.retry_pending():
                    time.sleep(0.05)
        finally:
            RECORDER.enabled = saved


def _cmd_warm(index: int, command: dict) -> dict:
    """Untimed rounds (route and mapping caches, prepared connections) before the first measured run."""
    if command.get("role") == "control":
        from connector.models import AccountServingGate

        AccountServingGate.objects.filter(account_id=command["account_id"]).exists()
        return {"warm": 0}
    RECORDER.enabled = False
    try:
        client = Client(index, command)
        for _ in range(command["rounds"]):
            client.round()
        client.drain(time.time() + 10)
        return {"warm": client.rounds}
    finally:
        RECORDER.enabled = True
        RECORDER.records = []


def _cmd_mix(index: int, command: dict) -> dict:
    """The measured loop of one client. `profile` (a file name): the loop runs under cProfile, dumped there, and
    the statements it sends are counted by the innermost operation class in progress (`statements`)."""
    import cProfile

    from django.db import connection

    RECORDER.records = []
    client = Client(index, command)
    statements: dict[str, int] = {}

    def count(execute, sql, params, many, context):
        cls = RECORDER.names[-1] if RECORDER.names else "untimed"
        statements[cls] = statements.get(cls, 0) + 1
        return execute(sql, params, many, context)

    profile = cProfile.Profile(time.process_time) if command.get("profile") else None  # CPU, not wall time
    _sleep_until(command["start_at"])
    began, cpu = time.time(), time.process_time()
    with connection.execute_wrapper(count) if profile else contextlib.nullcontext():
        if profile:
            profile.enable()
        while time.time() < command["deadline"]:
            client.round()
        if profile:
            profile.disable()
            profile.dump_stats(command["profile"])
    ended, cpu = time.time(), time.process_time() - cpu
    records, RECORDER.records = RECORDER.records, []
    client.drain(ended + 15)
    return {"records": records, "rounds": client.rounds, "began": began, "ended": ended, "cpu_seconds": cpu,
            "left_pending": len(client.pending_materialize) + len(client.pending_lanes)
            + len(client.pending_tokens) + len(client.pending_claims), "statements": statements}


def _cmd_control(index: int, command: dict) -> dict:
    """Credential revocation + re-enablement at 25% of the run, a halt cycle at 55%; each held for `hold`. With
    `drills` = k > 1 the run is cut into k equal periods and each period gets both drills at 25% and 55% of it,
    so the control transitions' p99 under the mix (issue 18, goal 6) rests on k samples each."""
    from connector.actors import Actor
    from connector.errors import TransitionRefused
    from connector.services.gates import credential_gate_transition, gate_transition

    RECORDER.records = []
    actor = Actor.system("bench-hot-account-control")
    start, seconds, hold = command["start_at"], command["seconds"], command["hold"]
    account_id, generation = command["account_id"], command["credential_generation"]
    windows, problems = [], []
    result = {"windows": windows, "problems": problems, "confirm_attempts": 0, "drain_ms": None}

    def transition(cls, fn, *, expected=(), tries=50):
        for _ in range(tries):
            outcome, value = RECORDER.op(cls, fn, expected=expected)
            if outcome == "ok":
                return value
            if outcome == "blocked":
                return None
            time.sleep(0.01)
        problems.append(f"{cls} did not succeed after {tries} tries")
        return None

    drills = int(command.get("drills", 1))
    period = seconds / drills
    for k in range(drills):
        cycle = start + k * period
        _sleep_until(cycle + 0.25 * period)
        opened = time.time()
        transition("credential_revoke", lambda: credential_gate_transition(
            generation_id=generation, action="revoke", expected_fence=None, actor=actor,
            reason="bench hot-account: revocation drill"))
        time.sleep(hold)
        transition("credential_reenable", lambda: credential_gate_transition(
            generation_id=generation, action="reenable", expected_fence=None, actor=actor,
            reason="bench hot-account: explicit re-enablement after the drill"))
        windows.append(["credential", opened, time.time()])

        _sleep_until(cycle + 0.55 * period)
        opened = time.time()
        halted = transition("halt_v2", lambda: gate_transition(
            account_id=account_id, action="halt_v2", expected_fence=None, actor=actor,
            reason="bench hot-account: halt drill"))
        drain = None
        if halted is not None:
            halt_committed = time.time()
            give_up = command["deadline"] + 30
            while True:
                result["confirm_attempts"] += 1
                outcome, _ = RECORDER.op("confirm_halted", lambda: gate_transition(
                    account_id=account_id, action="confirm_halted", expected_fence=None, actor=actor,
                    reason="bench hot-account: open-permit set is empty"), expected=(TransitionRefused,))
                if outcome == "ok":
                    drain = (time.time() - halt_committed) * 1000
                    result["drain_ms"] = max(result["drain_ms"] or 0.0, drain)  # the longest drain of the run
                    break
                if time.time() > give_up:
                    problems.append(f"confirm_halted still refused after {result['confirm_attempts']} attempts")
                    break
                time.sleep(0.01)
            if drain is not None:
                time.sleep(hold)
                transition("resume_predecessor", lambda: gate_transition(
                    account_id=account_id, action="resume_predecessor", expected_fence=None, actor=actor,
                    reason="bench hot-account: resume after the drill"))
        windows.append(["halt", opened, time.time()])
    records, RECORDER.records = RECORDER.records, []
    result["records"] = records
    return result


def _cmd_admission(index: int, command: dict) -> dict:
    """Product admission only (receipt_admit with fresh keys), for the comparison with the raw baseline."""
    from connector.actors import Actor
    from connector.demo import DEMO_CHANNEL, demo_event_body
    from connector.services.admission import receipt_admit

    actor = Actor.system("bench-hot-account")
    latencies, failures, n = [], 0, 0
    tag = f"{command['tag']}-a{index}"
    _sleep_until(command["start_at"])
    while time.time() < command["deadline"]:
        key = f"{tag}-{n}"
        n += 1
        began = time.perf_counter()
        try:
            receipt_admit(account_key=command["account_key"], channel=DEMO_CHANNEL, transport_key=f"bench-{key}",
                          body=demo_event_body(key), actor=actor)
        except Exception:  # noqa: BLE001
            failures += 1
            continue
        latencies.append((time.perf_counter() - began) * 1000)
    return {"latencies": latencies, "failures": failures}


BATCH_EVENTS = 100  # events per receipt of the "batch receipt" phase (issue 18, goal 2)
BATCH_GOAL_EVENTS_PER_S = 2000.0  # issue 18, goal 2: reported beside the measured figure, not the budget floor


def batch_body(tag: str, events: int) -> bytes:
    """One demo webhook delivery carrying `events` events, each for its own record (so each opens its own lane:
    the widest receipt materialization can meet)."""
    return json.dumps({"events": [
        {"id": f"bench-ev-{tag}-{i}", "type": "record.updated", "record_id": f"bench-r-{tag}-{i}", "sequence": 1,
         "occurred_at": "2025-01-01T00:00:00Z", "data": {"name": f"Bench {tag} {i}", "email": f"{tag}.{i}@example.com"}}
        for i in range(events)]}, sort_keys=True).encode()


def _cmd_batch(index: int, command: dict) -> dict:
    """Batch receipts (issue 18, goal 2): admit an N-event receipt with a fresh key and materialize it, in a
    loop; each sample is one receipt's admission + materialization time. Events per second = events admitted
    and materialized / phase seconds."""
    from connector.actors import Actor
    from connector.demo import DEMO_CHANNEL
    from connector.services.admission import receipt_admit
    from connector.services.materialize import receipt_materialize

    actor = Actor.system("bench-hot-account")
    events = int(command["events"])
    latencies, failures, n, materialized = [], 0, 0, 0
    tag = f"{command['tag']}-b{index}"
    for i in range(int(command.get("warm", 2))):  # untimed: route caches, the connection, the first lanes' pages
        receipt_materialize(receipt_pk=receipt_admit(
            account_key=command["account_key"], channel=DEMO_CHANNEL, transport_key=f"bench-{tag}-w{i}",
            body=batch_body(f"{tag}-w{i}", events), actor=actor).receipt.pk)
    began = time.time()
    deadline = began + float(command["seconds"])
    while time.time() < deadline:
        key = f"{tag}-{n}"
        body = batch_body(key, events)
        n += 1
        t0 = time.perf_counter()
        try:
            admission = receipt_admit(account_key=command["account_key"], channel=DEMO_CHANNEL,
                                      transport_key=f"bench-{key}", body=body, actor=actor)
            out = receipt_materialize(receipt_pk=admission.receipt.pk)
        except Exception:  # noqa: BLE001
            failures += 1
            continue
        latencies.append((time.perf_counter() - t0) * 1000)
        materialized += len(out.events)
    return {"latencies": latencies, "failures": failures, "events": materialized, "began": began,
            "ended": time.time()}


# -- raw baseline -------------------------------------------------------------------------------------------------

RAW_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS raw_epoch (id bigint PRIMARY KEY, state text NOT NULL, digest bytea NOT NULL)",
    ("CREATE TABLE IF NOT EXISTS raw_gate (account_id bigint PRIMARY KEY, mode text NOT NULL, fence bigint NOT NULL,"
     " epoch_id bigint NOT NULL REFERENCES raw_epoch (id), epoch_digest bytea NOT NULL)"),
    ("CREATE TABLE IF NOT EXISTS raw_receipt (id bigserial PRIMARY KEY, account_id bigint NOT NULL,"
     " epoch_id bigint NOT NULL REFERENCES raw_epoch (id) DEFERRABLE INITIALLY DEFERRED, gate_fence bigint NOT NULL,"
     " channel text NOT NULL, payload bytea NOT NULL, payload_digest bytea NOT NULL,"
     " created_at timestamptz NOT NULL DEFAULT now())"),
    ("CREATE TABLE IF NOT EXISTS raw_admission_key (id bigserial PRIMARY KEY, account_id bigint NOT NULL,"
     " channel text NOT NULL, transport_key text NOT NULL,"
     " receipt_id bigint NOT NULL REFERENCES raw_receipt (id) DEFERRABLE INITIALLY DEFERRED,"
     " CONSTRAINT raw_admission_key_unique UNIQUE (account_id, channel, transport_key))"),
    "CREATE TABLE IF NOT EXISTS raw_counter (id bigint PRIMARY KEY, n bigint NOT NULL)",
    "INSERT INTO raw_epoch VALUES (1, 'active', sha256('raw-epoch'::bytea)) ON CONFLICT DO NOTHING",
    "INSERT INTO raw_gate VALUES (1, 'v2_serving', 1, 1, sha256('raw-epoch'::bytea)) ON CONFLICT DO NOTHING",
]
RAW_TABLES = ("raw_admission_key", "raw_receipt", "raw_counter", "raw_gate", "raw_epoch")


def analyze(conninfo: str, say) -> None:
    """ANALYZE after the untimed warm-up, before anything is measured (D-403): the throwaway database was built
    empty, and autovacuum (naptime 60 s) would not have analyzed its tables before the measured window, so the
    planner would still believe the effects, commands and executions tables hold a row or two and plan a join by
    id as a scan of the whole account (seen: the egress claim's candidate read 7-11 ms instead of 0.1-0.5). A
    running system plans with the statistics autovacuum keeps; the window measures that system."""
    import psycopg

    started = time.monotonic()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("ANALYZE")
    say(f"ANALYZE after the warm-up: {time.monotonic() - started:.2f} s (D-403)")


def raw_schema_create(conninfo: str, clients: int) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        for statement in RAW_SCHEMA:
            conn.execute(statement)
        for i in range(clients + 1):
            conn.execute("INSERT INTO raw_counter VALUES (%s, 0) ON CONFLICT DO NOTHING", [i])


def raw_schema_drop(conninfo: str) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS " + ", ".join(RAW_TABLES))


def _cmd_raw(index: int, command: dict) -> dict:
    """The serving guard's lock-insert-update shape in psycopg 3, one transaction per operation: the epoch row
    FOR SHARE, the gate row FOR SHARE (the guard's order), a receipt-like row, an admission-key-like row under a
    unique constraint, and an UPDATE of the client's counter row."""
    import psycopg
    from psycopg import errors as pg_errors

    from connector.demo import demo_event_body

    counter = 0 if command.get("shared_counter") else index + 1
    latencies, deadlocks, races, failures, n = [], 0, 0, 0, 0
    tag = f"{command['tag']}-r{index}"
    with psycopg.connect(command["conninfo"]) as conn:
        _sleep_until(command["start_at"])
        while time.time() < command["deadline"]:
            key = f"{tag}-{n}"
            n += 1
            body = demo_event_body(key)
            began = time.perf_counter()
            try:
                with conn.transaction():
                    conn.execute("SELECT id, state, digest FROM raw_epoch WHERE id = 1 FOR SHARE").fetchone()
                    gate = conn.execute("SELECT mode, fence, epoch_id, epoch_digest FROM raw_gate "
                                        "WHERE account_id = 1 FOR SHARE").fetchone()
                    if gate[0] != "v2_serving":
                        raise RuntimeError("raw gate not serving")
                    receipt_id = conn.execute(
                        "INSERT INTO raw_receipt (account_id, epoch_id, gate_fence, channel, payload, payload_digest)"
                        " VALUES (1, %s, %s, 'raw', %s, %s) RETURNING id",
                        [gate[2], gate[1], body, hashlib.sha256(body).digest()]).fetchone()[0]
                    conn.execute("INSERT INTO raw_admission_key (account_id, channel, transport_key, receipt_id) "
                                 "VALUES (1, 'raw', %s, %s)", [key, receipt_id])
                    conn.execute("UPDATE raw_counter SET n = n + 1 WHERE id = %s", [counter])
            except pg_errors.DeadlockDetected:
                deadlocks += 1
                continue
            except (pg_errors.UniqueViolation, pg_errors.SerializationFailure):
                races += 1
                continue
            except Exception:  # noqa: BLE001
                failures += 1
                continue
            latencies.append((time.perf_counter() - began) * 1000)
    return {"latencies": latencies, "deadlocks": deadlocks, "races": races, "failures": failures}


# -- peer baseline (procrastinate) -------------------------------------------------------------------------------

def peer_schema_apply(conninfo: str) -> None:
    """procrastinate's schema through its own API (`App.schema_manager.apply_schema_async`) with its psycopg
    connector, once per database."""
    import psycopg
    from procrastinate import App, PsycopgConnector

    with psycopg.connect(conninfo, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0] is not None:
            return

    async def apply() -> None:
        app = App(connector=PsycopgConnector(conninfo=conninfo, min_size=1, max_size=1))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(apply())


def _cmd_peer(index: int, command: dict) -> dict:
    """Defer this process's share of trivial jobs (one transaction each), then work the queue until it is caught
    up (procrastinate worker, concurrency 1, wait=False)."""
    from procrastinate import App, PsycopgConnector

    queue_name = command["queue"]

    async def run() -> dict:
        app = App(connector=PsycopgConnector(conninfo=command["conninfo"], min_size=1, max_size=2))

        @app.task(name="bench_hot_noop", queue=queue_name)
        def noop(i: int) -> None:
            return None

        async with app.open_async():
            _sleep_until(command["start_at"])
            began = time.time()
            for i in range(command["jobs"]):
                await noop.defer_async(i=i)
            deferred = time.time()
            await app.run_worker_async(queues=[queue_name], wait=False, concurrency=1, listen_notify=False,
                                       install_signal_handlers=False, delete_jobs="never",
                                       fetch_job_polling_interval=0.05, name=f"bench-{index}")
            return {"began": began, "deferred": deferred, "ended": time.time(), "jobs": command["jobs"]}

    return asyncio.run(run())


# =================================================================================================================
# the parent: process pool, phases, report
# =================================================================================================================

class Pool:
    """`size` bench processes (spawn), each bootstrapped once; commands go to chosen members."""

    def __init__(self, size: int, setup: dict, say: Progress, *, shared: int = 0) -> None:
        """`shared` > 0: every process holds the product mode's shared counters and wake-up semaphores for that many
        materialization slots (`self.shared`, bench.mix_product.Shared)."""
        ctx = multiprocessing.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(size)]
        self.shared = None
        target = _process_main
        if shared:
            from bench.mix_product import Shared, process_main as target

            self.shared = Shared(ctx, shared)
        extra = (self.shared,) if shared else ()
        self.processes = [ctx.Process(target=target, args=(i, setup, self.inboxes[i], self.outbox, *extra),
                                      name=f"bench-hot-{i}", daemon=True) for i in range(size)]
        say(f"starting {size} bench processes (spawn)")
        for p in self.processes:
            p.start()
        self._collect(range(size), timeout=180, what="bootstrap")

    def _collect(self, indexes, *, timeout: float, what: str) -> dict[int, object]:
        """One answer from each of `indexes`. A failure is raised only after every member answered, so no late
        answer of this command is mistaken for one of the next."""
        wanted, results, failures = set(indexes), {}, []
        until = time.time() + timeout
        while wanted:
            try:
                kind, index, payload = self.outbox.get(timeout=max(0.1, until - time.time()))
            except queue_module.Empty:
                dead = [i for i in wanted if not self.processes[i].is_alive()]
                raise RuntimeError(f"bench processes {sorted(wanted)} gave no {what} result in {timeout:.0f} s"
                                   + (f" (dead: {dead})" if dead else "")) from None
            wanted.discard(index)
            if kind == "failed":
                failures.append(f"bench process {index} failed during {what}:\n{payload}")
            else:
                results[index] = payload
        if failures:
            raise RuntimeError("\n".join(failures))
        return results

    def run(self, commands: dict[int, dict], *, timeout: float, what: str) -> dict[int, object]:
        for index, command in commands.items():
            self.inboxes[index].put(command)
        return self._collect(commands, timeout=timeout, what=what)

    def close(self) -> None:
        for inbox in self.inboxes:
            with contextlib.suppress(Exception):
                inbox.put(None)
        for p in self.processes:
            p.join(timeout=10)
        for p in self.processes:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


def _conninfo(settings_dict: dict) -> str:
    from psycopg.conninfo import make_conninfo

    parts = {"dbname": settings_dict["NAME"], "host": settings_dict.get("HOST") or None,
             "port": settings_dict.get("PORT") or None, "user": settings_dict.get("USER") or None,
             "password": settings_dict.get("PASSWORD") or None}
    return make_conninfo(**{k: str(v) for k, v in parts.items() if v})


def summarize_classes(records: list[tuple], seconds: float) -> dict[str, dict]:
    """Per-class figures from the attempt records of one run."""
    by_class: dict[str, list[tuple]] = {c: [] for c in ALL_CLASSES}
    for rec in records:
        by_class.setdefault(rec[0], []).append(rec)
    out = {}
    for cls, recs in by_class.items():
        attempts = [r for r in recs if r[1] is not None]
        ok = [r[1] for r in attempts if r[4] == "ok"]
        lat = percentiles(ok)
        lock = percentiles([r[2] for r in attempts])
        cred = percentiles([r[3] for r in attempts])
        rejections: dict[str, int] = {}
        for r in recs:
            if r[4] == "rejected":
                rejections[r[5]] = rejections.get(r[5], 0) + 1
        errors = [r[5] for r in recs if r[4] == "error"]
        out[cls] = {
            "count": len(ok), "attempts": len(attempts),
            "throughput": _r(len(ok) / seconds if seconds else 0.0),
            "p50_ms": _r(lat["p50"]), "p95_ms": _r(lat["p95"]), "p99_ms": _r(lat["p99"]), "mean_ms": _r(lat["mean"]),
            "max_ms": _r(max((r[1] for r in attempts), default=0.0)),
            "lock_wait_p95_ms": _r(lock["p95"], 3), "lock_wait_p99_ms": _r(lock["p99"], 3),
            "lock_wait_max_ms": _r(lock["max"], 3),
            "credential_lock_wait_p99_ms": _r(cred["p99"], 3),
            "deadlocks": sum(1 for r in recs if r[4] == "deadlock"),
            "retries": sum(1 for r in recs if r[4] == "race"),
            "empty": sum(1 for r in recs if r[4] == "empty"),
            "blocked": sum(1 for r in recs if r[4] == "blocked"),
            "rejections": rejections, "rejections_total": sum(rejections.values()),
            "errors": len(errors), "error_samples": sorted(set(errors))[:5],
        }
    return out


def unaccounted_rejections(records: list[tuple], windows: list[list]) -> list[str]:
    """Rejections outside every control window (plus REJECTION_SLACK_SECONDS): availability lost for no reason."""
    found = []
    for r in records:
        if r[4] != "rejected":
            continue
        if not any(start <= r[6] <= end + REJECTION_SLACK_SECONDS for _name, start, end in windows):
            found.append(f"{r[0]} {r[5]} at {time.strftime('%H:%M:%S', time.localtime(r[6]))}")
    return found


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


def run_hot_account(*, account_key: str, clients: Sequence[int], seconds: float, raw_seconds: float,
                    peer: bool = True, shared_counter: bool = False, progress: Progress | None = None,
                    warm_rounds: int = 2, drop_raw: bool = False, replay_every: int = REPLAY_EVERY,
                    batch_events: int = BATCH_EVENTS, batch_seconds: float | None = None, drills: int = 1,
                    product: dict | None = None, classic: bool = True, profile_dir: str | None = None,
                    analyze_first: bool = True) -> dict:
    """Run the bench on the current `default` database (which must hold the push demo world with `account_key`
    v2_serving). Returns the report dict. The loopback receiver runs in this process."""
    from django.conf import settings
    from django.db import connections

    from tests.effects.receiver import Receiver

    say = progress or (lambda _msg: None)
    clients = sorted({int(c) for c in clients})
    if (not clients and not batch_events) or (clients and clients[0] < 1):
        raise ValueError("clients must be positive")
    facts = _world_facts(account_key)
    if facts["gate_mode"] != "v2_serving":
        raise ValueError(f"account {account_key} gate is {facts['gate_mode']}, not v2_serving")
    default, journal = connections["default"].settings_dict, connections["journal"].settings_dict
    conninfo = _conninfo(default)
    receiver = Receiver().start()
    saved_connector = settings.CONNECTOR
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": receiver.url}
    setup = process_setup(receiver.url)
    report = {"bench": "hot-account", "account_key": account_key, "database": default["NAME"],
              "clients": clients, "seconds": seconds, "raw_seconds": raw_seconds, "machine": machine_facts(),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": []}
    peer_reason = ""
    if peer:
        logging.getLogger("procrastinate").setLevel(logging.WARNING)
        try:
            peer_schema_apply(conninfo)
        except Exception as exc:  # noqa: BLE001 - reported, never invented
            peer_reason = f"procrastinate schema could not be applied: {type(exc).__name__}: {exc}"[:300]
    else:
        peer_reason = "not requested (--no-peer)"
    raw_schema_create(conninfo, max(clients, default=1))
    control = max(clients, default=0)
    plan = {}
    if product:  # the product mode's worker processes follow the control process (bench/mix_product.py)
        from bench.mix_product_run import worker_plan

        slots = max(1, min(int(settings.CONNECTOR.get("MATERIALIZE_SLOTS", 2)), product["workers"]["materialize"]))
        plan = worker_plan(product["workers"], control + 1, slots)
    pool = Pool(control + 1 + len(plan), setup, say, shared=slots if product else 0)
    run_tag = f"{int(time.time() * 1000):x}"
    try:
        base = {"account_id": facts["account_id"], "account_key": account_key, "replay_every": replay_every}
        if clients:
            say(f"warming up: {warm_rounds} untimed rounds per client process")
            pool.run({i: {**base, "kind": "warm", "rounds": warm_rounds, "tag": f"{run_tag}-w",
                      "role": "control" if i == control else "client"} for i in range(control + 1)},
                     timeout=120 + 10 * warm_rounds, what="warm-up")
        if product:
            from bench.mix_product_run import run_product_phase

            product_args = {"control": control, "plan": plan, "base": base, "facts": facts, "conninfo": conninfo,
                            "databases": [default["NAME"], journal["NAME"]], "receiver": receiver,
                            "shared": pool.shared, "say": say}
            per_client = int(product.get("inflight_per_client", 8))
            say("warming up the product mode: 3 untimed seconds")
            run_product_phase(pool, n=max(clients), seconds=3.0, tag=f"{run_tag}-pw", drills=0, profile_dir=None,
                              inflight=per_client * max(clients), **product_args)
        if analyze_first:
            analyze(conninfo, say)
        report["analyzed_after_warm_up"] = analyze_first
        for n in clients:
            # The product mode first: the classic mix's admission-only phase leaves its receipts due, and the
            # product's materializers would take them (the settle step drains what a previous client count left).
            measured = None
            if product:
                measured = run_product_phase(pool, n=n, seconds=seconds, tag=f"{run_tag}-p{n}", drills=drills,
                                             profile_dir=profile_dir, inflight=per_client * n, **product_args)
                measured["state_problems"] = _state_check(account_key)
            if classic:
                run = _run_clients(pool, n, control, base, facts, seconds, raw_seconds, conninfo, f"{run_tag}-n{n}",
                                   peer and not peer_reason, peer_reason, shared_counter, say, drills=drills,
                                   profile_dir=profile_dir, databases=[default["NAME"], journal["NAME"]])
                run["state_problems"] = _state_check(account_key)
            else:
                run = {"clients": n, "seconds": seconds, "classic": False}
            if measured is not None:
                run["product"] = measured
            report["runs"].append(run)
        if batch_events:
            report["batch_receipt"] = _run_batch(pool, base, batch_events, batch_seconds or raw_seconds,
                                                 f"{run_tag}-batch", say)
            report["batch_receipt"]["state_problems"] = _state_check(account_key)
    finally:
        pool.close()
        receiver.stop()
        settings.CONNECTOR = saved_connector
        if drop_raw:
            raw_schema_drop(conninfo)
    report["receiver"] = {"requests": len(receiver.requests), "logical_effects_applied": receiver.applied_total()}
    report["load_average"] = [round(v, 2) for v in os.getloadavg()]
    return report


def _run_clients(pool: Pool, n: int, control: int, base: dict, facts: dict, seconds: float, raw_seconds: float,
                 conninfo: str, tag: str, peer: bool, peer_reason: str, shared_counter: bool, say: Progress,
                 drills: int = 1, profile_dir: str | None = None, databases: Sequence[str] = ()) -> dict:
    lead = 0.3  # seconds for the commands to reach the processes before the common start time
    start = time.time() + lead
    deadline = start + seconds
    hold = max(0.2, 0.05 * seconds) if drills == 1 else max(0.05, min(0.05 * seconds, 0.1 * seconds / drills))
    say(f"{n} client(s): complete mix for {seconds:g} s (control: revocation at 25%, halt at 55%"
        + (f" of each of {drills} periods" if drills > 1 else "") + f", hold {hold:g} s)")
    commands = {i: {**base, "kind": "mix", "tag": tag, "start_at": start, "deadline": deadline} for i in range(n)}
    commands[control] = {**base, "kind": "control", "start_at": start, "deadline": deadline, "seconds": seconds,
                         "hold": hold, "credential_generation": facts["credential_generation"], "drills": drills}
    if profile_dir:
        commands[0]["profile"] = str(Path(profile_dir) / "classic-client0.prof")
    from bench.mix_product import measure_cpu

    pids = {pool.processes[i].pid: "client" for i in range(n)}
    pids.update({pool.processes[control].pid: "control", os.getpid(): "bench+receiver"})
    roles_cpu = measure_cpu(conninfo, list(databases), pids, start, deadline) if databases else None
    cpu_before = cpu_sample()
    results = pool.run(commands, timeout=seconds + lead + 120, what=f"mix with {n} clients")
    cpu_after = cpu_sample()  # includes the clients' untimed drain (a few ms to a few s)
    if roles_cpu:
        roles_cpu["thread"].join(timeout=30)
    ctrl = results.pop(control)
    records = [r for res in results.values() for r in res["records"]] + ctrl["records"]
    classes = summarize_classes(records, seconds)
    unaccounted = unaccounted_rejections(records, ctrl["windows"])
    lock_p99 = max((c["lock_wait_p99_ms"] for c in classes.values()), default=0.0)
    starving = max(classes.items(), key=lambda kv: kv[1]["max_ms"])
    run = {
        "clients": n, "seconds": seconds, "rounds": sum(res["rounds"] for res in results.values()),
        "left_pending": sum(res["left_pending"] for res in results.values()),
        "load_average": round(os.getloadavg()[0], 2), "classes": classes,
        "machine_cpu_busy_pct": busy_percent(cpu_before, cpu_after),
        "client_cpu_seconds": _r(sum(res["cpu_seconds"] for res in results.values()), 3),
        "statements_client0": results[0].get("statements") or {},
        "control": {"windows": [[w[0], _r(w[1] - start, 3), _r(w[2] - start, 3)] for w in ctrl["windows"]],
                    "confirm_halted_attempts": ctrl["confirm_attempts"],
                    "halt_drain_ms": _r(ctrl["drain_ms"]) if ctrl["drain_ms"] is not None else None,
                    "problems": ctrl["problems"], "hold_seconds": hold, "drills": drills},
        "totals": {
            "deadlocks": sum(c["deadlocks"] for c in classes.values()),
            "retries": sum(c["retries"] for c in classes.values()),
            "errors": sum(c["errors"] for c in classes.values()),
            "rejections": sum(c["rejections_total"] for c in classes.values()),
            "unaccounted_rejections": len(unaccounted), "unaccounted_samples": unaccounted[:5],
            "lock_wait_p99_ms": lock_p99,
            "starvation_ms": starving[1]["max_ms"], "starvation_class": starving[0],
        },
    }
    if roles_cpu:
        from bench.mix_product import per_completion

        run["cpu"] = roles_cpu.get("result")
        run["cpu_per_completion_ms"] = per_completion(run["cpu"], classes["effect_finalize"]["count"])
    # product admission alone, then the raw baseline, over the same N processes
    start = time.time() + lead
    say(f"{n} client(s): product admission only for {raw_seconds:g} s")
    adm = pool.run({i: {**base, "kind": "admission", "tag": tag, "start_at": start, "deadline": start + raw_seconds}
                    for i in range(n)}, timeout=raw_seconds + lead + 60, what="admission-only")
    run["admission_only"] = _stats_ms([x for res in adm.values() for x in res["latencies"]], raw_seconds)
    run["admission_only"]["failures"] = sum(res["failures"] for res in adm.values())
    start = time.time() + lead
    say(f"{n} client(s): raw psycopg baseline for {raw_seconds:g} s")
    raw = pool.run({i: {"kind": "raw", "tag": tag, "conninfo": conninfo, "start_at": start,
                        "deadline": start + raw_seconds, "shared_counter": shared_counter} for i in range(n)},
                   timeout=raw_seconds + lead + 60, what="raw baseline")
    run["raw"] = _stats_ms([x for res in raw.values() for x in res["latencies"]], raw_seconds)
    run["raw"].update({k: sum(res[k] for res in raw.values()) for k in ("deadlocks", "races", "failures")})
    run["raw"]["counter"] = "one shared row" if shared_counter else "one row per client"
    completions = classes["runtime_completion"]["count"]
    run["peer"] = _run_peer(pool, n, conninfo, completions, tag, say) if peer else {
        "available": False, "reason": peer_reason}
    mix_adm = classes["transport_admission"]["throughput"]
    raw_tp = run["raw"]["throughput"]
    run["ratios"] = {
        "admission_mix_over_raw": _r(mix_adm / raw_tp, 4) if raw_tp else None,
        "admission_only_over_raw": _r(run["admission_only"]["throughput"] / raw_tp, 4) if raw_tp else None,
        "claim_to_completion_over_peer": (_r(classes["runtime_completion"]["throughput"]
                                             / run["peer"]["throughput"], 4)
                                          if run["peer"].get("available") and run["peer"]["throughput"] else None),
    }
    busy = sum(classes[c]["mean_ms"] for c in ("lane_advance", "execution_claim", "runtime_completion"))
    run["ratios"]["product_execution_busy_ms"] = _r(busy)
    if run["peer"].get("available"):
        run["ratios"]["peer_job_busy_ms"] = _r(n * run["peer"]["seconds"] * 1000 / max(1, run["peer"]["jobs"]))
    return run


def _run_batch(pool: Pool, base: dict, events: int, seconds: float, tag: str, say: Progress) -> dict:
    """The "batch receipt" phase (issue 18, goal 2): one client admits and materializes `events`-event receipts
    for `seconds`; events/s over the phase, and each receipt's admission + materialization latency."""
    say(f"1 client: batch receipts of {events} events (admitted and materialized) for {seconds:g} s")
    res = pool.run({0: {**base, "kind": "batch", "tag": tag, "events": events, "seconds": seconds}},
                   timeout=seconds + 180, what="batch receipts")[0]
    elapsed = res["ended"] - res["began"]  # the last receipt may finish after the deadline
    out = {"clients": 1, "events_per_receipt": events, "seconds": _r(elapsed, 3), "receipts": len(res["latencies"]),
           "events": res["events"], "failures": res["failures"],
           "events_per_s": _r(res["events"] / elapsed if elapsed else 0.0, 1),
           "goal_events_per_s": BATCH_GOAL_EVENTS_PER_S}
    out["receipt_ms"] = percentiles(res["latencies"]) if res["latencies"] else {}
    return out


def _run_peer(pool: Pool, n: int, conninfo: str, jobs: int, tag: str, say: Progress) -> dict:
    import psycopg

    if jobs < 1:
        return {"available": False, "reason": "the product completed no execution to match"}
    shares = [jobs // n + (1 if i < jobs % n else 0) for i in range(n)]
    queue_name = f"{PEER_QUEUE_PREFIX}{tag.replace('-', '_')}"[:60]
    say(f"{n} client(s): procrastinate peer baseline, {jobs} jobs")
    start = time.time() + 1.0
    try:
        results = pool.run({i: {"kind": "peer", "conninfo": conninfo, "queue": queue_name, "jobs": shares[i],
                                "start_at": start} for i in range(n)}, timeout=300, what="peer baseline")
    except RuntimeError as exc:
        return {"available": False, "reason": f"procrastinate failed: {str(exc).strip().splitlines()[-1][:300]}"}
    ended = max(res["ended"] for res in results.values())
    with psycopg.connect(conninfo) as conn:
        done = conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s AND status = 'succeeded'",
                            [queue_name]).fetchone()[0]
    seconds = ended - start
    defer_s = max(res["deferred"] for res in results.values()) - start
    out = {"available": True, "jobs": jobs, "succeeded": done, "workers": n, "seconds": _r(seconds, 3),
           "throughput": _r(done / seconds if seconds else 0.0), "defer_seconds": _r(defer_s, 3)}
    if done != jobs:
        out.update(available=False, reason=f"procrastinate worked {done} of {jobs} jobs")
    return out


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
    for run in report["runs"]:
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


# =================================================================================================================
# the subcommand
# =================================================================================================================




class HotAccount:
    """`bench hot-account`: registered in bench/management/commands/bench.py's SUBCOMMANDS."""

    name = "hot-account"
    help = ("Throughput, latency, gate-lock wait, deadlocks, retries, availability rejections and starvation of the "
            "complete transaction mix against one account, for each client count, with a raw psycopg baseline and "
            "a procrastinate peer baseline, on a throwaway database.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--clients", default="1,2,4,8", help="client process counts (default 1,2,4,8)")
        parser.add_argument("--seconds", type=float, default=20.0, help="duration of each mix run (default 20)")
        parser.add_argument("--raw-seconds", type=float, default=None,
                            help="duration of the admission-only and raw baseline phases (default: half of "
                                 "--seconds, at least 2, at most 10)")
        parser.add_argument("--quick", action="store_true",
                            help="1 and 2 clients, 5 s each, 3 s baselines (for `make bench`)")
        parser.add_argument("--no-peer", action="store_true", help="skip the procrastinate peer baseline")
        parser.add_argument("--no-analyze", action="store_true",
                            help="do not ANALYZE after the warm-up: measure the planner of a freshly built database "
                                 "that autovacuum has not analyzed yet (what every run measured before D-403)")
        parser.add_argument("--batch-events", type=int, default=BATCH_EVENTS,
                            help=f"events per receipt of the batch receipt phase (default {BATCH_EVENTS}; 0 skips it)")
        parser.add_argument("--batch-only", action="store_true",
                            help="run only the batch receipt phase (no mix, baselines or peer)")
        parser.add_argument("--batch-seconds", type=float, default=None,
                            help="duration of the batch receipt phase (default: that of the admission-only phase)")
        parser.add_argument("--shared-counter", action="store_true",
                            help="raw baseline: all clients update one counter row (default: one row per client)")
        parser.add_argument("--json", metavar="FILE", help="write the JSON report to FILE")
        parser.add_argument("--check", action="store_true",
                            help="exit non-zero naming every figure that breaks the hot_account budget")
        parser.add_argument("--budgets", metavar="PATH", default=str(BUDGETS_PATH),
                            help="budget file (default bench/budgets.json)")
        parser.add_argument("--from-json", metavar="FILE", action="append", default=[],
                            help="do not run: print (and --check) a saved report; repeatable with --write-budgets")
        parser.add_argument("--write-budgets", action="store_true",
                            help="derive the hot_account budget section from this run (or the --from-json "
                                 "reports) and write it to --budgets, keeping the other sections")
        parser.add_argument("--database-name", default=DEFAULT_DATABASE,
                            help=f"throwaway database (default {DEFAULT_DATABASE}; <name>_journal too)")
        parser.add_argument("--keep", action="store_true", help="keep the throwaway databases afterwards")
        parser.add_argument("--drills", type=int, default=1,
                            help="control drills per mix run: the run is cut into this many periods, each with a "
                                 "credential revocation and a halt cycle, so the control transitions' p99 rests on "
                                 "as many samples (default 1)")
        parser.add_argument("--product", action="store_true",
                            help="after the classic mix of each client count, the product mode: the clients only "
                                 "admit, worker processes run the product's batched worker steps until each "
                                 "event's effect is finalized (bench/mix_product.py; issue 20, goal 2)")
        parser.add_argument("--product-only", action="store_true",
                            help="the product mode alone (no classic mix, no baselines)")
        parser.add_argument("--product-workers", default="materialize=2,claims=2,egress=2",
                            help="worker processes per role of the product mode (default as make run on 2 cores)")
        parser.add_argument("--inflight", type=int, default=8,
                            help="product mode: events each client may have admitted and not yet finalized "
                                 "(default 8; the window is clients x this)")
        parser.add_argument("--profile", metavar="DIR",
                            help="cProfile client 0 of the classic mix (and count its statements by class) and the "
                                 "first process of each product-mode role; .prof files written to DIR")
        parser.add_argument("--chart", metavar="FILE",
                            help="draw the report's chart (throughput, ratios and control p99 by client count) to "
                                 "FILE (.svg or .png), from the report's JSON alone (bench/chart.py)")
        parser.add_argument("--table", action="store_true",
                            help="print the scaling table (Markdown, one row per client count) after the report")

    def handle(self, command, options: dict) -> None:
        from django.core.management.base import CommandError

        say = command.progress
        if options["from_json"]:
            reports = [json.loads(Path(p).read_text(encoding="utf-8")) for p in options["from_json"]]
        else:
            reports = [self._run(options, say)]
        report = reports[-1]
        if options["json"] and not options["from_json"]:
            Path(options["json"]).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            say(f"report written to {options['json']}")
        command.stdout.write(format_report(report))
        if options["table"]:
            from bench.chart import scaling_table

            command.stdout.write(scaling_table(report))
        if options["chart"]:
            from bench.chart import draw

            try:
                say(f"chart written to {draw(report, Path(options['chart']))}")
            except ValueError as exc:
                raise CommandError(f"--chart: {exc}") from exc
        if options["write_budgets"]:
            write_budget_section(Path(options["budgets"]), budgets_from_reports(reports))
            say(f"hot_account budgets written to {options['budgets']}")
        if options["check"]:
            try:
                budgets = load_budgets(options["budgets"])
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot read the budget file {options['budgets']}: {exc}") from exc
            failures = check_report(report, budgets)
            if failures:
                raise CommandError("hot-account budget broken:\n  " + "\n  ".join(failures))
            command.stdout.write(command.style.SUCCESS(
                f"check passed: every budgeted figure within {options['budgets']}"))

    def _run(self, options: dict, say: Progress) -> dict:
        from django.core.management.base import CommandError
        from django.db import connections

        from connector.demo import build_world
        from bench.management.commands.bench import NAME_RE, ThrowawayDatabases

        clients = [1, 2] if options["quick"] else integer_list(options["clients"], "--clients", low=1, high=32,
                                                               needs="--clients needs client counts between 1 and 32")
        if options["batch_only"]:
            if not options["batch_events"]:
                raise CommandError("--batch-only needs --batch-events above 0")
            clients = []
        seconds = 5.0 if options["quick"] else options["seconds"]
        raw_seconds = options["raw_seconds"] or (3.0 if options["quick"] else min(10.0, max(2.0, seconds / 2)))
        if seconds < 1 or raw_seconds < 0.5:
            raise CommandError("--seconds must be at least 1 and --raw-seconds at least 0.5")
        if options["drills"] < 1 or seconds / options["drills"] < 1:
            raise CommandError("--drills must be at least 1 and leave each drill period at least 1 s of --seconds")
        product = None
        if options["product"] or options["product_only"]:
            from bench.mix_product_run import parse_workers

            try:
                workers = parse_workers(options["product_workers"])
            except ValueError as exc:
                raise CommandError(str(exc)) from exc
            if not 1 <= options["inflight"] <= 1000:
                raise CommandError("--inflight must be between 1 and 1000")
            product = {"workers": workers, "inflight_per_client": options["inflight"]}
        if options["profile"]:
            Path(options["profile"]).mkdir(parents=True, exist_ok=True)
        name = options["database_name"]
        if not NAME_RE.match(name) or not NAME_RE.match(f"{name}_journal"):
            raise CommandError(f"--database-name {name!r} must match {NAME_RE.pattern}")
        quiet = options["verbosity"] < 2
        connector_log = logging.getLogger("connector")
        saved_level = connector_log.level
        if quiet:
            connector_log.setLevel(logging.WARNING)
        try:
            with ThrowawayDatabases([name], f"{name}_journal", keep=options["keep"], say=say) as databases:
                connections["default"] = databases.wrappers[name]
                say(f"database {name}: building the demo world (push=True) through the services")
                account_key = build_world("", push=True).accounts[0].account_key
                connections["default"].close()
                report = run_hot_account(account_key=account_key, clients=clients, seconds=seconds,
                                         raw_seconds=raw_seconds, peer=not (options["no_peer"] or options["batch_only"]),
                                         shared_counter=options["shared_counter"], progress=say,
                                         batch_events=options["batch_events"],
                                         batch_seconds=options["batch_seconds"], drills=options["drills"],
                                         product=product, classic=not options["product_only"],
                                         profile_dir=options["profile"],
                                         analyze_first=not options["no_analyze"])
        finally:
            connector_log.setLevel(saved_level)
        flags = ["--quick"] if options["quick"] else [
            f"--clients {','.join(map(str, clients))}", f"--seconds {seconds:g}", f"--raw-seconds {raw_seconds:g}"]
        flags += [f"--{k.replace('_', '-')}" for k in ("no_peer", "shared_counter", "batch_only", "product",
                                                       "product_only", "no_analyze") if options[k]]
        if product:
            flags += [f"--product-workers {options['product_workers']}", f"--inflight {options['inflight']}"]
        if options["batch_events"] != BATCH_EVENTS:
            flags.append(f"--batch-events {options['batch_events']}")
        if options["batch_seconds"]:
            flags.append(f"--batch-seconds {options['batch_seconds']:g}")
        if options["drills"] != 1:
            flags.append(f"--drills {options['drills']}")
        report["command"] = "manage.py bench hot-account " + " ".join(flags)
        return report
