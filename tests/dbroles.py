"""The suite runs under the product's database roles (issue 17, docs/security.md): the connector owner migrates
the test databases, every test body runs as the application role, and the harness itself (database creation,
flushes) acts as the administrator it connects as. Tests that do administrator things on purpose (switch
triggers off to stage a corrupt row, restart servers, dump and restore) wrap them in `as_admin()`."""
from __future__ import annotations

from contextlib import contextmanager

import psycopg
from django.db import connections

from connector import dbroles

APP, OWNER = dbroles.APP, dbroles.OWNER


def prepare_server() -> None:
    """Create the two roles on the test server if missing (as the administrator the suite connects as)."""
    s = connections["default"].settings_dict
    with psycopg.connect(host=s.get("HOST") or None, port=s.get("PORT") or None, user=s.get("USER") or None,
                         password=s.get("PASSWORD") or None, dbname="postgres", autocommit=True) as conn:
        for statement in dbroles.roles_sql():
            conn.execute(statement)


def use(role: str | None) -> None:
    """Every connection from now on assumes `role` (None: the administrator); open ones switch at once."""
    for alias in connections:
        connection = connections[alias]
        connection.settings_dict["OPTIONS"]["assume_role"] = role
        if connection.connection is not None and not connection.needs_rollback:
            try:
                with connection.connection.cursor() as cursor:
                    cursor.execute(f'SET ROLE "{role}"' if role else "SET ROLE NONE")
            except psycopg.Error:
                pass  # a broken transaction is rolled back by the harness, which resets the role with it


def current(using: str = "default") -> str:
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT current_user")
        return cursor.fetchone()[0]


@contextmanager
def as_admin(*aliases: str):
    """Act as the administrator the suite connects as, then return to the role in force before."""
    aliases = aliases or ("default",)
    before = {alias: connections[alias].settings_dict["OPTIONS"].get("assume_role") for alias in aliases}
    for alias in aliases:
        with connections[alias].cursor() as cursor:
            cursor.execute("SET ROLE NONE")
    try:
        yield
    finally:
        for alias, role in before.items():
            if role and connections[alias].connection is not None and not connections[alias].needs_rollback:
                try:
                    with connections[alias].connection.cursor() as cursor:
                        cursor.execute(f'SET ROLE "{role}"')
                except psycopg.Error:
                    pass  # an aborted transaction: its rollback restores the role it started with


def child_env() -> dict[str, str]:
    """A child Django process started by a test runs as the application role too."""
    return {"DATABASE_ASSUME_ROLE": APP}


def admin_on(cursor) -> None:
    """On this (Django) cursor's connection, act as the administrator: a test staging a row no role of the
    product could write (triggers off, an index dropped) says so. Pair with `admin_off`."""
    cursor.execute("SET ROLE NONE")


def admin_off(cursor) -> None:
    """Back to the role this connection assumes (the application role inside a test)."""
    role = cursor.db.settings_dict["OPTIONS"].get("assume_role")
    if role:
        cursor.execute(f'SET ROLE "{role}"')


def assert_append_only(table: str, pk: int, constraint: str) -> None:
    """An append-only row (D-182): the application role holds no UPDATE or DELETE on `table`, and its row trigger
    (named `constraint`) refuses both even to the administrator."""
    import pytest
    from django.db import IntegrityError, ProgrammingError, connection, transaction

    for sql in (f"UPDATE {table} SET evidence = 'edited' WHERE id = %s", f"DELETE FROM {table} WHERE id = %s"):
        with pytest.raises(ProgrammingError, match="permission denied"), transaction.atomic(), \
                connection.cursor() as cursor:
            cursor.execute(sql, [pk])
        with pytest.raises(IntegrityError) as info, as_admin(), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [pk])
        assert info.value.__cause__.diag.constraint_name == constraint
