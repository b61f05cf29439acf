"""Issue 21: /metrics counts a quarantined execution only while it waits for its remedy, as the quarantine board
does. The execution row stays quarantined forever (CV2-13-003); a replay of its event, or a resumption of its lane
past it, takes it off the metric as it takes it off the board."""
from __future__ import annotations

from unittest import mock

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from connector.actors import Actor
from governance import selectors
from tests.governance.test_remediation import _send, _strict_world, person


def _quarantined() -> dict[tuple[str, str], float]:
    text = Client().get("/metrics").content.decode()
    return {(s.labels["kind"], s.labels["reason"]): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "connector_quarantined_items"}


def _board(*kinds: str) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for code, items in selectors.board().items():
        for item in items:
            if item.kind in kinds:
                counts[(item.kind, code)] = counts.get((item.kind, code), 0) + 1
    return counts


@pytest.mark.django_db
def test_a_resumed_lane_takes_its_rejected_execution_off_the_metric():
    """Runtime rejects event 2 under a quarantine policy: the execution and its halted lane appear as
    RESULT_REJECTED, exactly as on the board; once the operator resumes the lane past it, neither does."""
    from connector.models import OrderingLane
    from connector.services import lanes
    from tests.connector.inbound_helpers import drain

    world = _strict_world()
    _send(world, 1)
    _send(world, 2, payee_email="not-an-address")
    _send(world, 3)
    drain()
    assert _quarantined() == {("execution", "RESULT_REJECTED"): 1, ("lane", "RESULT_REJECTED"): 1}
    assert _board("execution", "lane") == {key: 1 for key in _quarantined()}
    lane = OrderingLane.objects.get(partition="mem-1")
    lanes.lane_resume(lane_pk=lane.pk, mode="skip_with_evidence", evidence="source: 3 corrects 2 [T]",
                      actor=Actor.for_user(person("op", "operator")), expected_fence=lane.fence)
    drain()
    assert _quarantined() == {}


@pytest.mark.django_db
def test_a_replayed_execution_leaves_the_metric_though_its_row_stays_quarantined():
    """Runtime fails event 2 once: RESULT_FAILED execution and lane; after the replay runs, the metric has no
    quarantine left while the original execution row is still `quarantined` (it stays as evidence)."""
    from connector.models import Execution
    from connector.services import replay, runtime
    from tests.connector.inbound_helpers import drain

    world = _strict_world()
    _send(world, 1)
    drain()
    with mock.patch.object(runtime, "_apply_record", return_value="failed"):
        _send(world, 2)
        drain()
    assert _quarantined() == {("execution", "RESULT_FAILED"): 1, ("lane", "RESULT_FAILED"): 1}
    failed = Execution.objects.get(state="quarantined")
    replay.execution_replay(execution_pk=failed.pk, reason="runtime fixed [T]",
                            actor=Actor.for_user(person("op", "operator")), expected_changed_at=failed.changed_at)
    drain()
    assert Execution.objects.filter(state="quarantined").count() == 1
    assert _quarantined() == {}
