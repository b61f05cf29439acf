"""What an operator sees of a poison item (decision D-168, CV2-13-001): the quarantine board lists it under its
closed reason with owner, alert deadline and remediation, and the receipt's admin page says why it is not
materialized — the hold, the StepFailure evidence (step, exception class and message, time) and the remediation —
instead of a bare "Materialized components 0 / 1"."""
from __future__ import annotations

from unittest import mock

from django.contrib.auth.models import User
from django.test import Client

from connector.choices import StepFailureReason
from connector.services import storable, sweeper
from governance.reasons import REASONS, reason
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import admit, build_inbound_world, webhook_body, webhook_event
from tests.governance.test_screens import client_for

STAMP_65 = "2026-01-01T00:00:00." + "1" * 44 + "Z"


def test_every_step_failure_reason_is_in_the_closed_map():
    """Each reason a poison quarantine can write has an owner, an alert deadline and a remediation.
    Proves: CV2-13-001, CV2-13-007"""
    for code in StepFailureReason.values:
        entry = reason(code)
        assert entry.code == code and entry.owner and entry.deadline.total_seconds() > 0 and entry.remediation


def test_a_held_receipt_is_on_the_board_and_its_admin_page_shows_reason_evidence_and_remediation(people):
    """A receipt admitted before the storability check (a 65-character occurred_at) fails materialization with a
    DataError: the board lists it under MATERIALIZATION_FAILED (owner, deadline, remediation, a link to its page),
    and the receipt's admin page shows `held MATERIALIZATION_FAILED`, the StepFailure row with the exception
    class and message, and the remediation. Proves: CV2-13-001, CV2-13-007"""
    world = build_inbound_world("gb-", [PACK_A])
    with mock.patch.object(storable, "events_check", lambda **kwargs: None):
        receipt = admit(world, "records.webhook", webhook_body(webhook_event("ev-1", "rec-1", 1,
                                                                             emitted_at=STAMP_65)))
    assert sweeper.inbound_sweep(grace_seconds=0).quarantined == 1
    board = client_for(people["auditor"]).get("/board/").content.decode()
    entry = REASONS["MATERIALIZATION_FAILED"]
    assert 'id="r-MATERIALIZATION_FAILED"' in board and entry.owner in board
    assert f"Receipt #{receipt.pk} (records.webhook)" in board
    assert f"/admin/connector/receipt/{receipt.pk}/change/" in board
    admin = Client()
    admin.force_login(User.objects.create_superuser("root-gb", password="pw-root"))
    page = admin.get(f"/admin/connector/receipt/{receipt.pk}/change/").content.decode()
    assert "0 / 1" in page and "held" in page and "<code>MATERIALIZATION_FAILED</code>" in page
    assert "django.db.utils.DataError" in page and "value too long for type character varying(64)" in page
    assert "receipt_materialize" in page and "poison_release --receipt" in page and entry.owner in page
