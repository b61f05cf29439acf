"""The current text of every PL/pgSQL function and trigger of the product, read from `<app>/sql/`.

Each app that owns database code keeps it in two folders (procrastinate's `procrastinate/sql/` is the model):
- `sql/functions/<name>.sql`: one `CREATE OR REPLACE FUNCTION` per file, the function's current definition;
- `sql/triggers/<table>.sql`: the triggers the app keeps on one table, each as `DROP TRIGGER IF EXISTS` then
  `CREATE TRIGGER`, so applying the file again replaces them.

A file's leading `--` lines describe it; two of them are read here:
- `-- databases: default journal`: the database aliases the file is applied to (`default` when absent);
- `-- optional: <why>`: the table may be gone (the V1 table removal drops V1's tables after the cutover), or not
  yet there (a table created after an earlier migration that applies the files); the file is applied only where
  the table exists.

A migration applies an app's files with `operations(app_label)` (functions first, then triggers). A fresh
database and an upgraded one end with the same definitions; `tests/test_sql_files.py` compares the migrated
database's `pg_get_functiondef` and `pg_get_triggerdef` with these files, and finds any function or trigger
without a file. Old migrations keep the text they applied then; a change of a definition is an edit of its
file plus a new migration that applies the app's files again (D-510).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
APPS = ("connector", "effects", "cutover", "v1")  # the apps that keep PostgreSQL code (governance, observability: none)
DEFAULT_DATABASES = ("default",)

_CREATE_TRIGGER = re.compile(r"^CREATE TRIGGER (\w+)\s.*?\sON (\w+)\s", re.S)
_CREATE_FUNCTION = re.compile(r"^CREATE OR REPLACE FUNCTION (\w+)\(")


@dataclass(frozen=True)
class SqlFile:
    """One `.sql` file of an app: a function (`kind="function"`, `name` the function) or the triggers an app keeps
    on one table (`kind="triggers"`, `name` the table)."""

    app: str
    kind: str
    name: str
    path: Path
    text: str
    databases: tuple[str, ...]
    optional: bool

    @property
    def body(self) -> str:
        """The SQL without the file's leading comment lines."""
        lines = self.text.splitlines()
        while lines and (lines[0].startswith("--") or not lines[0].strip()):
            lines.pop(0)
        return "\n".join(lines) + "\n"

    def definitions(self) -> dict[str, str]:
        """What PostgreSQL keeps of each object of the file, by name: the function's `CREATE OR REPLACE FUNCTION`
        statement, or each trigger's `CREATE TRIGGER` statement (without the closing semicolon)."""
        if self.kind == "function":
            statement = self.body.strip().removesuffix(";")
            match = _CREATE_FUNCTION.match(statement)
            if match is None or match.group(1) != self.name:
                raise ValueError(f"{self.path}: must hold CREATE OR REPLACE FUNCTION {self.name}(...)")
            return {self.name: statement}
        found: dict[str, str] = {}
        for statement in (s.strip() for s in self.body.split(";\n")):
            if not statement or statement.startswith("DROP TRIGGER IF EXISTS "):
                continue
            match = _CREATE_TRIGGER.match(statement)
            if match is None or match.group(2) != self.name:
                raise ValueError(f"{self.path}: every statement is DROP TRIGGER IF EXISTS or CREATE TRIGGER ... ON "
                                 f"{self.name}, not {statement[:60]!r}")
            found[match.group(1)] = statement
        return found


def _read(app: str, kind: str, path: Path) -> SqlFile:
    text = path.read_text()
    databases, optional = DEFAULT_DATABASES, False
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        if line.startswith("-- databases:"):
            databases = tuple(line.removeprefix("-- databases:").split())
        elif line.startswith("-- optional:"):
            optional = True
    return SqlFile(app=app, kind=kind, name=path.stem, path=path, text=text, databases=databases, optional=optional)


def files(app: str) -> list[SqlFile]:
    """The app's `.sql` files: its functions (by name), then its trigger files (by table)."""
    root = BASE_DIR / app / "sql"
    return ([_read(app, "function", p) for p in sorted((root / "functions").glob("*.sql"))]
            + [_read(app, "triggers", p) for p in sorted((root / "triggers").glob("*.sql"))])


def function_text(app: str, name: str) -> str:
    """One function's `CREATE OR REPLACE FUNCTION` statement, as its file holds it."""
    return _read(app, "function", BASE_DIR / app / "sql" / "functions" / f"{name}.sql").body


def apply(app: str, connection) -> None:
    """Apply the app's files meant for this connection's database: functions, then triggers. An optional trigger
    file whose table does not exist is left out."""
    with connection.cursor() as cursor:
        for sql_file in files(app):
            if connection.alias not in sql_file.databases:
                continue
            if sql_file.optional:
                cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [sql_file.name])
                if not cursor.fetchone()[0]:
                    continue
            cursor.execute(sql_file.body)


def operations(app: str) -> list:
    """The migration operations that (re)apply the app's current files, one per database they name."""
    from django.db import migrations

    def forward(apps, schema_editor) -> None:
        apply(app, schema_editor.connection)

    aliases = sorted({alias for f in files(app) for alias in f.databases})
    return [migrations.RunPython(forward, migrations.RunPython.noop, hints={"target_db": alias})
            for alias in aliases]
