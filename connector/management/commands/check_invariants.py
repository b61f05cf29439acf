"""Check the system invariants on the live database, read-only.

    python manage.py check_invariants                 # one line per violation, exit 1 if any
    python manage.py check_invariants --json          # a JSON report on stdout, exit 1 if any
    python manage.py check_invariants --limit 20      # at most 20 offending rows per invariant (totals are exact)
    python manage.py check_invariants --only lane_high_water_mismatch

Every check is one set-based query (connector/selectors/invariants.py) and all run in one REPEATABLE READ,
READ ONLY transaction: safe on production while traffic flows, nothing is locked or written. Exit status 0 when
every invariant holds, 1 when any is violated (each violation is printed with its offending ids).
"""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from connector.selectors.invariants import INVARIANTS, InvariantReport, invariant_check


def _jsonable(value):
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)  # Decimal positions, dates


def report_json(report: InvariantReport) -> dict:
    return {
        "ok": report.ok,
        "seconds": round(report.seconds, 3),
        "checked": report.checked,
        "skipped": report.skipped,
        "totals": {code: n for code, n in report.totals.items() if n},
        "violations": [{"invariant": v.invariant, "ids": {k: _jsonable(x) for k, x in v.ids.items()}}
                       for v in report.violations],
    }


class Command(BaseCommand):
    help = "Check the system invariants read-only; exit 1 and print each violation with its ids if any fails."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true", help="print a JSON report on stdout")
        parser.add_argument("--limit", type=int, default=100, help="offending rows listed per invariant")
        parser.add_argument("--only", action="append", default=[], choices=[i.code for i in INVARIANTS],
                            help="check only this invariant (repeatable)")
        parser.add_argument("--database", default="default", help="database alias (default: default)")

    def handle(self, *args, **options) -> None:
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        report = invariant_check(using=options["database"], limit=options["limit"], only=tuple(options["only"]))
        if options["json"]:
            self.stdout.write(json.dumps(report_json(report), indent=2, sort_keys=True))
        else:
            statements = {i.code: i.statement for i in INVARIANTS}
            for code in report.checked:
                found = report.of(code)
                if not found:
                    self.stdout.write(f"ok        {code}")
                    continue
                self.stdout.write(self.style.ERROR(f"VIOLATED  {code} ({report.totals[code]}): {statements[code]}"))
                for violation in found:
                    self.stdout.write(f"          {violation.as_text()}")
                if report.totals[code] > len(found):
                    self.stdout.write(f"          ... and {report.totals[code] - len(found)} more")
            for code in report.skipped:
                self.stdout.write(f"skipped   {code} (its app is not installed)")
            self.stdout.write(f"{len(report.checked)} invariants checked in {report.seconds:.3f}s; "
                              f"{len(report.codes())} violated")
        if not report.ok:
            raise CommandError(f"{len(report.codes())} invariant(s) violated: {', '.join(sorted(report.codes()))}",
                               returncode=1)
