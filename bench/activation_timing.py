"""The timed call and the killed child of `bench activation`, for every scenario (split out of bench/activation.py,
which may not grow: tests/test_layout.py).

Each scenario is one product call (`CALLS`): `first` is `connector.services.serving.epoch_activate_first`,
`cutover` is `cutover.services.first_activation.first_activation_commit` (the coordinator's commit phase, also its
resume: approval check, the barrier-set transaction `activation_transaction`, readback, `v2_committed`, release),
`successor` is `cutover.services.succession.successor_activate`.

Timing only wraps product functions to take timestamps; nothing is replaced. Every wrapper tolerates a call that
never happens (another helper may make the gate UPDATE and its audit INSERT one statement, or change what
`locks.gates_for_update` returns): a missing mark falls back to the previous one, so its phase reads 0 ms, never an
error. The marks, in order: the transaction's first lock (the epoch for `first`, the barrier set otherwise: its
FIRST call, the commit phase locks it again to release it), the gate locks (`locks.gates_for_update`), the set-based
gate move (`gates_bind_epoch`: one UPDATE and one audit INSERT, D-210), and the end of the transaction (the call's
return, or `first_activation.activation_transaction`'s for `cutover`, whose COMMIT precedes the readback).

The child's kill points: `after_gate_locks` (gates_for_update returned) and `before_commit`: the product's own
crash points `activation.before_commit` (cutover) and `succession.before_commit` (successor), instrumented to pause
instead of SIGKILLing themselves so that a second session can count the locks first; for `first` (no crash point in
serving) the pause follows `gates_bind_epoch`, the transaction's last write.
"""
from __future__ import annotations

import json
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from unittest import mock

from django.db import connection

from bench.wal import Wal, insert_lsn, retain_wal, wal_of

CHILD_ARGS = "ACTIVATION_CHILD_ARGS"
CHILD_HOLDING = "CHILD-HOLDING "
CHILD_COMMITTED = "CHILD-COMMITTED"
CRASH_POINTS = {"cutover": "activation.before_commit", "successor": "succession.before_commit"}


@dataclass
class Phases:
    call_ms: float  # the whole service call (cutover: first_activation_commit, readback and release included)
    reread_ms: float  # before the transaction's first lock (first/successor: every owner reread; cutover: the
    #                   dual-approval check, whose digest reads the exhaustive account/gate set)
    epoch_lock_ms: float  # first lock -> gate locks (cutover: the set, the journal decision, the epoch, the
    #                       evidence recomputed under the set; successor: the set and both epochs)
    gate_lock_ms: float  # SELECT ... FOR UPDATE of every gate, in account order
    epoch_update_ms: float  # gate locks -> the set-based gate move (epoch, set and lane checks, their audit rows)
    gate_update_ms: float  # every gate moved: one UPDATE and one audit INSERT for all (D-210)
    commit_ms: float  # the gate move -> COMMIT acknowledged
    transaction_ms: float  # first lock -> COMMIT acknowledged: how long the locks are held
    committed_ms: float = 0.0  # the call's start -> the activation's COMMIT acknowledged (cutover: before the
    #                           readback, v2_committed and the release that follow it, D-285)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def call_for(scenario: str, args: dict, actor_name: str):
    """The scenario's service call (no argument): args names epoch_pk, barrier_set_pk and attempt_key."""
    from connector.actors import Actor
    from connector.services import serving
    from cutover.services import first_activation, succession

    actor = Actor.system(actor_name)
    if scenario == "cutover":
        return lambda: first_activation.first_activation_commit(attempt_key=args["attempt_key"], actor=actor)
    if scenario == "successor":
        return lambda: succession.successor_activate(barrier_set_pk=args["barrier_set_pk"], expected_fence=None,
                                                     actor=actor)
    return lambda: serving.epoch_activate_first(epoch_pk=args["epoch_pk"], actor=actor)


