"""A small loopback remote system for the demo: it accepts the outbound pushes of `make run`, applies each
logical effect once per Idempotency-Key, and answers 201 (first time) or 200 (repeat) with a remote id."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the demo remote receiver on 127.0.0.1:PORT (default 8900) until interrupted."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8900)

    def handle(self, *args, port: int, **options):
        applied: dict[str, str] = {}
        lock = threading.Lock()
        out = self.stdout

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.startswith("/bulk"):
                    return self._bulk(body)
                key = self.headers.get("Idempotency-Key") or hashlib.sha256(self.path.encode() + body).hexdigest()
                with lock:
                    first = key not in applied
                    remote_id = applied.setdefault(key, "remote-" + key[:12])
                out.write(f"{'applied' if first else 'repeat'} {self.path} key={key[:16]}... -> {remote_id}")
                data = json.dumps({"id": remote_id}).encode()
                self.send_response(201 if first else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_PUT = do_POST

            def _bulk(self, body: bytes):
                """The delivery receiver protocol (sync_batch): apply the batch once per receiver mutation key
                and answer the applied count with the payload digest (effects/delivery/protocol.py)."""
                key = self.headers.get("Idempotency-Key", "")
                try:
                    records = json.loads(body).get("records", [])
                except ValueError:
                    records = None
                if records is None:
                    status, answer = 400, {"error": "not json"}
                else:
                    with lock:
                        first = key not in applied
                        applied.setdefault(key, f"batch-{len(records)}")
                    out.write(f"{'applied' if first else 'repeat'} bulk batch of {len(records)} records "
                              f"key={key[:16]}...")
                    status, answer = 200, {"status": "succeeded", "applied": len(records),
                                           "payload_sha256": hashlib.sha256(body).hexdigest()}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        out.write(f"demo receiver listening on http://127.0.0.1:{port}")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
