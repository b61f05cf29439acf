"""`manage.py v1_tables check|remove`: remove the retired V1 tables once nothing depends on them (CV2-12-078).

  check             list every dependency still holding the V1 tables (stable codes; exit 1 while any holds)
  remove --reason   drop every V1 table in one audited transaction (refused, nothing changed, while any holds)

Run it with the database owner's credentials (as migrations run): the application role owns no table and is
refused with `not_table_owner`. docs/cutover.md "Removing the V1 tables".
"""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from connector.actors import Actor
from connector.errors import ConnectorError
from cutover.services import v1_removal


class Command(BaseCommand):
    help = "Check or remove the retired V1 tables: check | remove --reason TEXT."

    def add_arguments(self, parser):
        parser.add_argument("step", choices=("check", "remove"))
        parser.add_argument("--reason", default="", help="why now (recorded; required to remove)")
        parser.add_argument("--operator", default="cutover-coordinator", help="who acts (recorded)")

    def handle(self, *args, step: str, reason: str, operator: str, **options):
        actor = Actor.system(f"cutover:{operator}")
        try:
            if step == "check":
                found = v1_removal.v1_removal_dependencies()
                for code, rows in found:
                    self.stdout.write(f"{code}: {', '.join(rows)}")
                if found:
                    raise CommandError("V1_REMOVAL_REFUSED: " + ", ".join(code for code, _ in found))
                self.stdout.write("no dependency holds the V1 tables")
                return
            removal = v1_removal.v1_tables_remove(reason=reason, actor=actor)
            self.stdout.write(f"removed {len(removal.tables)} V1 tables ({bytes(removal.digest).hex()}): "
                              + ", ".join(f"{t} ({rows} rows)" for t, rows, _ in removal.tables))
        except ConnectorError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
