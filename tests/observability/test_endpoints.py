"""Issue 21 in process: the bearer-token protection of /metrics, the readiness check of unapplied migrations,
and the collector's grouping of quarantines and halts by closed reason code."""
from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from observability import health

TOKEN = "t" * 40
BOTH = {"databases": ["default", "journal"]}  # /readyz reads both


@pytest.mark.django_db
def test_metrics_are_open_without_a_configured_token(settings):
    """With CONNECTOR_METRICS_TOKEN empty (development, tests) /metrics answers without credentials."""
    settings.CONNECTOR_METRICS_TOKEN = ""
    answer = Client().get("/metrics")
    assert answer.status_code == 200
    assert b"connector_backlog_items{stage=\"materialization_due\"} 0.0" in answer.content


@pytest.mark.django_db(**BOTH)
def test_metrics_require_the_bearer_token_when_one_is_configured(settings):
    """With a token set, /metrics is 401 without it, with another one or another scheme, and 200 with
    `Authorization: Bearer <token>`; the health endpoints stay open."""
    settings.CONNECTOR_METRICS_TOKEN = TOKEN
    client = Client()
    for header in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": f"Basic {TOKEN}"},
                   {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}x"}):
        answer = client.get("/metrics", **header)
        assert answer.status_code == 401, header
        assert answer["WWW-Authenticate"].startswith("Bearer")
        assert b"connector_" not in answer.content
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200


@pytest.mark.django_db(**BOTH)
def test_readyz_is_503_naming_the_migrations_check_when_one_is_unapplied(monkeypatch):
    """A migration the code ships but the database has not recorded makes /readyz 503 with `migrations` failing
    and the migration named."""
    shipped = dict(health._migrations_on_disk())
    monkeypatch.setattr(health, "_migrations_on_disk", lambda: {**shipped, ("connector", "9999_not_applied"): ()})
    answer = Client().get("/readyz")
    assert answer.status_code == 503
    body = answer.json()
    assert body["failing"] == ["migrations"]
    assert "connector.9999_not_applied" in body["checks"]["migrations"]["detail"]


@pytest.mark.django_db
def test_quarantines_are_grouped_by_closed_reason_code(world):
    """A held materialization and a halted lane appear as connector_quarantined_items by kind and reason, with
    their oldest age; empty kinds produce no series."""
    from django.utils import timezone

    from connector.actors import Actor
    from connector.demo import DEMO_CHANNEL, demo_event_body
    from connector.models import MaterializationDue
    from connector.services.admission import receipt_admit
    from tests.dbroles import as_admin

    receipt = receipt_admit(account_key=world.accounts[0].account_key, channel=DEMO_CHANNEL, transport_key="q-1",
                            body=demo_event_body("q-1"), actor=Actor.system("test")).receipt
    with as_admin():
        MaterializationDue.objects.filter(receipt=receipt).update(held_reason="MATERIALIZATION_FAILED",
                                                                  held_at=timezone.now())
    text = Client().get("/metrics").content.decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    key = (("kind", "materialization"), ("reason", "MATERIALIZATION_FAILED"))
    assert samples[("connector_quarantined_items", key)] == 1
    assert 0 <= samples[("connector_quarantined_oldest_age_seconds", key)] < 600
    assert samples[("connector_backlog_items", (("stage", "materialization_held"),))] == 1
    assert samples[("connector_backlog_items", (("stage", "materialization_due"),))] == 0
    assert [k for k in samples if k[0] == "connector_quarantined_items"] == [("connector_quarantined_items", key)]


def test_production_refuses_to_start_without_a_metrics_token():
    """config.django.production with no (or a short) CONNECTOR_METRICS_TOKEN fails at start-up naming the
    variable: /metrics is never served open in production."""
    from tests.governance.test_production_hardening import PRODUCTION, _manage

    for token in ("", "short"):
        result = _manage("check", **{**PRODUCTION, "CONNECTOR_METRICS_TOKEN": token})
        assert result.returncode != 0
        assert "CONNECTOR_METRICS_TOKEN must be set for config.django.production" in result.stderr
