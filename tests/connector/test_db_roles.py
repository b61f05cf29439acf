"""Least privilege in PostgreSQL (issue 17, D-181/D-182, docs/security.md "Database roles"): the application's
role owns nothing and cannot erase or rewrite the audit trail by any of the routes a superuser had (TRUNCATE,
`session_replication_role = replica` + DELETE, `ALTER TABLE ... DISABLE TRIGGER ALL` + UPDATE), holds exactly
the privileges `connector.dbroles.grants()` declares, and the TRUNCATE guard stops even the owner."""
from __future__ import annotations

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.db.utils import IntegrityError, ProgrammingError

from connector import dbroles
from connector.actors import Actor
from connector.services.audit import audit_record
from tests.dbroles import as_admin, current

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "journal"])

ERASURES = [
    ["TRUNCATE connector_auditrecord"],
    ["SET session_replication_role = replica", "DELETE FROM connector_auditrecord"],
    ["ALTER TABLE connector_auditrecord DISABLE TRIGGER ALL", "UPDATE connector_auditrecord SET reason = 'x'"],
    ["UPDATE connector_auditrecord SET reason = 'rewritten'"],
    ["DELETE FROM connector_auditrecord"],
    ["SET ROLE postgres"],
    ["CREATE TABLE connector_shadow (id int)"],
]


@pytest.fixture
def audited(db):
    with transaction.atomic():
        row = audit_record(actor=Actor.system("test"), entity=_Entity(), action="probe")
    return row.pk


class _Entity:
    pk = 1

    class _meta:  # noqa: N801 - mimics a model's _meta for audit_record
        label = "tests.Probe"


def _app_login_params() -> dict:
    s = connections["default"].settings_dict
    return {"host": s.get("HOST") or None, "port": s.get("PORT") or None, "dbname": s["NAME"],
            "user": dbroles.APP}


def test_the_suite_and_its_product_code_run_as_the_application_role():
    """Every test body (and so every service, view and admin action it drives) runs as the application role on
    both databases. Proves: issue 17 item 3 (the suite exercises the role)."""
    assert current("default") == dbroles.APP and current("journal") == dbroles.APP


