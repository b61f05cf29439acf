"""The hot-account mix's operation classes and the per-process recorder of their latencies (timers wrapped
around the product's functions), shared by the client processes and the reports."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


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
    """Wrap the gate/epoch and credential-gate lock functions and the nested operations (outbound authoring inside
    Runtime, permit settlement inside egress, finalization inside the settlement) with timers. Bench processes
    only."""
    from connector import hooks, locks
    from effects import egress_batch
    from effects.services import dispatch, dispatch_batch

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
    # A settlement is a confirmed answer's (with its finalization, one transaction for the batch) or any other
    # answer's: both are the permit_settlement class.
    dispatch.permit_settle = _nested("permit_settlement", dispatch.permit_settle)
    egress_batch.permits_settle_confirmed = _nested("permit_settlement", egress_batch.permits_settle_confirmed)
    # The finalization runs inside the confirmed settlement's transaction (one path, D-531), not as a step of its own.
    dispatch_batch._finalize_in_savepoint = _nested("effect_finalize", dispatch_batch._finalize_in_savepoint)


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


def _sleep_until(at: float) -> None:
    delay = at - time.time()
    if delay > 0:
        time.sleep(delay)


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
