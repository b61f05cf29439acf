"""The test harness's speedups (D-175) keep what they replace: the flush between transactional tests
(tests/fast_flush.py) empties every table, the append-only ones included, and leaves the append-only and
foreign-key guards working afterwards; migrations (tests/fast_migrate.py) no longer pile up django-fsm receivers for
historical models, and the project's models still have their transitions."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.db.models.signals import class_prepared


def _row_counts() -> dict[str, int]:
    counts = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.django_table_names(only_existing=True, include_views=False):
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
    return counts


def _filenodes(*tables: str) -> dict[str, int]:
    nodes = {}
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute("SELECT pg_relation_filenode(%s)", [table])
            nodes[table] = cursor.fetchone()[0]
    return nodes


@pytest.mark.django_db(transaction=True)
def test_flush_empties_every_table_and_keeps_the_guards():
    """After the demo world (accounts, gates, epochs, audit rows in append-only tables) and the accounts table grown
    past 1 MiB, a flush leaves every table empty (the large table truncated, the others deleted from), and in the
    next transaction a DELETE of an append-only row is still refused (the trigger-free role was local to the
    flush's transaction)."""
    from connector.demo import build_world
    from connector.models import AuditRecord

    from tests.fast_flush import BLOATED_BYTES

    build_world("ff-")
    with connection.cursor() as cursor:  # a referenced table past the size at which it is truncated, not deleted
        cursor.execute("INSERT INTO connector_connectoraccount (account_key, provider_scope, display_name, created_at) "
                       "SELECT 'bloat-' || g, 'scope', repeat('n', 250), now() FROM generate_series(1, 5000) g")
        cursor.execute("SELECT pg_relation_size('connector_connectoraccount') > %s", [BLOATED_BYTES])
        assert cursor.fetchone()[0]
    before = {table: n for table, n in _row_counts().items() if n}
    assert "connector_auditrecord" in before and len(before) >= 10, before
    files = _filenodes("connector_connectoraccount", "connector_auditrecord")
    # as TransactionTestCase flushes (no sequence reset); no content types refilled, so every table must be empty
    call_command("flush", interactive=False, verbosity=0, reset_sequences=False, inhibit_post_migrate=True)
    assert not {table: n for table, n in _row_counts().items() if n}
    after = _filenodes("connector_connectoraccount", "connector_auditrecord")
    # the large table was truncated (CASCADE: other tables reference it), the append-only audit table deleted from
    assert after["connector_connectoraccount"] != files["connector_connectoraccount"]
    assert after["connector_auditrecord"] == files["connector_auditrecord"]
    with connection.cursor() as cursor:
        cursor.execute("SHOW session_replication_role")
        assert cursor.fetchone()[0] == "origin"
    build_world("ff2-")
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditRecord.objects.all().delete()
    assert AuditRecord.objects.exists()


def test_migration_states_leave_no_fsm_receivers_and_project_models_keep_their_transitions():
    """Rendering every historical model of the migration graph (each with its FSMFields) leaves the number of
    class_prepared receivers unchanged (django-fsm connected one per field and rendering, and they piled up); the
    project's Execution still lists its transitions."""
    from django.db.migrations.loader import MigrationLoader

    from connector.models import Execution

    loader = MigrationLoader(None, ignore_no_migrations=True)
    before = len(class_prepared.receivers)
    for _ in range(3):  # a migration run renders the states again and again
        rendered = loader.project_state().apps
        assert rendered.get_model("connector", "Execution")._meta.get_field("state").__class__.__name__ == "FSMField"
    assert len(class_prepared.receivers) == before
    transitions = {t.name for t in Execution().get_all_state_transitions()}
    assert {"complete", "quarantine"} <= transitions, transitions
