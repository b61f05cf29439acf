"""The test harness's flush between transactional tests (tests/fast_flush.py, D-175) empties every table, the
append-only ones included, and leaves the append-only and foreign-key guards working afterwards."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction


def _row_counts() -> dict[str, int]:
    counts = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.django_table_names(only_existing=True, include_views=False):
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
    return counts


@pytest.mark.django_db(transaction=True)
def test_flush_empties_every_table_and_keeps_the_guards():
    """After the demo world (accounts, gates, epochs, audit rows in append-only tables) a flush leaves every table
    empty, and in the next transaction a DELETE of an append-only row is still refused (the trigger-free role was
    local to the flush's transaction)."""
    from connector.demo import build_world
    from connector.models import AuditRecord

    build_world("ff-")
    before = {table: n for table, n in _row_counts().items() if n}
    assert "connector_auditrecord" in before and len(before) >= 10, before
    call_command("flush", interactive=False, verbosity=0, inhibit_post_migrate=True)  # no content types refill
    assert not {table: n for table, n in _row_counts().items() if n}
    with connection.cursor() as cursor:
        cursor.execute("SHOW session_replication_role")
        assert cursor.fetchone()[0] == "origin"
    build_world("ff2-")
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditRecord.objects.all().delete()
    assert AuditRecord.objects.exists()
