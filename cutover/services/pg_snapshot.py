"""PostgreSQL snapshot mechanics of a V1 restore point: a REPEATABLE READ snapshot exported to `pg_dump`, schema and
content digests computed inside that same snapshot, scratch databases for rehearsal and the atomic restore of
`default` (`pg_restore --clean --if-exists --single-transaction`: a failed restore leaves the old database, a
successful one commits the whole snapshot at once, so no partial state is ever visible).

Digests: `schema` hashes every table, column, constraint and trigger of the public schema as PostgreSQL describes
them (pg_catalog); `content` hashes every table's rows as text, in table-name then row-text order, under
TimeZone UTC. The connections here are plain psycopg connections, never Django's, so their isolation is exact.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import psycopg
from django.conf import settings
from django.db import connections, transaction

from cutover.errors import RestorePointInvalid, RestorePointRefused

__all__ = ["Digests", "binary", "snapshot_and_dump", "exported_snapshot", "django_in_snapshot", "digests_of", "create_scratch", "drop_database",
           "restore_into", "restore_default", "file_sha256"]

SCHEMA_SQL = [
    ("tables", "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
               "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY 1"),
    ("columns", "SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '') "
                "FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2"),
    ("constraints", "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
                    "JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = 'public' ORDER BY 1, 2"),
    ("triggers", "SELECT t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t "
                 "JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
                 "WHERE n.nspname = 'public' AND NOT t.tgisinternal ORDER BY 1, 2"),
]


@dataclass(frozen=True)
class Digests:
    schema: bytes
    content: bytes
    tables: int
    rows: int


def binary(name: str) -> str:
    """The PostgreSQL client binary `name` (PG_BINDIR first, then PATH)."""
    bindir = os.environ.get("PG_BINDIR") or getattr(settings, "PG_BINDIR", "")
    path = os.path.join(bindir, name) if bindir else shutil.which(name)
    if not path or not os.access(path, os.X_OK):
        raise RestorePointRefused(f"{name} is not installed: install the PostgreSQL {name} client matching the "
                                  "server (Debian: apt-get install postgresql-client) or set PG_BINDIR")
    return path


def connection_params(database: str | None = None) -> dict:
    """The `default` server, as the database owner when DATABASE_OWNER_URL names one (docs/security.md): the
    application role cannot `pg_restore --clean` (it owns no table) nor create a scratch database."""
    s = connections["default"].settings_dict
    owner = urlsplit(getattr(settings, "DATABASE_OWNER_URL", "") or "")
    user = unquote(owner.username) if owner.username else (s.get("USER") or "postgres")
    password = unquote(owner.password or "") if owner.username else (s.get("PASSWORD") or "")
    return {"host": s.get("HOST") or "127.0.0.1", "port": str(s.get("PORT") or 5432),
            "user": user, "password": password, "dbname": database or s["NAME"]}


def snapshot_connect(database: str | None = None, **kwargs) -> psycopg.Connection:
    params = {k: v for k, v in connection_params(database).items() if v}
    return psycopg.connect(**params, **kwargs)


def _env() -> dict:
    env = dict(os.environ)
    params = connection_params()
    if params["password"]:
        env["PGPASSWORD"] = params["password"]
    return env


def _cli_args(database: str) -> list[str]:
    p = connection_params(database)
    return ["-h", p["host"], "-p", p["port"], "-U", p["user"], "-d", database]


_CAST = re.compile(r"::[a-z_ ]+(\[\])?")


def normalized_value(value: object) -> object:
    """A definition as PostgreSQL deparses it, minus casts and parentheses: a restored `CHECK (x = ANY (ARRAY[..]))`
    deparses with different casts than the one created by the migration, with the same meaning."""
    if not isinstance(value, str):
        return value
    return re.sub(r"[()\s]", "", _CAST.sub("", value))


# Operator-governance tables: who signed in, who approved, what was audited. They are in the dump (a restore brings
# them back) but not in the content digest, because the restore point's own dual approval is written after the
# capture and must not read as drift (decision D-156). Every V1 and V2 authority table is digested.
GOVERNANCE_TABLES = frozenset({
    "connector_dualapprovalrequest", "connector_dualapproval", "connector_dualapprovalsetmember",
    "connector_auditrecord", "auth_user",
    "auth_user_groups", "auth_user_user_permissions", "django_session", "django_admin_log",
    "axes_accessattempt", "axes_accesslog", "axes_accessfailurelog"})


def digest_cursor(cursor) -> Digests:
    cursor.execute("SET LOCAL TimeZone = 'UTC'")
    schema = hashlib.sha256(b"schema.v1")
    tables: list[str] = []
    for label, sql in SCHEMA_SQL:
        cursor.execute(sql)
        for row in cursor.fetchall():
            schema.update(repr((label, *map(normalized_value, row))).encode())
            if label == "tables":
                tables.append(row[0])
    content = hashlib.sha256(b"content.v1")
    rows = 0
    for table in tables:
        if table in GOVERNANCE_TABLES:
            continue
        content.update(b"\x00table:" + table.encode())
        cursor.execute(f'SELECT t::text FROM "{table}" t ORDER BY 1')
        for (text,) in cursor:
            content.update(b"\x01" + text.encode())
            rows += 1
    return Digests(schema.digest(), content.digest(), len(tables), rows)


def digests_of(database: str | None = None) -> Digests:
    """Schema and content digests of `database` (default: the `default` database), in one REPEATABLE READ
    snapshot."""
    with snapshot_connect(database) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction(), conn.cursor() as cursor:
            return digest_cursor(cursor)


def file_sha256(path: str) -> tuple[bytes, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return h.digest(), size


@contextmanager
def exported_snapshot() -> Iterator[tuple[str, object]]:
    """A REPEATABLE READ transaction on `default` whose snapshot is exported; yields (snapshot id, cursor)."""
    with snapshot_connect() as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction(), conn.cursor() as cursor:
            cursor.execute("SELECT pg_export_snapshot()")
            yield cursor.fetchone()[0], cursor


@contextmanager
def django_in_snapshot(snapshot_id: str) -> Iterator[None]:
    """A read-only `default` transaction of Django's own connection that imports the exported snapshot, so the V1
    owner port (which reads through Django) sees exactly the rows being dumped and digested."""
    if connections["default"].in_atomic_block:
        raise RestorePointRefused("a restore point is taken outside any transaction")
    with transaction.atomic(), connections["default"].cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cursor.execute("SET TRANSACTION SNAPSHOT %s", [snapshot_id])
        yield


def snapshot_and_dump(path: str, check=None) -> tuple[Digests, object]:
    """Open one exported snapshot of `default`; inside it run `check(cursor, snapshot_id)` (the caller's facts read
    at the very snapshot dumped, returned), compute the digests, and `pg_dump -Fc --snapshot` the same database to
    `path`."""
    pg_dump = binary("pg_dump")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with exported_snapshot() as (snapshot_id, cursor):
        facts = check(cursor, snapshot_id) if check else None
        digests = digest_cursor(cursor)
        database = connection_params()["dbname"]
        proc = subprocess.run([pg_dump, "-Fc", f"--snapshot={snapshot_id}", "-f", path, *_cli_args(database)],
                              env=_env(), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RestorePointRefused(f"pg_dump failed ({proc.returncode}): {proc.stderr.strip()[:500]}")
    return digests, facts


def create_scratch(name: str) -> None:
    with snapshot_connect("postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')


# An autovacuum worker analyzing a freshly restored scratch database is a session no role but a superuser may
# terminate: DROP ... WITH (FORCE) run as the owner then fails ("must be a member of the role whose process is being
# terminated"). The worker leaves within seconds on a scratch database; the drop waits for it this long (D-453).
DROP_WAIT_SECONDS = 60.0


def drop_database(name: str) -> None:
    deadline = time.monotonic() + DROP_WAIT_SECONDS
    while True:
        try:
            with snapshot_connect("postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except psycopg.errors.InsufficientPrivilege:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


# Extensions the product's own migrations create (effects 0005: btree_gist for the delivery exclusion constraints,
# trusted, so the owner role may create it). Any other extension in a dump is the server administrator's.
PRODUCT_EXTENSIONS = frozenset({"btree_gist"})


def _restore_list(path: str) -> str:
    """The dump's table of contents without the EXTENSION entries (and their comments) of extensions the product
    does not create: those are the server administrator's (e.g. pg_walinspect for the activation bench), and the
    owner role that restores may not create them (decision D-185). Nothing the restore point digests lives in an
    extension: the schema digest names tables, columns, constraints and triggers of `public`."""
    pg_restore = binary("pg_restore")
    proc = subprocess.run([pg_restore, "-l", path], env=_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RestorePointInvalid(f"pg_restore -l of {path} failed ({proc.returncode}): {proc.stderr.strip()[:500]}")
    def foreign_extension(line: str) -> bool:
        found = re.search(r"\s(?:EXTENSION -|COMMENT - EXTENSION) (\S+)", line)  # "EXTENSION - x", "COMMENT - EXTENSION x"
        return found is not None and found.group(1) not in PRODUCT_EXTENSIONS

    kept = [line for line in proc.stdout.splitlines() if not foreign_extension(line)]
    listing = tempfile.NamedTemporaryFile("w", suffix=".list", delete=False)
    with listing:
        listing.write("\n".join(kept) + "\n")
    return listing.name


def _pg_restore(path: str, database: str, *extra: str) -> None:
    pg_restore = binary("pg_restore")
    listing = _restore_list(path)
    try:
        proc = subprocess.run([pg_restore, "--exit-on-error", "--no-owner", "-L", listing, *extra,
                               *_cli_args(database), path], env=_env(), capture_output=True, text=True, check=False)
    finally:
        os.unlink(listing)
    if proc.returncode != 0:
        raise RestorePointInvalid(f"pg_restore of {path} into {database} failed ({proc.returncode}): "
                                  f"{proc.stderr.strip()[:500]}")


def restore_into(path: str, database: str) -> None:
    """Restore the dump into an empty scratch database, in one transaction."""
    _pg_restore(path, database, "--single-transaction")


def restore_default(path: str) -> str:
    """Replace the `default` database's contents with the dump, atomically. Django's connections are closed and
    every other session of that database terminated first (V1 and V2 are offline: none may be writing)."""
    database = connection_params()["dbname"]
    connections.close_all()
    with snapshot_connect("postgres", autocommit=True) as conn:
        # A role that is not a superuser may not terminate a superuser's session (an administrator's console,
        # or the test suite's own connections): those are left alone. They hold no lock the restore needs unless
        # they are inside a transaction, and then the single-transaction restore waits for them, never half-runs.
        conn.execute("SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a "
                     "JOIN pg_roles r ON r.oid = a.usesysid "
                     "WHERE a.datname = %s AND a.pid <> pg_backend_pid() "
                     "AND (NOT r.rolsuper OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user))",
                     [database])
    _pg_restore(path, database, "--clean", "--if-exists", "--single-transaction")
    return database
