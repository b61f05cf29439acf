"""Latency and egress metrics counted where the work happens (issue 21, D-230..D-232): prometheus-client histograms
and counters in process memory. With PROMETHEUS_MULTIPROC_DIR set (before prometheus-client is imported) every
process writes its own files there and a scrape sums them: the web's `/metrics` (observability/metrics.py) and a
worker's own port (observability/workers.py).

- `connector_result_latency_seconds{source, outcome}`: admission -> ApplicationResult, from the Receipt's
  `created_at` (a window: the window's `opened_at`) to the ApplicationResult's `committed_at`; observed when the
  connector records the result and closes the Execution.
- `connector_effect_latency_seconds{destination}`: OutboundCommand -> finalized RemoteEffect, from the command's
  `created_at` to the finalization.
- `connector_egress_duration_seconds{destination, status}`: the one provider request of the egress adapter.
- `connector_rate_limit_deferrals_total{destination, cause}`: permits the destination limiter refused
  (DESTINATION_DEFERRED, D-222).
- `connector_receiver_deferrals_total{destination, status}`: a receiver's `429` or `Retry-After` that deferred its
  destination (D-223).
- `connector_effect_retries_scheduled_total{destination}`: attempts that never reached the receiver and were
  followed by a scheduled retry (issue 37, D-421).
- `connector_effects_no_effect_total{destination, reason}`: effects the frozen policy ended terminal `no_effect`, by
  closed reason code (RECEIVER_UNREACHABLE, NO_EFFECT_ATTEMPTS_SPENT, OUTBOUND_PATH_UNSAFE, D-423;
  LINKED_RECORD_NOT_FOUND, D-481).
- `connector_settlement_retries_total{step}`: egress settlements (or generation give-ups) PostgreSQL could not take
  and that were tried again (issue 37 item 3, D-424); counted at once, not after a commit.

Every observation runs after the commit of the transaction that did the work (`after_commit`), so a rolled-back
transaction counts nothing, and a failing observation never fails committed work. Every label value comes from a
closed set: `source`, `outcome`, `cause` and `status` from the tuples below; `destination` is the callout's stable
name (the contract's identifier, never a URL, path or id), at most `CONNECTOR["METRICS_MAX_DESTINATIONS"]` of them
per process, any further or malformed one counted as `_other`. The services take only timestamps they already
read: no statement is added to the hot path."""
from __future__ import annotations

import re
import threading
from datetime import datetime

from django.conf import settings
from django.db import transaction
from prometheus_client import Counter, Histogram

SOURCES = ("event", "window")
OUTCOMES = ("applied", "noop", "rejected", "failed")
STATUSES = ("2xx", "3xx", "4xx", "429", "5xx", "other", "timeout", "transport_error")
CAUSES = ("rate", "in_flight", "receiver_deferral")
OTHER = "_other"
UNKNOWN = "unknown"

STAGE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
EGRESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

RESULT_LATENCY = Histogram(
    "connector_result_latency_seconds",
    "Seconds from a Receipt's admission (a window: its opening) to the ApplicationResult's commit, observed when the "
    "connector records the result; by projection source and result outcome",
    labelnames=["source", "outcome"], buckets=STAGE_BUCKETS, registry=None)
EFFECT_LATENCY = Histogram(
    "connector_effect_latency_seconds",
    "Seconds from an OutboundCommand's commit to its RemoteEffect's finalization, by destination (callout)",
    labelnames=["destination"], buckets=STAGE_BUCKETS, registry=None)
EGRESS = Histogram(
    "connector_egress_duration_seconds",
    "Seconds of the egress adapter's one provider request, by destination (callout) and answer: status class, 429, "
    "timeout or transport_error",
    labelnames=["destination", "status"], buckets=EGRESS_BUCKETS, registry=None)
RATE_LIMIT_DEFERRALS = Counter(
    "connector_rate_limit_deferrals",
    "Permits the destination limiter refused (DESTINATION_DEFERRED): rate (no token), in_flight (maximum reached) "
    "or receiver_deferral (a receiver's Retry-After pending)",
    labelnames=["destination", "cause"], registry=None)
RECEIVER_DEFERRALS = Counter(
    "connector_receiver_deferrals",
    "Receiver answers (429 or Retry-After) that deferred a destination declaring a limit, by answer status",
    labelnames=["destination", "status"], registry=None)

RETRIES_SCHEDULED = Counter(
    "connector_effect_retries_scheduled",
    "Attempts that never reached the receiver (connection refused, DNS, TLS handshake, connect timeout) followed by a "
    "retry scheduled on the frozen policy's schedule, by destination",
    labelnames=["destination"], registry=None)