@pytest.mark.parametrize("statements", ERASURES, ids=lambda s: s[0].split()[0] + " " + s[-1].split()[0])
def test_the_application_role_cannot_erase_or_rewrite_the_audit_trail(audited, statements):
    """Logged in directly as the application role (as web and worker are): each route that erased the audit
    trail as `postgres` is refused, and the row is still there unchanged. Proves: issue 17 item 3."""
    try:
        conn = psycopg.connect(**_app_login_params(), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:  # a server that does not trust loopback logins of the role
        pytest.skip(f"cannot log in as {dbroles.APP} without a password here: {exc}")
    with conn:
        assert conn.execute("SELECT current_user, session_user").fetchone() == (dbroles.APP, dbroles.APP)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            for statement in statements:
                conn.execute(statement)
        assert conn.execute("SELECT reason FROM connector_auditrecord WHERE id = %s", [audited]).fetchone() == ("",)


@pytest.mark.parametrize("statement", ["TRUNCATE connector_auditrecord", "DELETE FROM connector_auditrecord",
                                       "UPDATE connector_auditrecord SET reason = 'x'"])
def test_the_same_refusals_through_the_products_own_connection(audited, statement):
    """Through Django's connection, as the code paths of the product use it."""
    with pytest.raises(ProgrammingError, match="permission denied"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(statement)


def test_the_truncate_guard_stops_even_the_owner(audited):
    """The second line: the owner may TRUNCATE its tables, but every append-only and immutable table has a
    statement trigger refusing it (connector_forbid_truncate), and the owner cannot switch triggers off with
    session_replication_role. Proves: issue 17 item 3."""
    with as_admin():
        with connection.cursor() as cursor:
            cursor.execute(f'SET ROLE "{dbroles.OWNER}"')
            try:
                for table in ("connector_auditrecord", "connector_receipt", "effects_outboundcommand"):
                    with pytest.raises(IntegrityError, match="never truncated"), transaction.atomic():
                        cursor.execute(f"TRUNCATE {table} CASCADE")
                with pytest.raises(ProgrammingError, match="permission denied"), transaction.atomic():
                    cursor.execute("SET session_replication_role = replica")
            finally:
                cursor.execute("SET ROLE NONE")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM connector_auditrecord WHERE id = %s", [audited])
        assert cursor.fetchone() == (1,)


def test_the_application_roles_privileges_are_exactly_the_declared_grants():
    """Per table of both databases: the application role holds exactly `grants()` (no UPDATE/DELETE on an
    append-only table beyond the key column of the two locked ones), owns nothing and is no superuser.
    Proves: issue 17 item 3; D-182."""
    for alias in ("default", "journal"):
        with connections[alias].cursor() as cursor:
            cursor.execute("""
                SELECT c.relname, pg_get_userbyid(c.relowner),
                       EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = c.oid
                               AND g.tgname IN (c.relname || '_append_only', c.relname || '_immutable')),
                       ARRAY(SELECT p FROM unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE',
                                                        'REFERENCES','TRIGGER']) p
                             WHERE has_table_privilege(%s, c.oid, p) ORDER BY p),
                       ARRAY(SELECT a.attname FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0
                             AND NOT a.attisdropped AND has_column_privilege(%s, c.oid, a.attnum, 'UPDATE')
                             ORDER BY a.attname)
                FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')""", [dbroles.APP, dbroles.APP])
            rows = cursor.fetchall()
            cursor.execute("SELECT rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, rolinherit FROM pg_roles "
                           "WHERE rolname = %s", [dbroles.APP])
            assert cursor.fetchone() == (False, False, False, False, False)
        assert rows, alias
        for table, owner, guarded, privileges, updatable in rows:
            assert owner != dbroles.APP, table
            want, columns = dbroles.required_grants(table, guarded=guarded, alias=alias)
            assert set(privileges) == want, (alias, table, privileges)
            if guarded or table in dbroles.READ_ONLY:
                assert set(updatable) == set(columns), (alias, table, updatable)
        if alias == "default":
            audit = next(r for r in rows if r[0] == "connector_auditrecord")
            assert audit[2] and set(audit[3]) == {"SELECT", "INSERT"} and audit[4] == []


def _live_privileges(alias: str) -> dict[str, set[str]]:
    with connections[alias].cursor() as cursor:
        cursor.execute("""
            SELECT c.relname, ARRAY(SELECT p FROM unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE']) p
                                    WHERE has_table_privilege(%s, c.oid, p))
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')""", [dbroles.APP])
        return {table: set(privileges) for table, privileges in cursor.fetchall()}


def test_every_installed_models_table_holds_the_privileges_its_code_uses():
    """Walked from the installed models, not from `dbroles`' lists: every model's table on its database exists and
    the application role can read, insert and update it (a library's table, django-axes' included, may also be
    deleted from, by its own code); every table Django's deletion collector deletes from when a deletable table's
    row goes (a CASCADE relation, many-to-many tables included) can be deleted from; and no table of the schema
    belongs to no model. This fails for django-axes 8's `axes_accessattemptexpiration` without DELETE, the
    privilege whose lack answered every sign-in after a failed one with a 500. Proves: issue 36 (privileges
    derived from the installed models)."""
    from pathlib import Path

    from django.apps import apps
    from django.db import router
    from django.db.models import CASCADE

    root = Path(dbroles.__file__).resolve().parent.parent
    models = [m for m in apps.get_models(include_auto_created=True) if not m._meta.proxy and m._meta.managed]
    for alias in ("default", "journal"):
        live = _live_privileges(alias)
        mine = [m for m in models if router.allow_migrate_model(alias, m)]
        assert set(live) - {m._meta.db_table for m in mine} <= dbroles.READ_ONLY, alias
        for model in mine:
            table = model._meta.db_table
            assert {"SELECT", "INSERT"} <= live[table], (alias, table, live[table])
            if Path(model._meta.app_config.path).resolve().parent != root:  # a library's table
                assert live[table] == {"SELECT", "INSERT", "UPDATE", "DELETE"}, (alias, table, live[table])
        for model in mine:
            if "DELETE" not in live[model._meta.db_table]:
                continue
            for relation in model._meta.related_objects:
                if relation.on_delete is CASCADE and router.allow_migrate_model(alias, relation.related_model):
                    dependent = relation.related_model._meta.db_table
                    assert "DELETE" in live[dependent], (alias, model._meta.db_table, "cascades to", dependent)
            for m2m in model._meta.many_to_many:
                through = m2m.remote_field.through._meta.db_table
                assert "DELETE" in live[through], (alias, model._meta.db_table, "clears", through)
