"""What became of each event a ReplayRequest replayed (its disposition), for the replay answer and its read
(D-194). Read-only; computed from the facts: the replay Event, its Projection, the SupersededDecision or the
Execution of the replay's generation, and the lane."""
from __future__ import annotations

from connector.choices import LaneState, OrderingContract
from connector.models import Execution, OrderingLane, ReplayRequest
from connector.selectors.lanes import expected_position, remediation_request_id  # noqa: F401 - its read path

# The closed set of dispositions a replayed event can have.
DISPOSITIONS = ("materialization_pending", "superseded", "execution", "waiting")


def _position(value) -> str | None:
    return None if value is None else str(value)


def replay_dispositions(request: ReplayRequest) -> list[dict]:
    """One entry per event the replay materialized (one today: a replay copies one predecessor component), or one
    `materialization_pending` entry while the replay Receipt waits for materialization (the sweeper finishes it)."""
    events = list(request.events.select_related("projection", "projection__superseded").order_by("pk"))
    if not events:
        return [{"event": None, "partition": None, "position": None, "disposition": "materialization_pending",
                 "detail": "the replay Receipt is admitted and waits for materialization", "high_water": None,
                 "execution": None}]
    return [_disposition(event) for event in events]


def _disposition(event) -> dict:
    out = {"event": event.pk, "partition": event.partition or None, "position": _position(event.position),
           "high_water": None, "execution": None}
    projection = getattr(event, "projection", None)
    if projection is None:
        return {**out, "disposition": "materialization_pending", "detail": "no projection yet"}
    superseded = getattr(projection, "superseded", None)
    if superseded is not None:
        hw = _position(superseded.high_water_at_decision)
        detail = (f"superseded at or below the lane high-water {hw}; Runtime was not called"
                  if superseded.reason == "at_or_below_high_water" else
                  f"superseded: lower than the selected position {_position(superseded.selected_position)}")
        return {**out, "disposition": "superseded", "detail": detail, "high_water": hw}
    execution = Execution.objects.filter(projection=projection).order_by("-generation").first()
    if execution is not None:
        return {**out, "disposition": "execution",
                "detail": f"runs as execution #{execution.pk} (generation {execution.generation} of the replay "
                          f"projection #{projection.pk}) with external effects suppressed; now {execution.state}",
                "execution": {"id": execution.pk, "generation": execution.generation, "state": execution.state,
                              "outcome": execution.result_outcome or None, "suppress_external_effects": True}}
    lane = OrderingLane.objects.filter(pk=projection.lane_id).first()
    if lane is None:
        return {**out, "disposition": "waiting", "detail": "waits for its execution to be minted"}
    hw = _position(lane.high_water)
    if lane.state == LaneState.HALTED:
        detail = f"waits: the partition is halted by {lane.halt_reason}"
    elif lane.active_execution_id is not None:
        detail = f"waits behind the lane's active execution #{lane.active_execution_id}"
    elif lane.contract == OrderingContract.STRICT_SOURCE_SEQUENCE and event.position != expected_position(lane):
        detail = f"waits: the strict lane expects position {expected_position(lane)} first"
    else:
        detail = "waits for the next lane step (settle window or sweep)"
    return {**out, "disposition": "waiting", "detail": detail, "high_water": hw}


def v1_predecessor_evidence(replay: ReplayRequest) -> dict | None:
    """The replay's V1 predecessor ref as read-only evidence (D-331), or None for a V2 predecessor."""
    ref = replay.v1_predecessor
    if ref is None:
        return None
    return {"protocol_version": ref.protocol_version, "receipt_channel": ref.v1_receipt_channel,
            "receipt_transport_key": ref.v1_receipt_transport_key, "event_id": ref.v1_event_id,
            "work_item_id": ref.v1_work_item_id, "original_epoch": ref.original_epoch,
            "payload_digest": bytes(ref.payload_digest), "result_digest": bytes(ref.result_digest)}


def replay_data(replay: ReplayRequest, *, admission: str | None = None) -> dict:
    """The replay API's body for one request: ids, target epoch, V1 predecessor evidence, dispositions."""
    data = {"request": replay.pk, "request_id": replay.request_id, "receipt": replay.receipt.pk,
            "target_epoch": {"id": replay.target_epoch.epoch_id, "digest": bytes(replay.target_epoch_digest)},
            "v1_predecessor": v1_predecessor_evidence(replay), "events": replay_dispositions(replay)}
    return {**data, "admission": admission} if admission else data
