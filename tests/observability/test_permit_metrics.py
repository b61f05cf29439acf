"""Issue 21: "granted/sending permits" and "open permits per gate" in /metrics. A granted permit is counted at
the `permit_granted` stage with its age, the gate holding it is counted once with its number of open permits,
and once its budget is past it is listed as stuck work linking to its effect's page; after the send settles it,
every permit figure is back to zero."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from observability import readings
from tests.effects.conftest import push_world, receiver  # noqa: F401 - fixtures
from tests.effects.helpers import acquire, author, send


def _scrape() -> dict[tuple[str, tuple], float]:
    answer = Client().get("/metrics")
    assert answer.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.content.decode()) for s in family.samples}


def _backlog(samples, stage: str) -> tuple[float, float]:
    return (samples[("connector_backlog_items", (("stage", stage),))],
            samples[("connector_backlog_oldest_age_seconds", (("stage", stage),))])


@pytest.mark.django_db
def test_open_permits_are_counted_per_stage_and_per_gate_and_listed_when_stuck(push_world, receiver, settings):
    acme, other = push_world.accounts[:2]
    author(acme, root="order-1")
    author(acme, root="order-2")
    author(other, root="order-3")
    first, second = acquire("h-m1", acme), acquire("h-m2", acme)
    acquire("h-m3", other)

    samples = _scrape()
    assert _backlog(samples, "permit_granted")[0] == 3
    assert _backlog(samples, "permit_sending") == (0, 0)
    assert samples[("connector_gates_with_open_permits", ())] == 2
    assert samples[("connector_open_permits_max_per_gate", ())] == 2

    # two minutes later (granted_at is immutable: the reading's clock moves instead): the age shows, and both of
    # acme's permits are past the 60 s budget, the oldest first, each linking to its effect
    later = timezone.now() + timedelta(seconds=120)
    (granted,) = [b for b in readings.backlogs(later) if b.stage == "permit_granted"]
    assert granted.count == 3 and granted.age(later) >= 120
    stuck = [item for item in readings.stuck(settings.CONNECTOR["STAGE_BUDGETS_SECONDS"], now=later)
             if item.stage == "permit_granted"]
    assert [(item.url_name, item.url_pk) for item in stuck[:2]] == [
        ("governance:effect", first.permit.effect_id), ("governance:effect", second.permit.effect_id)]
    assert len(stuck) == 3 and stuck[0].age_seconds >= 120 and "halt" in stuck[0].action
    assert not [i for i in readings.stuck(settings.CONNECTOR["STAGE_BUDGETS_SECONDS"]) if i.stage == "permit_granted"]

    send(second)
    samples = _scrape()
    assert _backlog(samples, "permit_granted")[0] == 2
    assert samples[("connector_open_permits_max_per_gate", ())] == 1
    assert samples[("connector_gates_with_open_permits", ())] == 2
