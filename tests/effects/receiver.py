"""A real HTTP test receiver on loopback. It records every request (method, path, idempotency key, body) and
applies each logical effect keyed by the Idempotency-Key; its counts are what "exactly once" is measured against.

Modes (set per test, optionally for the next N requests):
  ok             apply, answer 201 {"id": remote id}
  fail_before    answer 503 without applying
  refuse         answer 422 without applying (a definitive "no effect")
  gone           answer 404 without applying (the record an update addresses is not there)
  apply_drop     apply, then drop the connection without answering
  hang           apply, then sleep past the client timeout
  apply_5xx      apply, then answer 500
  new_identity   apply, answer 201 {"id": a new remote id} even for an update (the provider changed the identity)
  throttle       answer 429 with `Retry-After: <retry_after>` without applying (the receiver's rate limit)

Every request also records its arrival time (`at`, monotonic; `wall`, time.time()), the number of requests in flight
at the receiver when it arrived (`in_flight`, itself included) and when its answer began to be written
(`answered_at`, monotonic; `answered_wall`); `service_seconds` holds every answer that long. A request leaves the
in-flight counts just before its answer's first byte is written (the client cannot send its next request before it
reads that answer), so a handler thread that is descheduled after answering never counts twice.

An update (`PATCH /v1/records/by-id/<id>`) is applied to the record it names and answered with that id, the way a
CRM answers; a create answers "remote-" + the key's last 12 characters.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support import whole_seconds


class Receiver:
    def __init__(self, port: int = 0) -> None:
        self.requests: list[dict] = []
        self.applied: dict[str, int] = {}  # idempotency key (or path) -> times applied
        self.modes: list[str] = []
        self.default_mode = "ok"
        self.hang_seconds = 8.0
        self.retry_after = "2"
        self.service_seconds = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        # Optional: path -> destination group; per-group in-flight maxima; groups whose next request is throttled.
        self.group_of = None
        self.group_in_flight: dict[str, int] = {}
        self.group_max_in_flight: dict[str, int] = {}
        self.throttle_groups: set[str] = set()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                key = self.headers.get("Idempotency-Key") or self.path
                group = receiver.group_of(self.path) if receiver.group_of else ""
                with receiver.lock:
                    mode = receiver.modes.pop(0) if receiver.modes else receiver.default_mode
                    if group in receiver.throttle_groups:
                        receiver.throttle_groups.discard(group)
                        mode = "throttle"
                    receiver.in_flight += 1
                    receiver.max_in_flight = max(receiver.max_in_flight, receiver.in_flight)
                    in_group = receiver.group_in_flight[group] = receiver.group_in_flight.get(group, 0) + 1
                    receiver.group_max_in_flight[group] = max(receiver.group_max_in_flight.get(group, 0), in_group)
                    self._record = {"method": self.command, "path": self.path, "key": key, "body": body,
                                    "auth": self.headers.get("Authorization"), "mode": mode,
                                    "at": time.monotonic(), "wall": time.time(), "in_flight": receiver.in_flight,
                                    "group": group, "traceparent": self.headers.get("traceparent"),
                                    "answered_at": None, "answered_wall": None}
                    receiver.requests.append(self._record)
                try:
                    if receiver.service_seconds:
                        time.sleep(receiver.service_seconds)
                    return self._handle(mode, key)
                finally:
                    self._leave()

            def _leave(self) -> None:
                """Out of the in-flight counts, once: just before the answer is written (or at the end)."""
                with receiver.lock:
                    if self._record["answered_at"] is None:
                        self._record["answered_at"], self._record["answered_wall"] = time.monotonic(), time.time()
                        receiver.in_flight -= 1
                        receiver.group_in_flight[self._record["group"]] -= 1

            def _handle(self, mode: str, key: str):
                if mode == "throttle":
                    return self._answer(429, {"error": "slow down"}, {"Retry-After": receiver.retry_after})
                if mode == "fail_before":
                    return self._answer(503, {"error": "unavailable"})
                if mode == "refuse":
                    return self._answer(422, {"error": "refused"})
                if mode == "gone":
                    return self._answer(404, {"error": f"no record at {self.path}"})
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

            def _answer(self, status: int, payload: dict, headers: dict | None = None) -> None:
                data = json.dumps(payload).encode()
                self._leave()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # port: a receiver back on the same port
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


@pytest.fixture
def receiver(settings):
    """A started Receiver with the egress pointed at it (a 1 s timeout stretched by the suite's time factor; a `hang`
    sleeps 7 s past it), stopped after the test. Bound by tests/effects/conftest.py and
    tests/crash/egress_fixtures.py (`from tests.effects.receiver import receiver`)."""
    r = Receiver().start()
    timeout = whole_seconds(1)
    r.hang_seconds = timeout + 7.0
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": r.url, "EGRESS_TIMEOUT_SECONDS": timeout}
    yield r
    r.stop()
