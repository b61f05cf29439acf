"""A real loopback receiver for both receiver kinds of the delivery protocol (effects/delivery/protocol.py), for
the tests (it lives outside the product packages; the demo's receiver is demo/crm.py, run by
`python -m demo.receiver`). It records every request and counts, per receiver mutation key
(the Idempotency-Key), how many times a mutation was applied: the figure "applied at most once" is measured
against.

Behaviours are queued per request (`receiver.queue(...)`), else `default`:
  sync_batch:  full | partial | count_missing | digest_mismatch | fail_rollback | fail_partial | fail_unknown |
               refuse | rate_limit | drop | error_5xx | garbage
  async_bulk_job (POST answers 202 with a job; the job's polls answer in turn):
               job_full | job_partial | job_failed_rollback | job_failed_partial | job_failed_unknown |
               job_cancelled_none | job_cancelled_unknown | job_expire | job_protocol_unknown |
               job_running_then_protocol | job_running_then_full
"""
from __future__ import annotations

import hashlib
import json
import socket
import ssl
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

JOB_POLLS = {
    "job_full": [("running", None), ("succeeded", "all")],
    "job_partial": [("succeeded", "half")],
    "job_failed_rollback": [("failed", 0)],
    "job_failed_partial": [("failed", "half")],
    "job_failed_unknown": [("failed", None)],
    "job_cancelled_none": [("cancelled", 0)],
    "job_cancelled_unknown": [("cancelled", None)],
    "job_expire": [("expired", None)],
    "job_protocol_unknown": [("garbage", None)],
    "job_running_then_protocol": [("running", None), ("garbage", None)],
    "job_running_then_full": [("running", None), ("running", None), ("succeeded", "all")],
}


class DeliveryReceiver:
    def __init__(self, *, kind: str = "sync_batch", default: str | None = None, retry_after: int = 1,
                 tls: tuple[str, str, str] | None = None) -> None:
        """`tls`: (server cert, server key, client CA): serve HTTPS and require a client certificate signed by
        the CA (mTLS); the verified client certificate's subject CN is recorded with each request."""
        self.kind = kind
        self.default = default or ("full" if kind == "sync_batch" else "job_full")
        self.retry_after = retry_after
        self.modes: list[str] = []
        self.requests: list[dict] = []
        self.applied: dict[str, int] = {}  # receiver mutation key -> times applied
        self.records: dict[str, int] = {}  # receiver mutation key -> records applied
        self.jobs: dict[str, dict] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _answer(self, status: int, payload, headers: dict | None = None) -> None:
                body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                if self.path.startswith("/oauth/token"):
                    return self._answer(200, {"access_token": "token-" + uuid.uuid4().hex[:8]})
                key = self.headers.get("Idempotency-Key", "")
                with receiver.lock:
                    mode = receiver.modes.pop(0) if receiver.modes else receiver.default
                    receiver.requests.append({"path": self.path, "key": key, "mode": mode, "body": body,
                                              "headers": dict(self.headers), "client_cn": self._client_cn()})
                try:
                    records = json.loads(body).get("records", [])
                except ValueError:
                    return self._answer(400, {"error": "not json"})
                n = len(records)
                digest = hashlib.sha256(body).hexdigest()
                if receiver.kind == "async_bulk_job":
                    job = uuid.uuid4().hex
                    with receiver.lock:
                        receiver.jobs[job] = {"key": key, "n": n, "polls": list(JOB_POLLS[mode]), "digest": digest}
                    return self._answer(202, {"job_id": job})
                return receiver._sync(self, mode, key, n, digest)

            def _client_cn(self) -> str:
                getpeercert = getattr(self.connection, "getpeercert", None)
                cert = getpeercert() if getpeercert else None
                for rdn in (cert or {}).get("subject", ()):
                    for name, value in rdn:
                        if name == "commonName":
                            return value
                return ""

            def do_GET(self):  # noqa: N802
                job_id = self.path.rstrip("/").rsplit("/", 1)[-1]
                with receiver.lock:
                    job = receiver.jobs.get(job_id)
                    receiver.requests.append({"path": self.path, "key": "", "mode": "poll", "body": b"",
                                              "headers": dict(self.headers)})
                if job is None:
                    return self._answer(404, {"error": "unknown job"})
                with receiver.lock:
                    status, count = job["polls"].pop(0) if len(job["polls"]) > 1 else job["polls"][0]
                if status == "expired":
                    return self._answer(410, {"error": "receipt expired"})
                if status == "garbage":
                    return self._answer(200, b"<html>gateway</html>")
                applied = {"all": job["n"], "half": job["n"] // 2, None: None}.get(count, count)
                if status in ("succeeded", "failed", "cancelled") and applied:
                    receiver._apply(job["key"], applied, once=job)
                payload = {"status": status, "applied": applied}
                if status == "succeeded":
                    payload["payload_sha256"] = job["digest"]
                if status == "failed" and applied == 0:
                    payload["rolled_back"] = True
                return self._answer(200, payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.tls = tls
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls[0], tls[1])
            context.load_verify_locations(tls[2])
            context.verify_mode = ssl.CERT_REQUIRED
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- behaviours -------------------------------------------------------------------------------------------

    def _apply(self, key: str, records: int, *, once: dict | None = None) -> None:
        with self.lock:
            if once is not None:
                if once.get("applied"):
                    return
                once["applied"] = True
            self.applied[key] = self.applied.get(key, 0) + 1
            self.records[key] = self.records.get(key, 0) + records

    def _sync(self, handler, mode: str, key: str, n: int, digest: str):
        answer = handler._answer
        if mode == "refuse":
            return answer(422, {"error": "refused"})
        if mode == "rate_limit":
            return answer(429, {"error": "slow down"}, {"Retry-After": str(self.retry_after)})
        if mode in ("fail_rollback",):
            return answer(200, {"status": "failed", "applied": 0, "rolled_back": True})
        if mode == "fail_unknown":
            return answer(200, {"status": "failed"})
        half = n // 2
        self._apply(key, half if mode in ("partial", "fail_partial") else n)
        if mode == "drop":
            handler.connection.shutdown(socket.SHUT_RDWR)
            return None
        if mode == "error_5xx":
            return answer(500, {"error": "after apply"})
        if mode == "garbage":
            return answer(200, b"<html>ok</html>")
        if mode == "fail_partial":
            return answer(200, {"status": "failed", "applied": half, "rolled_back": False})
        if mode == "partial":
            return answer(200, {"status": "succeeded", "applied": half, "payload_sha256": digest})
        if mode == "count_missing":
            return answer(200, {"status": "succeeded", "payload_sha256": digest})
        if mode == "digest_mismatch":
            return answer(200, {"status": "succeeded", "applied": n, "payload_sha256": "0" * 64})
        return answer(200, {"status": "succeeded", "applied": n, "payload_sha256": digest})

    # -- control ----------------------------------------------------------------------------------------------

    def queue(self, *modes: str) -> None:
        with self.lock:
            self.modes.extend(modes)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    def start(self) -> DeliveryReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def mutations(self) -> list[dict]:
        return [r for r in self.requests if r["mode"] != "poll" and not r["path"].startswith("/oauth")]
