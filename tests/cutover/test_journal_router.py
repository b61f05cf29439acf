"""The cutover journal lives in its own database, outside the one a restore replaces."""
from __future__ import annotations

import pytest
from django.db import connections

from cutover.models import CutoverDecision


@pytest.mark.django_db(databases=["default", "journal"])
def test_cutover_decision_is_written_to_the_journal_database_only():
    """Proves: CV2-12-062"""
    CutoverDecision.objects.create(attempt_key="attempt-1")
    with connections["journal"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM cutover_cutoverdecision")
        assert cursor.fetchone()[0] == 1
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT to_regclass('cutover_cutoverdecision')")
        assert cursor.fetchone()[0] is None
        cursor.execute("SELECT to_regclass('connector_servingepoch')")
        assert cursor.fetchone()[0] is not None
    with connections["journal"].cursor() as cursor:
        cursor.execute("SELECT to_regclass('connector_servingepoch')")
        assert cursor.fetchone()[0] is None
