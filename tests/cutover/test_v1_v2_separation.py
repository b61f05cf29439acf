"""V1 and V2 share no executable path: V2 never reads, migrates or adapts V1 work, and V1 never reads the V2
serving gates. Static checks of the source tree (imports, model relations, SQL table names), so they need no
database; the V1 owner is reached only through `cutover.ports`, resolved by settings at run time."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import django.apps

ROOT = Path(__file__).resolve().parents[2]
V2_APPS = ("connector", "effects", "cutover", "governance", "observability")
# A table named in SQL (a table name in displayed data, e.g. an inventory row's table, is not a read of it).
SQL_TABLE = r'(FROM|JOIN|UPDATE|INTO|TABLE)\s+"?{table}\b'



def _imports(package: str) -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(str(path.relative_to(ROOT)), a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found += [(str(path.relative_to(ROOT)), node.module)]
    return found


def _source(package: str) -> list[tuple[str, str]]:
    return [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / package).rglob("*.py"))
            if "migrations" not in p.parts]


def test_v2_has_no_v1_reader_adapter_or_migration_path():
    """No V2 module imports the V1 implementation (the cutover port names it only in settings); no V2 model
    relates to a V1 model; no V2 code names a V1 table in SQL; so there is no V1 gate reader, V1 permit,
    dual write, schema fallback or compatibility adapter, and V1 work is never copied into V2 rows (the V2 rows
    that mention V1 are the imported acceptance tombstones, evidence with no execution state).
    Proves: CV2-12-006"""
    offenders = [f"{path}: {module}" for app in V2_APPS for path, module in _imports(app)
                 if module == "v1" or module.startswith("v1.")]
    assert offenders == []
    v1_models = set(django.apps.apps.get_app_config("v1").get_models())
    v2_models = [m for app in V2_APPS for m in django.apps.apps.get_app_config(app).get_models()]
    relations = [f"{m._meta.label}.{f.name}" for m in v2_models for f in m._meta.get_fields()
                 if f.is_relation and f.related_model in v1_models]
    assert relations == []
    v1_tables = {m._meta.db_table for m in v1_models}
    named = [f"{path}: {t}" for app in V2_APPS for path, text in _source(app) for t in v1_tables
             if re.search(SQL_TABLE.format(table=t), text, re.I)]
    assert named == []


def test_v1_never_reads_the_v2_serving_gates():
    """The V1 implementation imports no V2 model, service or selector and never uses AccountServingGate or names
    its table in SQL: V1 decides by its own barriers and process generation, and in V1 modes the gates only record the
    cutover's coordination. Proves: CV2-12-027"""
    forbidden = ("connector.models", "connector.services", "connector.selectors", "connector.locks", "effects",
                 "cutover.models", "cutover.services")
    offenders = [f"{path}: {module}" for path, module in _imports("v1")
                 if any(module == f or module.startswith(f + ".") for f in forbidden)]
    assert offenders == []
    gate_table = django.apps.apps.get_model("connector", "AccountServingGate")._meta.db_table
    named = [path for path, text in _source("v1") if re.search(SQL_TABLE.format(table=gate_table), text, re.I)
             or any(isinstance(n, ast.Name) and n.id == "AccountServingGate"
                    or isinstance(n, ast.Attribute) and n.attr == "AccountServingGate"
                    for n in ast.walk(ast.parse(text)))]
    assert named == []
