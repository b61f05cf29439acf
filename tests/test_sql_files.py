"""SQL in one place (issue 39 item 2, D-510): every PL/pgSQL function and trigger the migrated databases hold is
the text of its file under `<app>/sql/`, and every function and trigger there has a file. The transition edges a
trigger enforces are the model's transition table, and no migration after the SQL files edits another
migration's text."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connections

from connector import sqlfiles
from connector.choices import (CREDENTIAL_GATE_TRANSITIONS, DEPENDENCY_TRANSITIONS, EPOCH_TRANSITIONS,
                               EXECUTION_TRANSITIONS, GATE_TRANSITIONS, WINDOW_TRANSITIONS)
from cutover.choices import (BARRIER_SET_TRANSITIONS, DECISION_TRANSITIONS, RESTORE_ATTEMPT_TRANSITIONS,
                             SUCCESSION_DRAIN_TRANSITIONS)
from effects.choices import EFFECT_TRANSITIONS, HOLDER_TRANSITIONS, LINK_TRANSITIONS, PERMIT_TRANSITIONS
from effects.delivery.contract import contract
from v1.models import EFFECT_TRANSITIONS as V1_EFFECT_TRANSITIONS
from v1.models import GENERATION_TRANSITIONS, WORK_TRANSITIONS

ROOT = Path(__file__).resolve().parent.parent
DATABASES = ("default", "journal")

FUNCTIONS_SQL = """
SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = current_schema() AND p.prokind = 'f'
   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                   AND d.deptype = 'e')
