"""The set-based insert (STYLE R28/R31): N rows of one model in one `INSERT ... SELECT ... FROM unnest(...)`
statement, bound on the server, for the hot writers that insert many rows at once (materialization, lane
advance, outbound authoring)."""
from __future__ import annotations

import re

from django.db import transaction
from django.db.models import JSONField
from django.utils import timezone

__all__ = ["insert_rows"]

_INSERT_SQL: dict[tuple, tuple[str, tuple]] = {}


def _insert_statement(model, returning: tuple[str, ...], conflict_nothing: bool,
                      shared: tuple[bool, ...]) -> tuple[str, tuple]:
    """One fixed statement per (table, returning, conflict rule, which columns hold one value for every row):
    `INSERT INTO t (cols) SELECT %b::type | u.cN, ... [FROM unnest(%b::type[], ...) AS u(...)] [ON CONFLICT DO
    NOTHING] RETURNING ...`. A column whose value is the same in every row (the receipt's account, epoch, route,
    the defaults) is bound once as a scalar instead of an array of copies (D-263); the others are arrays
    unnested together, in row order. Built from the model's own columns and types, so it never drifts from the
    schema; values are parameters only (never SQL built from input)."""
    key = (model, returning, conflict_nothing, shared)
    if key not in _INSERT_SQL:
        from django.db import connection

        if len(_INSERT_SQL) >= 256:  # bounded: the shapes are few in practice, never data-sized
            _INSERT_SQL.clear()
        fields = _fields(model)
        table = connection.ops.quote_name(model._meta.db_table)
        columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
        # Casts to the bare type (varchar, not varchar(64)): an explicit cast to a length would silently truncate
        # a value the column must refuse; assignment to the column enforces the length as a single insert does.
        bare = [re.sub(r"[(][^)]*[)]", "", f.db_type(connection)) for f in fields]
        select = ", ".join(f"%b::{t}" if one else f"u.c{i}" for i, (t, one) in enumerate(zip(bare, shared)))
        arrays = [(i, t) for i, (t, one) in enumerate(zip(bare, shared)) if not one]
        source = (" FROM unnest(" + ", ".join(f"%b::{t}[]" for _, t in arrays) + ") AS u("
                  + ", ".join(f"c{i}" for i, _ in arrays) + ")") if arrays else ""
        sql = (f"INSERT INTO {table} ({columns}) SELECT {select}{source}"
               + (" ON CONFLICT DO NOTHING" if conflict_nothing else "")
               + " RETURNING " + ", ".join(connection.ops.quote_name(c) for c in returning))
        _INSERT_SQL[key] = (sql, fields)
    return _INSERT_SQL[key]


_FIELDS: dict = {}


def _fields(model) -> tuple:
    if model not in _FIELDS:
        _FIELDS[model] = tuple(f for f in model._meta.concrete_fields if not f.primary_key)
    return _FIELDS[model]


def _one_value(values: list) -> bool:
    first = values[0]
    return all(v is first or (type(v) is type(first) and v == first) for v in values)


def insert_rows(model, rows: list[dict], *, returning: tuple[str, ...] = ("id",),
                 conflict_nothing: bool = False) -> list[tuple]:
    """Insert `rows` (attname -> value; missing columns take the field default, `auto_now(_add)` the current
    time) in ONE statement, in the given order, and return the RETURNING tuples (rows skipped by a conflict are
    absent). Row constraints, foreign keys and triggers apply to every row exactly as for a single insert."""
    assert transaction.get_connection().in_atomic_block
    if not rows:
        return []
    fields, now, columns, connection = _fields(model), timezone.now(), [], transaction.get_connection()
    for f in fields:
        if getattr(f, "auto_now_add", False) or getattr(f, "auto_now", False):
            columns.append([row.get(f.attname, now) for row in rows])
            continue
        default = f.get_default() if f.attname not in rows[0] else None
        json = isinstance(f, JSONField)  # a list or dict is bound as jsonb, not as an array or a record
        columns.append([bytes(v) if isinstance(v, memoryview) else f.get_db_prep_value(v, connection)
                        if json and v is not None else v
                        for v in (row.get(f.attname, default) for row in rows)])
    shared = tuple(_one_value(values) for values in columns)
    sql, _ = _insert_statement(model, returning, conflict_nothing, shared)
    params = ([values[0] for values, one in zip(columns, shared) if one]
              + [values for values, one in zip(columns, shared) if not one])
    with _server_binding_cursor(transaction.get_connection()) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _server_binding_cursor(connection):
    """A cursor on the connection's open session and transaction that binds its parameters on the server (psycopg's
    `Cursor`, as Django's `OPTIONS["server_side_binding"]` would give every query; D-261), wrapped by Django as
    any cursor is (statement logging and counting, error translation, execute wrappers). Django's default
    `ClientCursor` quotes every element of the insert's arrays into the SQL text in Python (about half of a
    100-event receipt's materialization CPU); server-side the arrays travel as binary parameters, dumped per
    element by psycopg's C dumpers. Only these set-based statements use it: their SQL casts every parameter to
    its column type, so the parameter types are explicit."""
    from django.db.backends.postgresql.base import ServerBindingCursor

    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = ServerBindingCursor(connection.connection)
    return connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)
