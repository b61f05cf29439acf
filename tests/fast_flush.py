"""A cheaper flush between transactional tests (`django_db(transaction=True)`, `transactional_db`, `live_server`).

Django empties every table after such a test with one `TRUNCATE` of all ~85 tables. TRUNCATE gives every table,
index and TOAST relation a new file and drops the old ones at COMMIT: about 2-5 s per test on the shared 2-core
machine, times ~130 transactional tests. The tables hold a few rows each, so deleting the rows is much cheaper
(~0.1 s): `DELETE FROM` each table in one transaction with `session_replication_role = replica`, which, like
TRUNCATE, fires no row trigger (the append-only and immutability guards) and no foreign-key check (the RI
triggers), so the order does not matter. Sequences are not reset, as with Django's own flush unless a test asks
for `reset_sequences` (then Django's TRUNCATE ... RESTART IDENTITY is kept, as is its TRUNCATE ... CASCADE of a
partial flush, `available_apps`). Without the privilege to set `session_replication_role` (not a superuser) the
DO block falls back to Django's TRUNCATE. Deleted rows stay as dead tuples until a vacuum (the shared server runs
without autovacuum), so a table whose file has grown past 1 MiB is truncated instead, with CASCADE (PostgreSQL
refuses to truncate a referenced table alone; the tables that reference it are being emptied anyway).

Only the test process uses this (installed by tests/conftest.py); `manage.py flush` is unchanged.
"""
from __future__ import annotations

from django.db.backends.postgresql.operations import DatabaseOperations

_django_sql_flush = DatabaseOperations.sql_flush
BLOATED_BYTES = 1 << 20  # a table this large (rows and dead tuples) is truncated instead (one new file)


def _sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
    truncate = _django_sql_flush(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
    if not tables or reset_sequences or allow_cascade:  # a partial flush (available_apps) must cascade: TRUNCATE
        return truncate
    names = ", ".join("'" + table.replace("'", "''") + "'" for table in tables)
    (truncate_sql,) = truncate
    return [
        "DO $flush$ DECLARE t text; BEGIN "
        "BEGIN PERFORM set_config('session_replication_role', 'replica', true); "
        f"EXCEPTION WHEN insufficient_privilege THEN {truncate_sql} RETURN; END; "
        f"FOREACH t IN ARRAY ARRAY[{names}]::text[] LOOP "
        f"IF pg_relation_size(quote_ident(t)::regclass) > {BLOATED_BYTES} "
        "THEN EXECUTE 'TRUNCATE ' || quote_ident(t) || ' CASCADE'; "
        "ELSE EXECUTE 'DELETE FROM ' || quote_ident(t); END IF; "
        "END LOOP; END $flush$;"
    ]


def install() -> None:
    DatabaseOperations.sql_flush = _sql_flush
