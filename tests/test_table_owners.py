"""Each app owns its tables (issue 39 item 3, D-550): no product module writes another app's table in SQL.

The scan reads every string literal of the product apps' Python (ast: plain strings and the literal parts of
f-strings, where `{Model._meta.db_table}` resolves to the model's table) for INSERT INTO / UPDATE / DELETE FROM,
maps the table to the app owning its model (Django's registry) and fails listing every write whose table belongs
to another app than the module's. A second scan fails on `Model.objects...create/update/delete(...)` of another
app's model imported by name (connector's selectors re-export row classes for reading). No test here needs the
database."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from django.apps import apps

ROOT = Path(__file__).resolve().parent.parent
APPS = ("connector", "effects", "cutover", "governance", "observability", "v1")

# Writes to another app's table that remain, each with why. The test fails when one of them disappears (delete its
# entry), so the list only gets shorter.
ALLOWED: dict[tuple[str, str], str] = {}

WRITE = re.compile(r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\"?([A-Za-z_][A-Za-z0-9_]*)\"?", re.IGNORECASE)
# `FOR UPDATE [OF t]` locks and `ON CONFLICT ... DO UPDATE SET` write the statement's own table: not a write naming
# a table.
NOT_A_WRITE = re.compile(r"\b(?:FOR\s+(?:NO\s+KEY\s+)?UPDATE|DO\s+UPDATE)\b", re.IGNORECASE)


def _owners() -> dict[str, str]:
    return {model._meta.db_table: model._meta.app_label for model in apps.get_models(include_auto_created=True)}


def _models_by_name() -> dict[str, str]:
    return {model.__name__: model._meta.db_table for model in apps.get_models(include_auto_created=True)}


def _literal(node: ast.AST, tables: dict[str, str]) -> str | None:
    """The text of a string literal; an f-string's `{Model._meta.db_table}` becomes that table, any other
    expression `?`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                expr = value.value
                if (isinstance(expr, ast.Attribute) and expr.attr == "db_table" and isinstance(expr.value, ast.Attribute)
                        and expr.value.attr == "_meta" and isinstance(expr.value.value, ast.Name)):
                    parts.append(tables.get(expr.value.value.id, "?"))
                else:
                    parts.append("?")
        return "".join(parts)
    return None


def foreign_writes() -> set[tuple[str, str]]:
    """{(module path, table)} for every SQL write in a product module to a table another app owns."""
    owners, tables = _owners(), _models_by_name()
    found = set()
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" in relative:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                text = _literal(node, tables)
                if text is None:
                    continue
                for match in WRITE.finditer(NOT_A_WRITE.sub(" ", text)):
                    owner = owners.get(match.group(1).lower())
                    if owner is not None and owner != app:
                        found.add((relative, match.group(1).lower()))
    return found


ORM_WRITES = {"create", "update", "delete", "bulk_create", "bulk_update", "get_or_create", "update_or_create"}


def foreign_orm_writes() -> set[tuple[str, int, str]]:
    """{(module path, line, model)} for every `Model.objects...<write>()` in a product module on a model of another
    product app imported by name (connector's selectors re-export row classes for reading; writing them is the
    owner's). Writes through an instance (`row.save()`) are not seen here."""
    labels: dict[str, set[str]] = {}
    for model in apps.get_models(include_auto_created=True):
        labels.setdefault(model.__name__, set()).add(model._meta.app_label)
    found = set()
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" in relative:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            foreign = {alias.asname or alias.name: alias.name for node in ast.walk(tree)
                       if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] != app
                       for alias in node.names
                       if labels.get(alias.name, set()) & set(APPS) and app not in labels[alias.name]}
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ORM_WRITES):
                    continue
                receiver = node.func.value
                while isinstance(receiver, (ast.Attribute, ast.Call)):
                    receiver = receiver.value if isinstance(receiver, ast.Attribute) else receiver.func
                if isinstance(receiver, ast.Name) and receiver.id in foreign:
                    found.add((relative, node.lineno, foreign[receiver.id]))
    return found


def test_no_app_writes_another_apps_model_through_the_orm():
    found = sorted(foreign_orm_writes())
    assert not found, "ORM writes to another app's model (move them into a service of the owning app):\n" + \
        "\n".join(f"  {module}:{line}: {model}" for module, line, model in found)


def test_no_app_writes_another_apps_table_in_sql():
    found = foreign_writes()
    unexpected = sorted(found - set(ALLOWED))
    assert not unexpected, "SQL writes to another app's table (move them into a service of the owning app):\n" + \
        "\n".join(f"  {module}: {table}" for module, table in unexpected)
    gone = sorted(set(ALLOWED) - found)
    assert not gone, f"allowed writes no longer present (delete their entries): {gone}"


def test_the_scan_sees_a_foreign_write():
    """The scan can fail: a cutover module naming connector_orderinglane in an INSERT is found, a FOR UPDATE is
    not a write."""
    tables = _models_by_name()
    text = _literal(ast.parse('f"INSERT INTO {OrderingLane._meta.db_table} (id) VALUES (1)"', mode="eval").body, tables)
    assert [m.group(1) for m in WRITE.finditer(NOT_A_WRITE.sub(" ", text))] == ["connector_orderinglane"]
    locked = "SELECT id FROM connector_orderinglane FOR UPDATE OF connector_orderinglane"
    assert not list(WRITE.finditer(NOT_A_WRITE.sub(" ", locked)))
