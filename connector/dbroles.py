"""Least privilege in PostgreSQL (issue 17, docs/security.md "Database roles").

Two roles, created by `scripts/services.py ensure` (and by the test harness) with an administrator's connection:

- OWNER (`connector_owner`): owns both databases, their `public` schema objects, every table, sequence and
  function. Migrations run as it (`make migrate`), and so do the coordinator's restore (`pg_restore --clean`
  recreates tables, into a scratch database it creates for the rehearsal: CREATEDB). It is no superuser: it
  cannot set `session_replication_role`; only a person holding its credentials could `ALTER TABLE`.
- APP (`connector_app`): what the web, worker and beat processes connect as. It owns nothing, so it cannot
  ALTER, DROP, DISABLE TRIGGER or TRUNCATE; it is no superuser and holds no SET privilege on
  `session_replication_role`; per table it holds exactly `required_grants()`, derived from the installed models
  (issue 36): a library app's tables (django.contrib, django-axes, ...) get SELECT, INSERT, UPDATE and DELETE,
  since the library's own code decides what it does with them and an upgrade may add a table; the product's own
  tables get SELECT and INSERT everywhere, UPDATE where rows change, DELETE only where the product deletes rows
  (`DELETES`) and on every table Django's cascade deletes from with them; append-only and immutable tables no
  UPDATE or DELETE at all (their row triggers and TRUNCATE guard stay as the second line).

`apply_grants` runs after every `migrate` (post_migrate, as the migrating owner) and converges the APP role's
table privileges to `required_grants()` in one round trip when nothing changed.

Importable without Django (scripts/services.py uses the role SQL).
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

OWNER = os.environ.get("CONNECTOR_DB_OWNER_ROLE", "connector_owner")
APP = os.environ.get("CONNECTOR_DB_APP_ROLE", "connector_app")

# The owner inherits the implicit pg_database_owner membership (which owns the public schema since PostgreSQL 15);
# the application role is a member of nothing and inherits nothing.
ROLE_ATTRIBUTES = {
    "owner": "LOGIN NOSUPERUSER CREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT",
    "app": "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT",
}

# The product's own tables whose rows its code deletes (each names the code path). Library tables need no entry
# (they get DELETE as a rule), nor do tables a cascade from one of these reaches (derived from the models).
DELETES = {
    "connector_materializationdue": "materialize: a due marker is removed once its receipt is materialized",
    "effects_deliverywatermark": "delivery finalization: watermarks folded into a wider one",
    "observability_stagesample": "stage samples older than a day are dropped (observability.services)",
}
# Tables the application only reads.
READ_ONLY = {"django_migrations"}
# Row triggers naming a table append-only or immutable: the application may read and insert, nothing else.
GUARD_SUFFIXES = ("_append_only", "_immutable")
# Append-only or immutable tables whose rows the product locks `SELECT ... FOR UPDATE` as a serialization point
# (PostgreSQL 15 asks for UPDATE on at least one column to lock a row): a column-level UPDATE on the primary key
# only (D-182). The row trigger still refuses every update; no other column is updatable, nothing deletable.
LOCKED_GUARDED = {
    "connector_receipt": "id",  # receipt_materialize: concurrent materializers of one receipt serialize
    "rest_delivery_effect_domain_lock": "id",  # delivery planning: the conflict-domain lock rows
    "effects_receiverbinding": "id",  # certification requests of one binding serialize
    "cutover_cutoverreadinesscertificate": "id",  # certifying a readiness certificate serializes with its readers
}

_TABLES_SQL = """
SELECT c.relname,
       EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = c.oid AND NOT g.tgisinternal
               AND g.tgname IN (c.relname || '_append_only', c.relname || '_immutable')) AS guarded,
       COALESCE((SELECT array_agg(a.privilege_type ORDER BY a.privilege_type) FROM aclexplode(c.relacl) a
                 WHERE a.grantee = (SELECT oid FROM pg_roles WHERE rolname = %(app)s)), '{}') AS granted,
       COALESCE((SELECT array_agg(DISTINCT att.attname ORDER BY att.attname) FROM pg_attribute att,
                        aclexplode(att.attacl) x
                 WHERE att.attrelid = c.oid AND att.attacl IS NOT NULL
                   AND x.grantee = (SELECT oid FROM pg_roles WHERE rolname = %(app)s)), '{}') AS column_grants
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
ORDER BY c.relname
"""


DML = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})


def grants(table: str, *, guarded: bool, deletes: frozenset[str] | set[str] = frozenset(),
           library: bool = False) -> tuple[set[str], dict[str, str]]:
    """The APP role's (table privileges, column privileges) on one table. `deletes`: the tables the application
    deletes rows from (`required_deletes()`); `library`: the table belongs to a library app."""
    if table in READ_ONLY:
        return {"SELECT"}, {}
    if guarded:
        column = LOCKED_GUARDED.get(table)
        return {"SELECT", "INSERT"}, ({column: "UPDATE"} if column else {})
    if library:
        return set(DML), {}
    privileges = {"SELECT", "INSERT", "UPDATE"}
    if table in DELETES or table in deletes:
        privileges.add("DELETE")
    return privileges, {}


# Role and database setup runs from several places at once on a shared server (two `make test` runs, the two
# shards of one, a `make run` beside them), and PostgreSQL refuses two concurrent ALTERs of one catalog row
# ("tuple concurrently updated"): every setup takes this advisory lock first, in the database it connects to
# (D-452). Session-level for the statement lists below (released at the end, or when the connection closes after
# an error); transaction-level inside the adoption's DO block.
SETUP_LOCK_KEY = 0x636F6E6E  # "conn"
_LOCK = f"SELECT pg_advisory_lock({SETUP_LOCK_KEY})"
_UNLOCK = f"SELECT pg_advisory_unlock({SETUP_LOCK_KEY})"


def installed_tables(alias: str) -> dict[str, bool]:
    """{table: belongs to a library app} for every model (auto-created many-to-many tables included) that
    migrates on database `alias`. A project app is a top-level package of this repository; every other installed
    app is a library. Needs Django."""
    from pathlib import Path

    from django.apps import apps
    from django.db import router

    root = Path(__file__).resolve().parent.parent
    return {model._meta.db_table: Path(model._meta.app_config.path).resolve().parent != root
            for model in apps.get_models(include_auto_created=True)
            if not model._meta.proxy and model._meta.managed and router.allow_migrate_model(alias, model)}


def required_deletes() -> frozenset[str]:
    """The tables the application deletes rows from: `DELETES`, every library table, and (to a fixed point) every
    table whose rows Django's deletion collector removes with them: a CASCADE relation (many-to-many tables
    included) to a table already in the set. Needs Django."""
    from django.apps import apps
    from django.db.models import CASCADE

    library = {table for alias in ("default", "journal") for table, lib in installed_tables(alias).items() if lib}
    deletes = set(DELETES) | library
    models = [m for m in apps.get_models(include_auto_created=True) if not m._meta.proxy]
    while True:
        added = {m._meta.db_table for m in models if m._meta.db_table not in deletes
                 and any(f.is_relation and f.concrete and f.remote_field.on_delete is CASCADE
                         and f.related_model._meta.db_table in deletes for f in m._meta.fields)}
        if not added:
            return frozenset(deletes)
        deletes |= added


def roles_sql(*, owner_password: str | None = None, app_password: str | None = None) -> list[str]:
    """Create both roles if missing (tolerating a concurrent creator) and pin their attributes. Run as an
    administrator (CREATEROLE or superuser), in order, on one autocommit connection (the first statement takes
    the setup lock, the last releases it)."""
    statements = [_LOCK]
    for kind, role, password in (("owner", OWNER, owner_password), ("app", APP, app_password)):
        statements.append(f"""
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {_literal(role)}) THEN
    BEGIN
      CREATE ROLE {_ident(role)} {ROLE_ATTRIBUTES[kind]};
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
  END IF;