"""
TRIGGERS_SQL = """
SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = current_schema() AND NOT t.tgisinternal
"""

# Each `connector_enforce_transition` trigger and the transition table its edges must equal (the table stays the
# one declaration of the edges, STYLE R31). Triggers not named here list edges no Python table declares.
TRANSITION_TABLES = {
    ("connector_accountservinggate", "connector_accountservinggate_transition"): GATE_TRANSITIONS,
    ("connector_credentialgenerationdispatchgate", "connector_credentialgenerationdispatchgate_transition"):
        CREDENTIAL_GATE_TRANSITIONS,
    ("connector_execution", "connector_execution_transition"): EXECUTION_TRANSITIONS,
    ("connector_projectionwindow", "connector_projectionwindow_transition"): WINDOW_TRANSITIONS,
    ("connector_executiondependency", "connector_executiondependency_transition"): DEPENDENCY_TRANSITIONS,
    ("effects_remoteeffect", "effects_remoteeffect_transition"): EFFECT_TRANSITIONS,
    ("effects_dispatchpermit", "effects_dispatchpermit_transition"): PERMIT_TRANSITIONS,
    ("effects_remotelink", "effects_remotelink_transition"): LINK_TRANSITIONS,
    ("effects_processgeneration", "effects_processgeneration_transition"): HOLDER_TRANSITIONS,
    ("effects_deliveryoperation", "effects_deliveryoperation_transition"): tuple(sorted(contract().edges())),
    ("cutover_cutoverdecision", "cutover_cutoverdecision_transition"): DECISION_TRANSITIONS,
    ("cutover_servingpublicationbarrierset", "cutover_servingpublicationbarrierset_transition"):
        BARRIER_SET_TRANSITIONS,
    ("cutover_restoreattempt", "cutover_restoreattempt_transition"): RESTORE_ATTEMPT_TRANSITIONS,
    ("cutover_successiondrain", "cutover_successiondrain_transition"): SUCCESSION_DRAIN_TRANSITIONS,
    ("v1_v1processgeneration", "v1_v1processgeneration_transition"): GENERATION_TRANSITIONS,
    ("v1_v1workitem", "v1_v1workitem_transition"): WORK_TRANSITIONS,
    ("v1_v1outboundeffect", "v1_v1outboundeffect_transition"): V1_EFFECT_TRANSITIONS,
}

# The migrations written before the SQL files that build their text from another migration's (history, D-510).
MIGRATIONS_EDITING_OTHERS = {"connector/migrations/0018_adm_receipt_admit_traced.py",
                             "connector/migrations/0023_epoch_provider_io_held.py"}


def normalise(sql: str) -> str:
    """One spelling of a definition: whitespace runs collapsed, the dollar quote `$$`, no closing semicolon, and the
    object named without its schema (pg_get_*def qualify it with `public.`)."""
    sql = sql.replace("$function$", "$$").strip().removesuffix(";")
    sql = re.sub(r"^(CREATE OR REPLACE FUNCTION) public\.", r"\1 ", sql)
    sql = re.sub(r" ON public\.(\w+) ", r" ON \1 ", sql)
    return " ".join(sql.split())


def _file_definitions(kind: str, alias: str) -> dict:
    found: dict = {}
    for app in sqlfiles.APPS:
        for sql_file in sqlfiles.files(app):
            if sql_file.kind != kind or alias not in sql_file.databases:
                continue
            for name, definition in sql_file.definitions().items():
                key = name if kind == "function" else (sql_file.name, name)
                assert key not in found, f"{key} is defined by two files (the second: {sql_file.path})"
                found[key] = (sql_file, definition)
    return found


def _rows(alias: str, sql: str) -> list[tuple]:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


@pytest.mark.django_db(databases=list(DATABASES))
@pytest.mark.parametrize("alias", DATABASES)
def test_every_database_function_is_its_file(alias):
    """Each function of the product in the migrated database is, whitespace aside, its file's definition, and the
    database holds exactly the functions the files declare for it: an unlisted function or a missing one fails."""
    database = {name: definition for name, definition in _rows(alias, FUNCTIONS_SQL)}
    files = _file_definitions("function", alias)
    assert sorted(database) == sorted(files), (
        f"functions without a file: {sorted(set(database) - set(files))}; "
        f"files not in the {alias} database: {sorted(set(files) - set(database))}")
    for name, (sql_file, definition) in files.items():
        assert normalise(database[name]) == normalise(definition), f"{name} differs from {sql_file.path}"


@pytest.mark.django_db(databases=list(DATABASES))
@pytest.mark.parametrize("alias", DATABASES)
def test_every_database_trigger_is_its_file(alias):
    """Each trigger in the migrated database is, whitespace aside, a CREATE TRIGGER of its table's file, and every
    trigger of the files is in the database (an optional file's table may be gone, and its triggers with it)."""
    database = {(table, name): definition for table, name, definition in _rows(alias, TRIGGERS_SQL)}
    tables = {table for table, _ in database}
    files = {key: value for key, value in _file_definitions("triggers", alias).items()
             if not (value[0].optional and key[0] not in tables)}
    assert sorted(database) == sorted(files), (
        f"triggers without a file: {sorted(set(database) - set(files))}; "
        f"files not in the {alias} database: {sorted(set(files) - set(database))}")
    for key, (sql_file, definition) in files.items():
        assert normalise(database[key]) == normalise(definition), f"trigger {key} differs from {sql_file.path}"


def test_normalise_tells_a_changed_definition_apart():
    """The comparison above can fail: a changed edge, column or body differs after normalising."""
    sql_file = next(f for f in sqlfiles.files("connector") if f.name == "connector_execution")
    definition = sql_file.definitions()["connector_execution_transition"]
    assert normalise(definition) == normalise(definition.replace(", ", ",\n      ").replace(" ON connector_execution ",
                                                                                           " ON public.connector_execution "))
    assert normalise(definition) != normalise(definition.replace("'ready>", "'readyx>", 1))
    function = sqlfiles.function_text("connector", "connector_lock_serving")
    assert normalise(function) != normalise(function.replace("FOR SHARE", "FOR UPDATE", 1))


def _edges(definition: str) -> tuple[str, list[str]]:
    args = re.search(r"EXECUTE FUNCTION connector_enforce_transition\((.*)\)$", definition, re.S).group(1)
    values = re.findall(r"'((?:[^']|'')*)'", args)
    return values[0], values[1:]


def test_transition_triggers_enforce_the_model_transition_tables():
    """A transition trigger's edges are exactly its model's transition table (STYLE R31: one declaration), and the
    ServingEpoch rules function's edges are EPOCH_TRANSITIONS."""
    triggers = {key: value for alias in DATABASES for key, value in _file_definitions("triggers", alias).items()}
    for key, table in TRANSITION_TABLES.items():
        _, edges = _edges(triggers[key][1])
        assert sorted(edges) == sorted(f"{a}>{b}" for a, b in table), f"{key}: {triggers[key][0].path}"
    rules = sqlfiles.function_text("connector", "connector_servingepoch_rules")
    listed = re.search(r"= ANY \(ARRAY\[(.*?)\]\)", rules, re.S).group(1)
    assert sorted(re.findall(r"'([^']*)'", listed)) == sorted(f"{a}>{b}" for a, b in EPOCH_TRANSITIONS)


def test_no_new_migration_edits_another_migrations_text():
    """Migrations apply the files; none but the two written before them imports another migration's text."""
    pattern = re.compile(r"import_module\(\s*[\"'][\w.]*migrations|from [\w.]*migrations\.\d|import [\w.]*migrations\.\d")
    editing = {str(path.relative_to(ROOT)) for app in ("connector", "effects", "cutover", "governance",
                                                        "observability", "v1")
               for path in (ROOT / app / "migrations").glob("0*.py") if pattern.search(path.read_text())}
    assert editing == MIGRATIONS_EDITING_OTHERS


@pytest.mark.django_db
def test_the_files_apply_again_once_the_v1_tables_are_removed():
    """The V1 table removal drops V1's tables after the cutover; applying every app's files again (a later
    `*_sql_files` migration) still works there: the files of those tables are optional and left out, every other
    trigger is re-created as it was."""
    from django.db import connection, transaction

    from cutover.ports import v1_owner
    from tests import dbroles

    with transaction.atomic(), dbroles.as_admin(), connection.cursor() as cursor:
        before = {(table, name) for table, name, _ in _rows("default", TRIGGERS_SQL)}
        v1_tables = set(v1_owner().tables())
        cursor.execute("DROP TABLE " + ", ".join(sorted(v1_tables)) + " CASCADE")
        for app in sqlfiles.APPS:
            sqlfiles.apply(app, connection)
        after = {(table, name) for table, name, _ in _rows("default", TRIGGERS_SQL)}
        transaction.set_rollback(True)
    assert after == {(table, name) for table, name in before if table not in v1_tables}
    assert len(after) < len(before)
