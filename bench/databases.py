"""The throwaway databases every bench creates, migrates and drops on the configured server."""
from __future__ import annotations

import copy
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

Progress = Callable[[str], None]

NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


class ThrowawayDatabases:
    """Create the databases `names` (each migrated for `default`) and `journal` (migrated for `journal`) on the
    server of DATABASES['default']; `wrappers[name]` is a `default` connection to each, installed with
    `connections["default"] = wrapper`. The first is installed on entry. On exit the original connections and
    settings come back and the databases are dropped (unless keep). The secret backend points at a temporary
    directory meanwhile."""

    def __init__(self, names: Sequence[str], journal: str, *, keep: bool, say: Progress) -> None:
        configured = {connections[a].settings_dict["NAME"] for a in ("default", "journal")}
        for name in (*names, journal):
            if not NAME_RE.match(name):
                raise CommandError(f"database name {name!r} must match {NAME_RE.pattern}")
            if name in configured:
                raise CommandError(f"refusing to use the configured database {name!r} as a throwaway")
        self.names, self.journal = list(names), journal
        self.keep, self.say = keep, say
        self.wrappers: dict[str, object] = {}
        self.original = None
        self.saved_journal = ""
        self.saved_connector = None

    def _admin(self):
        import psycopg

        s = connections["default"].settings_dict
        return psycopg.connect(host=s.get("HOST") or None, port=s.get("PORT") or None, user=s.get("USER") or None,
                               password=s.get("PASSWORD") or None, dbname="postgres", autocommit=True)

    def _drop(self, admin) -> None:
        from psycopg import sql

        for name in (*self.names, self.journal):
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def __enter__(self) -> ThrowawayDatabases:
        from psycopg import sql

        connections.close_all()
        with self._admin() as admin:
            self._drop(admin)
            for name in (*self.names, self.journal):
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.saved_connector = settings.CONNECTOR
        settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": tempfile.mkdtemp(prefix="bench-secrets-")}
        journal = connections["journal"]
        self.saved_journal = journal.settings_dict["NAME"]
        journal.settings_dict["NAME"] = self.journal
        began = time.monotonic()
        self.say(f"database {self.journal}: migrating (the journal's few tables) ...")
        call_command("migrate", database="journal", interactive=False, verbosity=0)
        self.say(f"database {self.journal}: migrated in {time.monotonic() - began:.0f} s")
        self.original = connections["default"]
        for name in self.names:
            settings_dict = copy.deepcopy(self.original.settings_dict)
            settings_dict["NAME"] = name
            wrapper = self.original.__class__(settings_dict, alias="default")
            self.wrappers[name] = wrapper
            connections["default"] = wrapper
            began = time.monotonic()
            self.say(f"database {name}: migrating (every app, about a minute) ...")
            call_command("migrate", database="default", interactive=False, verbosity=0)
            self.say(f"database {name}: migrated in {time.monotonic() - began:.0f} s")
        connections["default"] = self.wrappers[self.names[0]]
        return self

    def __exit__(self, *exc) -> None:
        for wrapper in self.wrappers.values():
            wrapper.close()
        if self.original is not None:
            connections["default"] = self.original
        connections.close_all()
        if self.saved_journal:
            connections["journal"].settings_dict["NAME"] = self.saved_journal
        if self.saved_connector is not None:
            shutil.rmtree(settings.CONNECTOR["SECRET_BACKEND_DIR"], ignore_errors=True)
            settings.CONNECTOR = self.saved_connector
        if self.keep:
            self.say(f"kept databases {', '.join((*self.names, self.journal))}")
            return
        with self._admin() as admin:
            self._drop(admin)
