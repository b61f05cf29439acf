"""Boot the V1 release against the database DATABASE_URL names (a restore rehearsal's or a restore's copy) and
verify it: the V1 schema digest, the release and binary digests, and that cursors, high-waters, work items,
effects and process generations are readable. Prints one JSON line; exits 1 on any mismatch."""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand
from django.db import connection

from v1.models import RELEASE_ID, V1Barrier, V1HighWater, V1OutboundEffect, V1ProcessGeneration, V1SourceCursor, \
    V1WorkItem
from v1.owner import binary_digest, schema_digest


class Command(BaseCommand):
    help = "Boot the V1 release against the configured database and verify its schema and release bindings."

    def add_arguments(self, parser):
        parser.add_argument("--expect-release", required=True)
        parser.add_argument("--expect-schema", required=True, help="hex sha256 of the V1 schema")
        parser.add_argument("--expect-binary", required=True, help="hex sha256 of the V1 sources")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **options):
        problems: list[str] = []
        if options["expect_release"] != RELEASE_ID:
            problems.append(f"release {RELEASE_ID} is deployed, {options['expect_release']} was expected")
        if binary_digest().hex() != options["expect_binary"]:
            problems.append("the V1 binary digest differs from the certified release")
        with connection.cursor() as cursor:
            schema = schema_digest(cursor).hex()
            cursor.execute("SELECT current_database()")
            database = cursor.fetchone()[0]
        if schema != options["expect_schema"]:
            problems.append(f"the V1 schema digest of {database} differs from the release's")
        counts = {}
        if not problems:
            counts = {m.__name__: m.objects.count() for m in (V1ProcessGeneration, V1Barrier, V1SourceCursor,
                                                                V1WorkItem, V1OutboundEffect, V1HighWater)}
        report = {"ok": not problems, "database": database, "release": RELEASE_ID, "schema_digest": schema,
                  "counts": counts, "problems": problems}
        self.stdout.write(json.dumps(report, sort_keys=True))
        if problems:
            raise SystemExit(1)
