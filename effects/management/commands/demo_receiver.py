"""A small loopback remote system for the demo: a CRM that creates a record on the first push of a local record,
updates it by its CRM id on every later push (the RemoteLink's identity), applies each logical effect once per
Idempotency-Key, and serves the REST bulk delivery receiver protocol (effects/demo_crm.py)."""
from __future__ import annotations

from django.core.management.base import BaseCommand

from effects.demo_crm import DemoCrm


class Command(BaseCommand):
    help = "Run the demo remote receiver (a small CRM) on 127.0.0.1:PORT (default 8900) until interrupted."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8900)

    def handle(self, *args, port: int, **options):
        out = self.stdout
        server = DemoCrm(write=out.write).server(port)
        out.write(f"demo receiver listening on http://127.0.0.1:{port}")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