def instrument(stack: ExitStack, scenario: str, marks: dict[str, float], *, on_gates=None, on_written=None,
               on_crash_point=None) -> None:
    """Patch the scenario's product functions with timestamping wrappers (see the module docstring). on_gates runs
    after the gate locks, on_written after the gate move, on_crash_point(name) at the product's crash points."""
    from connector import locks
    from connector.services import gates as gates_service
    from connector.services import serving
    from cutover import locks as cutover_locks
    from cutover.services import first_activation, succession

    def wrap(module, name, before=None, after=None):
        real = getattr(module, name, None)
        if real is None:  # renamed or gone: its phase reads 0 ms
            return

        def wrapper(*args, **kwargs):
            if before:
                before()
            result = real(*args, **kwargs)
            if after:
                after()
            return result
        stack.enter_context(mock.patch.object(module, name, wrapper))

    def mark(name, once=False):
        def record():
            if not (once and name in marks):
                marks[name] = time.perf_counter()
        return record

    if scenario == "first":
        wrap(locks, "epoch_for_update", before=mark("transaction", once=True))
    else:
        wrap(cutover_locks, "barrier_set_for_update", before=mark("transaction", once=True))

    def gates_locked():
        mark("gates_locked")()
        if on_gates:
            on_gates()

    def gates_written():
        mark("bind_end")()
        if on_written and scenario == "first":
            on_written()
    wrap(locks, "gates_for_update", before=mark("gate_lock"), after=gates_locked)
    for module in (serving, gates_service):  # serving imported the name; succession calls it through the module
        wrap(module, "gates_bind_epoch", before=mark("bind_start"), after=gates_written)
    if scenario == "cutover":
        wrap(first_activation, "activation_transaction", after=mark("txn_end"))
    if on_crash_point and scenario in CRASH_POINTS:
        module = first_activation if scenario == "cutover" else succession
        real_point = module.fault_point

        def fault_point(name):
            if name == CRASH_POINTS[scenario]:
                on_crash_point(name)
            return real_point(name)
        stack.enter_context(mock.patch.object(module, "fault_point", fault_point))


def phases_from(marks: dict[str, float], began: float, ended: float) -> Phases:
    """Phases from the marks; a mark that was never taken falls back to the one before it (0 ms)."""
    transaction = marks.get("transaction", began)
    gate_lock = marks.get("gate_lock", transaction)
    gates_locked = marks.get("gates_locked", gate_lock)
    bind_start = marks.get("bind_start", gates_locked)
    bind_end = marks.get("bind_end", bind_start)
    txn_end = marks.get("txn_end", ended)
    return Phases(call_ms=_ms(ended - began), reread_ms=_ms(transaction - began),
                  epoch_lock_ms=_ms(gate_lock - transaction), gate_lock_ms=_ms(gates_locked - gate_lock),
                  epoch_update_ms=_ms(bind_start - gates_locked), gate_update_ms=_ms(bind_end - bind_start),
                  commit_ms=_ms(txn_end - bind_end), transaction_ms=_ms(txn_end - transaction),
                  committed_ms=_ms(txn_end - began))


def child_main() -> None:
    """Run in a fresh interpreter (`kill_mid_activation`): the scenario's call with a pause at the kill point. At
    the pause the transaction holds every lock; the child reports its backend pid and transaction id and waits for
    the parent's SIGKILL (stdin EOF means the parent is gone: it then dies the same way)."""
    args = json.loads(os.environ[CHILD_ARGS])
    scenario, kill_at = args.get("scenario") or "first", args["kill_at"]

    def hold(point: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid(), mod(pg_current_xact_id()::text::numeric, 4294967296)::bigint")
            pid, xid = cursor.fetchone()
        print(CHILD_HOLDING + json.dumps({"point": point, "pid": pid, "xid": xid}), flush=True)
        sys.stdin.read()
        os._exit(3)

    marks: dict[str, float] = {}
    with ExitStack() as stack:
        instrument(stack, scenario, marks,
                   on_gates=(lambda: hold("after_gate_locks")) if kill_at == "after_gate_locks" else None,
                   on_written=(lambda: hold("before_commit")) if kill_at == "before_commit" else None,
                   on_crash_point=(lambda _name: hold("before_commit")) if kill_at == "before_commit" else None)
        epoch = call_for(scenario, args, "bench-activation-killed")()
    print(CHILD_COMMITTED + " " + json.dumps({"state": epoch.state}), flush=True)


def timed_activation(world) -> tuple[Phases, Wal]:
    """The scenario's call in this process, timestamped (see the module docstring). Returns the phases and the
    transaction's WAL (its own records: the epoch row's xmin names the activation transaction)."""
    from bench.activation_world import ActivationBenchError, _observer
    from connector.choices import EpochState

    marks: dict[str, float] = {}
    call = call_for(world.scenario, {"epoch_pk": world.epoch_pk, "barrier_set_pk": world.barrier_set_pk,
                                     "attempt_key": world.attempt_key}, "bench-activation")
    observer = _observer()
    try:
        retain_wal(observer)
        start_lsn = insert_lsn(observer)
        with ExitStack() as stack:
            instrument(stack, world.scenario, marks)
            began = time.perf_counter()
            epoch = call()
            ended = time.perf_counter()
        if epoch.state != EpochState.ACTIVE:
            raise ActivationBenchError(f"the activation did not commit: epoch {epoch.state} {epoch.rejection_code}")
        server_bytes = observer.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)::bigint",
                                        [start_lsn]).fetchone()[0]
        (xid,) = observer.execute("SELECT xmin::text::bigint FROM connector_servingepoch WHERE id = %s",
                                  [world.epoch_pk]).fetchone()
        wal = wal_of(observer, start_lsn, xid, server_bytes=server_bytes,
                     enabled=world.extensions.get("pg_walinspect", False))
    finally:
        observer.close()
    return phases_from(marks, began, ended), wal