END $$""")
        statements.append(f"ALTER ROLE {_ident(role)} {ROLE_ATTRIBUTES[kind]}")
        if password:
            statements.append(f"ALTER ROLE {_ident(role)} PASSWORD {_literal(password)}")
    return [*statements, _UNLOCK]


def database_sql(database: str) -> list[str]:
    """Run as an administrator, connected anywhere, in order on one autocommit connection (under the setup lock):
    the owner owns the database; only the two roles connect."""
    return [_LOCK, f"ALTER DATABASE {_ident(database)} OWNER TO {_ident(OWNER)}",
            f"REVOKE ALL ON DATABASE {_ident(database)} FROM PUBLIC",
            f"GRANT CONNECT, TEMPORARY ON DATABASE {_ident(database)} TO {_ident(APP)}", _UNLOCK]


# Run as an administrator connected to the database: hand every object of the public schema to the owner (tables
# created before the roles existed, e.g. by an earlier `make run` as postgres), lock the schema down.
ADOPT_SQL = """
DO $$
DECLARE r record;
BEGIN
  PERFORM pg_advisory_xact_lock({lock});
  EXECUTE format('ALTER SCHEMA %I OWNER TO %I', current_schema(), {owner});
  FOR r IN SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
             AND pg_get_userbyid(c.relowner) <> {owner}
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype = 'i')
  LOOP
    EXECUTE format('ALTER %s %I OWNER TO %I',
                   CASE r.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                  WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END, r.relname, {owner});
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS signature FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
           WHERE n.nspname = current_schema() AND pg_get_userbyid(p.proowner) <> {owner}
  LOOP
    EXECUTE format('ALTER ROUTINE %s OWNER TO %I', r.signature, {owner});
  END LOOP;
  EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM PUBLIC', current_schema());
  EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), {app});
