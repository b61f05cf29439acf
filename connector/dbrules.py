"""State and immutability rules enforced by PostgreSQL itself (procrastinate style), so that no path around the
service layer (raw SQL, a shell, a future bug) can break them. The current functions and triggers are the files of
`<app>/sql/` (connector/sqlfiles.py); the helpers here build the triggers earlier migrations created.

Every rule raises SQLSTATE 23xxx with a named CONSTRAINT, so Django surfaces it as IntegrityError and services
translate it by constraint name (STYLE R10).
"""
from __future__ import annotations

from collections.abc import Iterable

from connector import sqlfiles

# The generic rule functions, each the current text of its file in connector/sql/functions/ (D-510). Earlier
# migrations install them with `RunSQL(FUNCTIONS_SQL)`; the trigger helpers below are what those migrations
# created, and connector/sql/triggers/ holds each table's current triggers.
GENERIC_FUNCTIONS = ("connector_forbid_update", "connector_forbid_update_delete", "connector_forbid_truncate",
                     "connector_only_columns_change", "connector_enforce_transition", "connector_fenced_row",
                     "connector_never_decreases", "connector_settled_once")
FUNCTIONS_SQL = "\n".join(sqlfiles.function_text("connector", name) for name in GENERIC_FUNCTIONS)

DROP_FUNCTIONS_SQL = """
DROP FUNCTION IF EXISTS connector_forbid_update() CASCADE;
DROP FUNCTION IF EXISTS connector_forbid_update_delete() CASCADE;
DROP FUNCTION IF EXISTS connector_forbid_truncate() CASCADE;
DROP FUNCTION IF EXISTS connector_only_columns_change() CASCADE;
DROP FUNCTION IF EXISTS connector_enforce_transition() CASCADE;
DROP FUNCTION IF EXISTS connector_fenced_row() CASCADE;
DROP FUNCTION IF EXISTS connector_never_decreases() CASCADE;
DROP FUNCTION IF EXISTS connector_settled_once() CASCADE;
"""


def _quote_args(args: Iterable[str]) -> str:
    return ", ".join("'" + a.replace("'", "''") + "'" for a in args)


def no_truncate(table: str) -> tuple[str, str]:
    """The second line beside the row triggers (and beside the application role's missing TRUNCATE privilege,
    docs/security.md): a TRUNCATE of the table is refused. CREATE OR REPLACE, so re-installing is a no-op."""
    name = f"{table}_no_truncate"
    return (f"CREATE OR REPLACE TRIGGER {name} BEFORE TRUNCATE ON {table} FOR EACH STATEMENT "
            f"EXECUTE FUNCTION connector_forbid_truncate();",
            f"DROP TRIGGER IF EXISTS {name} ON {table};")


def immutable(table: str) -> tuple[str, str]:
    name = f"{table}_immutable"
    guard = no_truncate(table)
    return (f"CREATE TRIGGER {name} BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION connector_forbid_update(); "
            + guard[0], f"DROP TRIGGER IF EXISTS {name} ON {table}; " + guard[1])


def append_only(table: str) -> tuple[str, str]:
    name = f"{table}_append_only"
    guard = no_truncate(table)
    return (f"CREATE TRIGGER {name} BEFORE UPDATE OR DELETE ON {table} FOR EACH ROW "
            f"EXECUTE FUNCTION connector_forbid_update_delete(); " + guard[0],
            f"DROP TRIGGER IF EXISTS {name} ON {table}; " + guard[1])


# Every append-only or immutable table in the current schema (found by its row trigger's name) gets its TRUNCATE
# guard: the migration that adds the guard to tables created before `no_truncate` existed.
GUARD_EXISTING_SQL = r"""
DO $$
DECLARE t record;
BEGIN
  FOR t IN SELECT DISTINCT c.relname FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = current_schema() AND NOT g.tgisinternal
             AND g.tgname IN (c.relname || '_append_only', c.relname || '_immutable')
  LOOP
    EXECUTE format('CREATE OR REPLACE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT '
                   'EXECUTE FUNCTION connector_forbid_truncate()', t.relname || '_no_truncate', t.relname);
  END LOOP;
END $$;
"""


def only_columns_change(table: str, columns: Iterable[str]) -> tuple[str, str]:
    name = f"{table}_immutable_columns"
    return (f"CREATE TRIGGER {name} BEFORE UPDATE ON {table} FOR EACH ROW "
            f"EXECUTE FUNCTION connector_only_columns_change({_quote_args(columns)});",
            f"DROP TRIGGER IF EXISTS {name} ON {table};")


def transitions(table: str, column: str, edges: Iterable[tuple[str, str]]) -> tuple[str, str]:
    name = f"{table}_transition"
    args = [column, *(f"{a}>{b}" for a, b in edges)]
    return (f"CREATE TRIGGER {name} BEFORE UPDATE ON {table} FOR EACH ROW "
            f"EXECUTE FUNCTION connector_enforce_transition({_quote_args(args)});",
            f"DROP TRIGGER IF EXISTS {name} ON {table};")


def fenced(table: str, state_column: str, timestamp_column: str) -> tuple[str, str]:
    name = f"{table}_fence_advance"
    return (f"CREATE TRIGGER {name} BEFORE UPDATE ON {table} FOR EACH ROW "
            f"EXECUTE FUNCTION connector_fenced_row({_quote_args([state_column, timestamp_column])});",
            f"DROP TRIGGER IF EXISTS {name} ON {table};")


def never_decreases(table: str, column: str) -> tuple[str, str]:
    name = f"{table}_monotonic"
    return (f"CREATE TRIGGER {name} BEFORE UPDATE ON {table} FOR EACH ROW "
            f"EXECUTE FUNCTION connector_never_decreases({_quote_args([column])});",
            f"DROP TRIGGER IF EXISTS {name} ON {table};")


def settled_once(table: str, column: str) -> tuple[str, str]:
    name = f"{table}_settled_once"
    return (f"CREATE TRIGGER {name} BEFORE UPDATE ON {table} FOR EACH ROW "
            f"EXECUTE FUNCTION connector_settled_once({_quote_args([column])});",
            f"DROP TRIGGER IF EXISTS {name} ON {table};")
