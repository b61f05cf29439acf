"""Issue 21: the overview shows where work waits. Stage samples (one row per stage per minute, kept a day) feed
the backlog and age pictures; throughput per stage has a legend; items older than their stage's budget are listed
as stuck work with a link to each item's page and what to do; a receipt's page says why it has not
materialized."""
from __future__ import annotations

import time
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from connector.models import MaterializationDue
from connector.services import storable, sweeper
from observability.models import StageSample
from observability.readings import STAGES
from observability.services import stage_samples_record
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import admit, advance_lanes, build_inbound_world, webhook_body, webhook_event
from tests.governance.test_poison_board import STAMP_65
from tests.governance.test_screens import client_for


@pytest.fixture
def inbound(db):
    return build_inbound_world("po-", [PACK_A])


def test_a_stage_sample_is_one_row_per_stage_once_per_second_and_kept_a_day(inbound):
    now = timezone.now().replace(microsecond=0)
    admit(inbound, "records.webhook", webhook_body(webhook_event("ev-1", "rec-1", 1)))
    rows = stage_samples_record(now=now)
    assert [r.stage for r in rows] == [s.name for s in STAGES]
    stored = {s.stage: (s.count, s.oldest_age_seconds) for s in StageSample.objects.filter(taken_at=now)}
    assert stored["materialization_due"][0] == 1 and stored["execution_ready"] == (0, 0.0)
    stage_samples_record(now=now)  # a beat that fired twice in the same second writes nothing more
    assert StageSample.objects.filter(taken_at=now).count() == len(STAGES)
    stage_samples_record(now=now + timedelta(hours=26))
    assert not StageSample.objects.filter(taken_at=now).exists()  # older than the day's retention: dropped


def test_stuck_work_lists_items_past_their_budget_with_a_link_and_an_action(inbound, people, settings):
    """An execution left ready past the execution_ready budget and a receipt not materialized past its budget are
    listed, oldest first, each linking to its page; a fresh one is not."""
    settings.CONNECTOR = {**settings.CONNECTOR, "STAGE_BUDGETS_SECONDS": {
        **settings.CONNECTOR["STAGE_BUDGETS_SECONDS"], "execution_ready": 2, "materialization_due": 2}}
    from connector.services import materialize

    first = admit(inbound, "records.webhook", webhook_body(webhook_event("ev-1", "rec-1", 1)))
    materialize.receipt_materialize(receipt_pk=first.pk)
    [ready] = advance_lanes()
    waiting = admit(inbound, "records.webhook", webhook_body(webhook_event("ev-2", "rec-2", 1)))
    time.sleep(3)
    fresh = admit(inbound, "records.webhook", webhook_body(webhook_event("ev-3", "rec-3", 1)))
    # The page is read one second after the fresh receipt, whatever the machine's load: the other two have waited
    # at least four seconds (past the 2 s budgets), the fresh one one second.
    with mock.patch("django.utils.timezone.now", return_value=fresh.created_at + timedelta(seconds=1)):
        page = client_for(people["auditor"]).get("/").content.decode()
    stuck = page[page.index('id="stuck"'):page.index("</table>", page.index('id="stuck"'))]
    assert f'href="/queue/execution/{ready.pk}/"' in stuck and f"execution #{ready.pk} (execution ready)" in stuck
    assert f'href="/receipts/{waiting.pk}/"' in stuck
    assert f'href="/receipts/{fresh.pk}/"' not in stuck
    assert stuck.index(f"/queue/execution/{ready.pk}/") < stuck.index(f"/receipts/{waiting.pk}/")  # oldest first
    assert "claims workers" in stuck and "materialize" in stuck
    for name in ("admitted", "materialized", "completed", "effects finalized"):
        assert name in page[page.index('id="throughput-legend"'):]


def test_the_receipt_page_says_why_it_has_not_materialized(inbound, people, settings):
    """Waiting (within or past its budget), held with its closed reason and remedy, or materialized."""
    client = client_for(people["auditor"])
    receipt = admit(inbound, "records.webhook", webhook_body(webhook_event("ev-1", "rec-1", 1)))
    page = client.get(f"/receipts/{receipt.pk}/").content.decode()
    assert 'id="receipt-state"><span class="state" title="' in page and '<span class="badge">waiting</span> Waiting' in page
    assert "for the materialize workers (budget 60 s)" in page
    with mock.patch.object(storable, "events_check", lambda **kwargs: None):
        held = admit(inbound, "records.webhook", webhook_body(webhook_event("ev-2", "rec-2", 2, emitted_at=STAMP_65)))
    sweeper.inbound_sweep(grace_seconds=0)
    page = client.get(f"/receipts/{held.pk}/").content.decode()
    assert 'id="receipt-state"><span class="state" title="' in page and '<span class="badge">held</span> Held' in page
    assert "MATERIALIZATION_FAILED" in page and "poison_release --receipt" in page
    assert not MaterializationDue.objects.filter(receipt=receipt).exists()  # the sweep materialized the first
    page = client.get(f"/receipts/{receipt.pk}/").content.decode()
    assert 'id="receipt-state"><span class="state" title="' in page and '<span class="badge">materialized</span> Materialized' in page and "1 event(s)" in page
    assert client_for(people["nobody"]).get(f"/receipts/{receipt.pk}/").status_code == 403


def test_the_backlog_pictures_are_drawn_from_the_stage_samples(inbound, people):
    """Two samples ten minutes apart give each stage a two-point line in the backlog and age pictures, with the
    stage in the legend; a stage's current reading is in the text beside them."""
    now = timezone.now().replace(microsecond=0)
    stage_samples_record(now=now - timedelta(minutes=10))
    admit(inbound, "records.webhook", webhook_body(webhook_event("ev-1", "rec-1", 1)))
    stage_samples_record(now=now)
    page = client_for(people["auditor"]).get("/").content.decode()
    backlog = page[page.index('id="backlog-title"'):page.index("</figure>", page.index('id="backlog-title"'))]
    lines = [chunk for chunk in backlog.split("<polyline")[1:]]
    assert len(lines) == len(STAGES)
    due = next(line for line in lines if "Receipts to materialize (materialization_due): 1 now" in line)
    assert len(due.split('points="')[1].split('"')[0].split()) == 2
    assert "materialization_due" in backlog[backlog.index('class="legend"'):]
    assert "Receipts to materialize</span> 1 (oldest" in page