NO_EFFECT = Counter(
    "connector_effects_no_effect",
    "Effects the frozen policy ended terminal no_effect, by destination and closed reason code",
    labelnames=["destination", "reason"], registry=None)
SETTLEMENT_RETRIES = Counter(
    "connector_settlement_retries",
    "Egress settlements (step settlement) or holder generation give-ups (step give-up) PostgreSQL could not take, "
    "tried again",
    labelnames=["step"], registry=None)
NO_EFFECT_REASONS = ("RECEIVER_UNREACHABLE", "NO_EFFECT_ATTEMPTS_SPENT", "OUTBOUND_PATH_UNSAFE",
                     "LINKED_RECORD_NOT_FOUND")
SETTLE_STEPS = ("settlement", "give-up")

COLLECTORS = (RESULT_LATENCY, EFFECT_LATENCY, EGRESS, RATE_LIMIT_DEFERRALS, RECEIVER_DEFERRALS, RETRIES_SCHEDULED,
              NO_EFFECT, SETTLEMENT_RETRIES)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_destinations: set[str] = set()
_lock = threading.Lock()


def destination(callout: str) -> str:
    """The bounded label of a destination: the callout's name when it looks like an identifier (no slash, no
    query, at most 64 characters) and this process has seen fewer than the cap of distinct ones; else `_other`."""
    if callout in _destinations:
        return callout
    if not isinstance(callout, str) or not _NAME.fullmatch(callout):
        return OTHER
    with _lock:
        if callout not in _destinations and len(_destinations) >= int(
                settings.CONNECTOR.get("METRICS_MAX_DESTINATIONS", 100)):
            return OTHER
        _destinations.add(callout)
    return callout


def status(code: int | None) -> str:
    """The closed status label of a provider answer's HTTP status code (None: no answer; see `egress_observe`)."""
    if code == 429:
        return "429"
    if code is not None and 200 <= code < 600:
        return f"{code // 100}xx"
    return "other"


def after_commit(observe) -> None:
    """Run `observe` once the current transaction commits (at once outside one); never on a rollback. `robust`:
    an observation that fails is logged by Django and never turns committed work into an error."""
    transaction.on_commit(observe, robust=True)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def result_recorded(*, admitted_at: datetime | None, committed_at: datetime | None, window: bool,
                    outcome: str) -> None:
    """An Execution closed from its ApplicationResult (call inside the recording transaction)."""
    seconds = _seconds(admitted_at, committed_at)
    if seconds is None:
        return
    labels = ("window" if window else "event", outcome if outcome in OUTCOMES else UNKNOWN)
    after_commit(lambda: RESULT_LATENCY.labels(*labels).observe(seconds))


def effect_finalized(*, callout: str, commanded_at: datetime | None, finalized_at: datetime | None) -> None:
    """A RemoteEffect finalized (call inside the finalizing transaction)."""
    seconds = _seconds(commanded_at, finalized_at)
    if seconds is None:
        return
    label = destination(callout)
    after_commit(lambda: EFFECT_LATENCY.labels(label).observe(seconds))


def egress_observe(*, callout: str, status_label: str, seconds: float) -> None:
    """One provider request answered (or failed) after `seconds`; `status_label` one of STATUSES."""
    labels = (destination(callout), status_label if status_label in STATUSES else "other")
    after_commit(lambda: EGRESS.labels(*labels).observe(max(0.0, seconds)))


def rate_limit_deferred(*, callout: str, cause: str) -> None:
    """The limiter refused a permit (call inside the refusing transaction, which commits its writes)."""
    labels = (destination(callout), cause if cause in CAUSES else UNKNOWN)
    after_commit(lambda: RATE_LIMIT_DEFERRALS.labels(*labels).inc())


def receiver_deferred(*, callout: str, code: int | None) -> None:
    """A receiver's answer deferred its destination (call inside the settling transaction)."""
    labels = (destination(callout), status(code))
    after_commit(lambda: RECEIVER_DEFERRALS.labels(*labels).inc())


def retry_scheduled(*, callout: str) -> None:
    """An unreached attempt's retry was scheduled (call inside the settling transaction)."""
    label = destination(callout)
    after_commit(lambda: RETRIES_SCHEDULED.labels(label).inc())


def effect_no_effect(*, callout: str, reason: str) -> None:
    """The frozen policy ended an effect terminal no_effect with `reason` (call inside its transaction)."""
    labels = (destination(callout), reason if reason in NO_EFFECT_REASONS else UNKNOWN)
    after_commit(lambda: NO_EFFECT.labels(*labels).inc())


def settlement_retried(*, step: str) -> None:
    """A settlement (or give-up) failed with the database and is tried again: counted now (nothing committed)."""
    SETTLEMENT_RETRIES.labels(step if step in SETTLE_STEPS else UNKNOWN).inc()
