"""Time in the test suite: a test waits for a condition, never for a fixed time, and its deadlines stretch with the
machine's load (issue 37 item 9, D-450).

A deadline only says when a wait that never came true is reported as a failure; a condition that holds ends the
wait at once, so a longer deadline costs nothing when the test passes. Every deadline of the suite is
`seconds x time_factor()`:

- CONNECTOR_TEST_TIME_FACTOR (default 1): a factor the person or CI running the suite sets, e.g. 3 on a slow
  machine, or 0.5 to find hangs faster;
- times the machine's load per core when it is above 1 (the 1-minute load average divided by the cores, at most
  LOAD_FACTOR_CAP): a suite sharing two cores with another suite is slower in proportion, and waits in
  proportion. CONNECTOR_TEST_LOAD_SCALING=0 turns this part off.

The per-test timeout of pytest-timeout (pyproject.toml `timeout`, or a test's own `timeout` marker) is scaled the
same way when the test starts (tests/conftest.py).

`wait_for` polls a condition until it holds or its scaled deadline passes; `deadline` is the same deadline for a
loop that does more than poll; `scaled` is the bare number, for a subprocess or HTTP timeout; `whole_seconds` the
same rounded up, for the product's own timeouts a test sets (the egress read timeout: a loopback receiver that
answers in milliseconds idle may take seconds on a loaded machine, and the test would see a timeout it did not
stage)."""
from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

FACTOR_ENV = "CONNECTOR_TEST_TIME_FACTOR"
LOAD_SCALING_ENV = "CONNECTOR_TEST_LOAD_SCALING"
LOAD_FACTOR_CAP = 8.0

T = TypeVar("T")


def configured_factor() -> float:
    """CONNECTOR_TEST_TIME_FACTOR, a positive number (default 1)."""
    raw = os.environ.get(FACTOR_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{FACTOR_ENV}={raw!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"{FACTOR_ENV}={raw!r} must be positive")
    return value


def load_factor() -> float:
    """The 1-minute load average per core, between 1 and LOAD_FACTOR_CAP (1 where the platform has none, or with
    CONNECTOR_TEST_LOAD_SCALING=0)."""
    if os.environ.get(LOAD_SCALING_ENV, "").strip().lower() in {"0", "false", "no", "off"}:
        return 1.0
    try:
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 1.0
    return min(max(per_core, 1.0), LOAD_FACTOR_CAP)


def time_factor() -> float:
    return configured_factor() * load_factor()


def scaled(seconds: float) -> float:
    """`seconds` stretched by the time factor now."""
    return seconds * time_factor()


def whole_seconds(seconds: float) -> int:
    """`scaled(seconds)` rounded up to whole seconds: for a setting that takes an integer (the egress client's
    read timeout a test gives the product, CONNECTOR_EGRESS_TIMEOUT_SECONDS)."""
    return max(1, math.ceil(scaled(seconds)))


class Deadline:
    """A point `seconds x time_factor()` from now (the factor read once, when the deadline is set)."""

    def __init__(self, seconds: float) -> None:
        self.base = seconds
        self.seconds = scaled(seconds)
        self.at = time.monotonic() + self.seconds

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() >= self.at

    def describe(self) -> str:
        return f"{self.seconds:.1f} s ({self.base:g} s x time factor {self.seconds / self.base:.2f})" \
            if self.base else "0 s"

    def check(self, what: str) -> None:
        """Raise AssertionError naming `what` once the deadline has passed."""
        if self.passed():
            raise AssertionError(f"{what}: not within {self.describe()}")


def deadline(seconds: float) -> Deadline:
    return Deadline(seconds)


def wait_for(predicate: Callable[[], T], seconds: float, what: str, *, interval: float = 0.05,
             proc: subprocess.Popen | None = None) -> T:
    """Call `predicate` until it returns something truthy, and return that; AssertionError naming `what` when the
    scaled deadline passes first, or when `proc` (a child the condition depends on) exits meanwhile."""
    limit = Deadline(seconds)
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited with {proc.returncode} before it came true")
        limit.check(what)
        time.sleep(min(interval, limit.remaining()) or interval)


def holds_within(predicate: Callable[[], object], seconds: float, *, interval: float = 0.02) -> bool:
    """Whether `predicate` comes true within the scaled deadline (for a test that asserts with its own message)."""
    limit = Deadline(seconds)
    while True:
        if predicate():
            return True
        if limit.passed():
            return False
        time.sleep(interval)