END $$
"""


def adopt_sql() -> str:
    return (ADOPT_SQL.replace("{owner}", _literal(OWNER)).replace("{app}", _literal(APP))
            .replace("{lock}", str(SETUP_LOCK_KEY)))


def required_grants(table: str, *, guarded: bool, alias: str) -> tuple[set[str], dict[str, str]]:
    """`grants()` for a table of database `alias`, with what the installed models say of it. Needs Django."""
    return grants(table, guarded=guarded, deletes=required_deletes(),
                  library=installed_tables(alias).get(table, False))


def apply_grants(cursor, alias: str = "default") -> list[str]:
    """Converge the APP role's privileges on every table of the current schema (database `alias`) to
    `required_grants()`; return the tables changed. Needs the table owner (or a superuser). A server without the
    APP role is left alone. A table no installed model declares (other than `READ_ONLY`) is logged."""
    cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [APP])
    if cursor.fetchone() is None:
        log.warning("database role %s does not exist: no application grants applied (scripts/services.py "
                    "ensure creates it)", APP)
        return []
    cursor.execute(_TABLES_SQL, {"app": APP})
    installed, deletes = installed_tables(alias), required_deletes()
    changed = []
    for table, guarded, granted, column_grants in cursor.fetchall():
        if table not in installed and table not in READ_ONLY:
            log.warning("table %s of %s belongs to no installed model: the application role gets the default "
                        "grants on it", table, alias)
        want, columns = grants(table, guarded=guarded, deletes=deletes, library=installed.get(table, False))
        if set(granted) == want and set(column_grants) == set(columns):
            continue
        cursor.execute(f"REVOKE ALL ON TABLE {_ident(table)} FROM {_ident(APP)}")
        for column in column_grants:
            cursor.execute(f"REVOKE ALL ({_ident(column)}) ON TABLE {_ident(table)} FROM {_ident(APP)}")
        cursor.execute(f"GRANT {', '.join(sorted(want))} ON TABLE {_ident(table)} TO {_ident(APP)}")
        for column, privilege in columns.items():
            cursor.execute(f"GRANT {privilege} ({_ident(column)}) ON TABLE {_ident(table)} TO {_ident(APP)}")
        changed.append(table)
    cursor.execute("""SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                      WHERE n.nspname = current_schema()
                        AND CASE WHEN c.relkind = 'S' THEN NOT has_sequence_privilege(%s, c.oid, 'USAGE')
                                 ELSE false END""", [APP])
    if cursor.fetchone()[0]:
        cursor.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {_ident('public')} TO {_ident(APP)}")
    return changed


def grant_after_migrate(sender, using="default", **kwargs) -> None:
    """post_migrate receiver (connected once, for the connector app, which migrates last of the apps that own
    tables here): converge the grants on the database just migrated."""
    from django.db import connections

    with connections[using].cursor() as cursor:
        changed = apply_grants(cursor, using)
    if changed and kwargs.get("verbosity", 1) >= 2:
        log.info("application grants converged on %d table(s) of %s", len(changed), using)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
