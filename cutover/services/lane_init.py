"""OrderingLane initialization from the certified V1 baselines when validation begins (seed step 7, CV2-12-055).

`initialize_lanes_from_baselines(attempt)` runs inside `cutover_begin_validation`'s `default` transaction, after
every frozen gate moved `v1_drained -> v2_validating`: for each OrderingBaseline of the attempt it creates the
candidate epoch's lane for that account, route and partition with `baseline` = `high_water` = the drained V1
high-water (origin `v1_high_water` or `provider_snapshot_barrier`), so the first V2 admission continues after the
last position V1 applied instead of reapplying or skipping it. A baseline whose route is not an enabled inbound
route of the candidate epoch refuses (its ordering would be unsupported). Idempotent: an existing lane with the
same baseline is kept; a different one refuses. The lane rows are written by connector
(`connector.services.lane_handoff.lane_create_from_baseline`), which owns them."""
from __future__ import annotations

from connector.errors import ConnectorError
from connector.selectors.routes import route_for
from connector.services.lane_handoff import lane_create_from_baseline
from cutover.errors import CutoverPhaseRefused
from cutover.models import OrderingBaseline, ServiceCutoverAttempt

__all__ = ["initialize_lanes_from_baselines"]


def initialize_lanes_from_baselines(attempt: ServiceCutoverAttempt) -> int:
    """Create the candidate epoch's OrderingLanes from the attempt's OrderingBaselines; returns lanes created."""
    epoch = attempt.candidate_epoch
    created = 0
    for baseline in OrderingBaseline.objects.filter(attempt=attempt).order_by("pk"):
        try:
            route = route_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), account_id=baseline.account_id,
                              channel=baseline.route_key)
        except ConnectorError as exc:
            raise CutoverPhaseRefused(f"baseline route {baseline.route_key} is not a route of the candidate epoch: "
                                      f"{exc.detail}") from exc
        lane = lane_create_from_baseline(epoch=epoch, account_id=baseline.account_id, route=route.business_key,
                                         route_version=route.version, partition=baseline.partition,
                                         contract=route.contract, baseline=baseline.high_water,
                                         origin=baseline.origin)
        if not lane.created:
            if lane.lane.baseline != baseline.high_water:
                raise CutoverPhaseRefused(f"lane {lane.lane.pk} exists with another baseline")
            continue
        created += 1
    return created
