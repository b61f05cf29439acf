"""The activation scenarios of `bench activation --scenario` and their measuring functions. Each reuses
kill_mid_activation, timed_activation and readback, which pick the service call from the world's scenario.
Budgets are keyed by scenario ("first" at the top of the section; the others under their own key)."""
from __future__ import annotations

from collections.abc import Callable

from bench import activation, activation_coord
from bench.activation import ActivationResult

SCENARIOS: dict[str, Callable[..., ActivationResult]] = {"first": activation.measure_activation,
                                                          "cutover": activation_coord.measure_cutover,
                                                          "successor": activation_coord.measure_successor}
