"""A real HTTP test receiver on loopback. It records every request (method, path, idempotency key, body) and
applies each logical effect keyed by the Idempotency-Key; its counts are what "exactly once" is measured against.

Modes (set per test, optionally for the next N requests):
  ok             apply, answer 201 {"id": remote id}
  fail_before    answer 503 without applying
  refuse         answer 422 without applying (a definitive "no effect")
  apply_drop     apply, then drop the connection without answering
  hang           apply, then sleep past the client timeout
  apply_5xx      apply, then answer 500
  new_identity   apply, answer 201 {"id": a new remote id} even for an update (the provider changed the identity)

An update (`PATCH /v1/records/by-id/<id>`) is applied to the record it names and answered with that id, the way a
CRM answers; a create answers "remote-" + the key's last 12 characters.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.applied: dict[str, int] = {}  # idempotency key (or path) -> times applied
        self.modes: list[str] = []
        self.default_mode = "ok"
        self.hang_seconds = 8.0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                key = self.headers.get("Idempotency-Key") or self.path
                with receiver.lock:
                    mode = receiver.modes.pop(0) if receiver.modes else receiver.default_mode
                    receiver.requests.append({"method": self.command, "path": self.path, "key": key, "body": body,
                                              "auth": self.headers.get("Authorization"), "mode": mode,
                                              "traceparent": self.headers.get("traceparent")})
                if mode == "fail_before":
                    return self._answer(503, {"error": "unavailable"})
                if mode == "refuse":
                    return self._answer(422, {"error": "refused"})
                with receiver.lock:
                    first = key not in receiver.applied
                    receiver.applied[key] = receiver.applied.get(key, 0) + (1 if first else 0)
                remote_id = "remote-" + key[-12:]
                if "/by-id/" in self.path and mode != "new_identity":
                    remote_id = self.path.rsplit("/", 1)[-1]
                elif mode == "new_identity":
                    remote_id = "remote-new-" + key[-8:]
                if mode == "apply_drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return None
                if mode == "hang":
                    time.sleep(receiver.hang_seconds)
                    return self._answer(201, {"id": remote_id})
                if mode == "apply_5xx":
                    return self._answer(500, {"error": "after apply"})
                return self._answer(201 if first else 200, {"id": remote_id})

            do_PUT = do_POST

            do_PATCH = do_POST

            def _answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "Receiver":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def applied_total(self) -> int:
        """Logical effects applied, counting repeats of one key as one (the receiver dedups by key)."""
        return len(self.applied)

    def raw_applications(self) -> int:
        return sum(1 for r in self.requests if r["mode"] in ("ok", "apply_drop", "hang", "apply_5xx", "new_identity"))
