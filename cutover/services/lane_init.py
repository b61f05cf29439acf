"""The hook that initializes V2 OrderingLanes from the drained V1 high-waters when validation begins.

`initialize_lanes_from_baselines(attempt)` runs inside `cutover_begin_validation`'s `default` transaction, after
every frozen gate moved `v1_drained -> v2_validating`. Its job (engineer B's OrderingBaseline, CV2-12-045/046): for
each OrderingBaseline row of the attempt (account, route, partition, drained V1 high-water, comparator) create the
candidate epoch's OrderingLane with `high_water` = the baseline's high-water and the baseline's comparator, so
that the first V2 admission continues after the last V1-applied position instead of reapplying or skipping.

OrderingBaseline is not on this branch: the hook is a no-op that returns 0 lanes, and the integrator wires it to
B's `ordering_baseline` rows (it must lock lanes in the canonical order, docs/locking.md #5)."""
from __future__ import annotations

from cutover.models import ServiceCutoverAttempt

__all__ = ["initialize_lanes_from_baselines"]


def initialize_lanes_from_baselines(attempt: ServiceCutoverAttempt) -> int:
    """Create the candidate epoch's OrderingLanes from the attempt's OrderingBaselines; returns lanes created."""
    return 0
