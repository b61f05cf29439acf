"""Issue 21 over real HTTP: the web process of `make run` answers /metrics with the figures PostgreSQL holds
(known work in, exact counts out; a stuck item shows its age) and /readyz with its checks; a web process that
cannot reach PostgreSQL stays alive (/healthz) and answers /readyz 503 naming the database check."""
from __future__ import annotations

import httpx
import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from connector.actors import Actor
from connector.demo import DEMO_CHANNEL, build_world, demo_event_body
from connector.models import MaterializationDue
from connector.services.admission import receipt_admit
from tests.dbroles import admin_off, admin_on
from tests.faults.servers import free_port
from tests.observability.conftest import start_web
from tests.support import scaled

TRANSACTIONAL = {"transaction": True, "databases": ["default", "journal"]}


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=scaled(30))
    assert answer.status_code == 200, answer.text[:500]
    assert answer.headers["Content-Type"].startswith("text/plain; version=")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


def _stage(samples, name: str, stage: str) -> float:
    return samples[(name, (("stage", stage),))]


@pytest.mark.django_db(**TRANSACTIONAL)
def test_metrics_count_the_admitted_receipts_and_age_the_stuck_one(web_server):
    """After the demo world (two accounts, gates v2_serving, one active and one verified epoch) and five receipts
    admitted but not materialized, a scrape of the web process reports exactly five due materializations, two
    v2_serving gates, one active and one verified epoch, nothing ready or quarantined; once the oldest receipt's
    admission is staged an hour back, the stage's oldest-age gauge reads at least 3600 s (issue 21)."""
    world = build_world()
    actor = Actor.system("test")
    receipts = [receipt_admit(account_key=world.accounts[0].account_key, channel=DEMO_CHANNEL,
                              transport_key=f"obs-{n}", body=demo_event_body(f"obs-{n}"), actor=actor).receipt
                for n in range(5)]
    assert MaterializationDue.objects.count() == 5

    samples = _scrape(web_server)
    assert _stage(samples, "connector_backlog_items", "materialization_due") == 5
    assert _stage(samples, "connector_backlog_oldest_age_seconds", "materialization_due") < 600
    for stage in ("materialization_held", "lane_pending", "execution_ready", "execution_lease_expired",
                  "effect_prepared", "effect_dispatching", "delivery_held", "window_open"):
        assert _stage(samples, "connector_backlog_items", stage) == 0, stage
        assert _stage(samples, "connector_backlog_oldest_age_seconds", stage) == 0, stage
    assert samples[("connector_serving_gates", (("mode", "v2_serving"),))] == 2
    assert samples[("connector_serving_gates", (("mode", "v2_halted"),))] == 0
    assert samples[("connector_serving_epochs", (("state", "active"),))] == 1
    assert samples[("connector_serving_epochs", (("state", "verified"),))] == 1
    assert not [key for key in samples if key[0] == "connector_quarantined_items"]
    assert samples[("connector_reason_alert_deadline_seconds", (("reason", "EFFECT_UNCERTAIN"),))] == 1800

    # Receipts are immutable (a row trigger): only the administrator, with triggers off, can stage an old one.
    with connection.cursor() as cursor:
        admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE connector_receipt SET created_at = now() - interval '1 hour' WHERE id = %s",
                       [receipts[0].pk])
        cursor.execute("SET session_replication_role = DEFAULT")
        admin_off(cursor)

    samples = _scrape(web_server)
    assert _stage(samples, "connector_backlog_items", "materialization_due") == 5
    assert _stage(samples, "connector_backlog_oldest_age_seconds", "materialization_due") >= 3600
    assert samples[("connector_scrape_duration_seconds", ())] < scaled(5)


@pytest.mark.django_db(**TRANSACTIONAL)
def test_readyz_and_healthz_answer_from_the_web_process(web_server):
    """/healthz is 200 {"status": "ok"}; /readyz is 200 with both databases reachable, every migration applied
    and the serving state readable (issue 21)."""
    build_world()
    health = httpx.get(f"http://127.0.0.1:{web_server}/healthz", timeout=scaled(30))
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    ready = httpx.get(f"http://127.0.0.1:{web_server}/readyz", timeout=scaled(30))
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["status"] == "ok" and body["failing"] == []
    assert {name: check["status"] for name, check in body["checks"].items()} == {
        "database_default": "ok", "database_journal": "ok", "migrations": "ok", "serving_state": "ok",
        "durable_commits": "ok"}
    assert body["checks"]["serving_state"]["detail"] == "2 gates"


@pytest.mark.django_db(**TRANSACTIONAL)
def test_readyz_names_the_database_when_postgresql_is_unreachable(tmp_path):
    """A web process whose DATABASE_URL points at a closed port starts and answers /healthz 200, while /readyz
    answers 503 naming database_default (and the checks that need it) as failing; /metrics answers 503 instead
    of guessing figures (issue 21)."""
    closed = free_port()
    port, web = start_web(tmp_path, DATABASE_URL=f"postgres://postgres@127.0.0.1:{closed}/nowhere")
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=scaled(30)).status_code == 200
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=scaled(60))
        assert ready.status_code == 503, ready.text
        body = ready.json()
        assert "database_default" in body["failing"] and "database_journal" not in body["failing"]
        assert body["checks"]["database_default"]["detail"].startswith("OperationalError")
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=scaled(60)).status_code == 503
    finally:
        web.stop()
