"""State and immutability rules enforced by PostgreSQL itself (procrastinate style), so that no path around the
service layer (raw SQL, a shell, a future bug) can break them. Migrations install them with `RunSQL`.

Every rule raises SQLSTATE 23xxx with a named CONSTRAINT, so Django surfaces it as IntegrityError and services
translate it by constraint name (STYLE R10).
"""
from __future__ import annotations

from collections.abc import Iterable

FUNCTIONS_SQL = r"""
CREATE OR REPLACE FUNCTION connector_forbid_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'immutable fact: % rows are never updated', TG_TABLE_NAME
    USING ERRCODE = '23000', CONSTRAINT = TG_TABLE_NAME || '_immutable';
END $$;

CREATE OR REPLACE FUNCTION connector_forbid_update_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'append-only: % rows are never % d', TG_TABLE_NAME, lower(TG_OP)
    USING ERRCODE = '23000', CONSTRAINT = TG_TABLE_NAME || '_append_only';
END $$;

-- A statement-level guard: TRUNCATE bypasses row triggers, so append-only and immutable tables refuse it too.
CREATE OR REPLACE FUNCTION connector_forbid_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'append-only: % is never truncated', TG_TABLE_NAME
    USING ERRCODE = '23000', CONSTRAINT = TG_TABLE_NAME || '_no_truncate';
END $$;

-- Only the columns named in TG_ARGV may change.
CREATE OR REPLACE FUNCTION connector_only_columns_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (to_jsonb(NEW) - TG_ARGV) IS DISTINCT FROM (to_jsonb(OLD) - TG_ARGV) THEN
    RAISE EXCEPTION 'immutable columns of % changed (only % may change)', TG_TABLE_NAME, TG_ARGV
      USING ERRCODE = '23000', CONSTRAINT = TG_TABLE_NAME || '_immutable_columns';
  END IF;
  RETURN NEW;
END $$;

-- TG_ARGV[0] is the state column; the rest are the allowed 'from>to' edges.
CREATE OR REPLACE FUNCTION connector_enforce_transition() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  old_s text := to_jsonb(OLD) ->> TG_ARGV[0];
  new_s text := to_jsonb(NEW) ->> TG_ARGV[0];
BEGIN
  IF old_s IS NOT DISTINCT FROM new_s THEN
    RETURN NEW;
  END IF;
  FOR i IN 1 .. array_length(TG_ARGV, 1) - 1 LOOP
    IF TG_ARGV[i] = old_s || '>' || new_s THEN
      RETURN NEW;
    END IF;
  END LOOP;
  RAISE EXCEPTION 'transition % -> % is not allowed on %', old_s, new_s, TG_TABLE_NAME
    USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_transition';
END $$;

-- A fenced row changes only by a transition, and every transition advances `fence` by exactly one.
-- TG_ARGV[0] is the state column, TG_ARGV[1] the auto-updated timestamp column.
CREATE OR REPLACE FUNCTION connector_fenced_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (to_jsonb(NEW) ->> TG_ARGV[0]) IS DISTINCT FROM (to_jsonb(OLD) ->> TG_ARGV[0]) THEN
    IF NEW.fence <> OLD.fence + 1 THEN
      RAISE EXCEPTION 'fence of % must advance by exactly one on a transition (% -> %)',
        TG_TABLE_NAME, OLD.fence, NEW.fence
        USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_fence_advance';
    END IF;
  ELSIF (to_jsonb(NEW) - TG_ARGV[1]) IS DISTINCT FROM (to_jsonb(OLD) - TG_ARGV[1]) THEN
    RAISE EXCEPTION '% changes only through a fenced transition', TG_TABLE_NAME
      USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_fence_advance';
  END IF;
  RETURN NEW;
END $$;

-- TG_ARGV[0] names a numeric column that may only grow (a lane high-water never moves back).
CREATE OR REPLACE FUNCTION connector_never_decreases() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (to_jsonb(OLD) ->> TG_ARGV[0]) IS NOT NULL AND ((to_jsonb(NEW) ->> TG_ARGV[0]) IS NULL
      OR (to_jsonb(NEW) ->> TG_ARGV[0])::numeric < (to_jsonb(OLD) ->> TG_ARGV[0])::numeric) THEN
    RAISE EXCEPTION '%.% never decreases', TG_TABLE_NAME, TG_ARGV[0]
      USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_monotonic';
  END IF;
  RETURN NEW;
END $$;

-- Once TG_ARGV[0] holds a non-empty value the row is settled evidence: nothing of it changes any more.
CREATE OR REPLACE FUNCTION connector_settled_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF coalesce(to_jsonb(OLD) ->> TG_ARGV[0], '') <> '' AND to_jsonb(NEW) IS DISTINCT FROM to_jsonb(OLD) THEN
    RAISE EXCEPTION '% is settled evidence (% = %): it is never rewritten', TG_TABLE_NAME, TG_ARGV[0],
      to_jsonb(OLD) ->> TG_ARGV[0] USING ERRCODE = '23000', CONSTRAINT = TG_TABLE_NAME || '_settled_once';
  END IF;
  RETURN NEW;
END $$;
"""

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
