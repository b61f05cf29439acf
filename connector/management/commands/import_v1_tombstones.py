"""Import V1-accepted transport identities as non-executable acceptance tombstones (CV2-05-007, CV2-05-008).

Input: a JSON Lines file, one object per line with exactly the keys
`{"account", "channel", "transport_key", "payload_digest": <64 hex>, "predecessor_ref"}`. Blank lines are
skipped. All or nothing: every line is checked first, then all are imported in one transaction through
`tombstones_import`; a refused line rolls the whole file back and the error names its line number. Re-running
the same file is a no-op (every row counts as unchanged)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.services.tombstones import tombstones_import

FIELDS = ("account", "channel", "transport_key", "payload_digest", "predecessor_ref")
_HEX_DIGEST = re.compile(r"^[0-9a-fA-F]{64}$")


def _row(number: int, raw: bytes) -> dict:
    try:
        item = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CommandError(f"line {number}: not UTF-8 (byte {exc.start})") from exc
    except ValueError as exc:
        raise CommandError(f"line {number}: not JSON: {exc}") from exc
    if not isinstance(item, dict):
        raise CommandError(f"line {number}: expected a JSON object")
    missing, extra = sorted(set(FIELDS) - set(item)), sorted(set(item) - set(FIELDS))
    if missing or extra:
        raise CommandError(f"line {number}: expected exactly the keys {', '.join(FIELDS)}"
                           + (f"; missing {', '.join(missing)}" if missing else "")
                           + (f"; unexpected {', '.join(extra)}" if extra else ""))
    for name in FIELDS:
        if not isinstance(item[name], str):
            raise CommandError(f"line {number}: {name} must be a string")
    if not _HEX_DIGEST.match(item["payload_digest"]):
        raise CommandError(f"line {number}: payload_digest must be a SHA-256 digest as 64 hexadecimal characters")
    return {**item, "payload_digest": bytes.fromhex(item["payload_digest"])}


class Command(BaseCommand):
    help = ("Import V1 transport identities (JSON Lines: account, channel, transport_key, payload_digest hex, "
            "predecessor_ref) as acceptance tombstones, all or nothing.")

    def add_arguments(self, parser):
        parser.add_argument("file", help="path of the JSON Lines file")

    def handle(self, *args, file: str, **options):
        try:
            lines = Path(file).read_bytes().splitlines()
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror}") from exc
        rows = [(number, _row(number, raw)) for number, raw in enumerate(lines, start=1) if raw.strip()]
        actor = Actor.system("import_v1_tombstones")
        created = unchanged = 0
        # One transaction for the file; each line goes through the service on its own so that a refusal can name
        # its line (the service's own transaction nests as a savepoint; the outer rollback undoes every line).
        with transaction.atomic():
            for number, row in rows:
                try:
                    result = tombstones_import(rows=[row], actor=actor)
                except ConnectorError as exc:
                    raise CommandError(f"line {number}: {exc.code}: {exc.detail}; nothing was imported") from exc
                created += result.created
                unchanged += result.unchanged
        self.stdout.write(self.style.SUCCESS(f"created {created}, unchanged {unchanged}"))
