"""Oversized bodies and headers are refused with a clear code, in bounded memory, and write nothing.

- Bodies above DATA_UPLOAD_MAX_MEMORY_SIZE: the WSGI app is called directly with a lazily generated 64 MiB input
  stream that counts what is read. The app answers 413 `BODY_TOO_LARGE` from the declared Content-Length without
  reading a byte of the body; Python's peak allocation during the request stays far below the body size. A body
  that lies about its length is read only up to the declared length.
- Oversized headers: an 8 KiB Idempotency-Key or Connector-Signature is refused by the app with its catalog code
  (NONCANONICAL_KEY / SIGNATURE_INVALID); above the server's own limits (a 64 KiB header line, more than 100
  header fields) the web process (`manage.py runserver`) refuses with 431 before the app runs, and keeps serving.
"""
from __future__ import annotations

import base64
import io
import json
import socket
import sys
import time
import tracemalloc

import pytest
from django.conf import settings
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections

from tests.faults.servers import Child, child_environment, free_port, run_database_env, wait_port
from tests.hostile.support import OPERATOR, OPERATOR_PASSWORD, build_api_world, delivery, row_counts

APP = get_wsgi_application()
MiB = 1024 * 1024
ADMIT = "/api/v2/accounts/{account}/channels/records.webhook/receipts"


class CountingInput(io.RawIOBase):
    """A request body of `size` bytes generated on demand; `consumed` counts what the app read."""

    def __init__(self, size: int) -> None:
        self.size, self.consumed = size, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.size - self.consumed)
        buffer[:n] = b"x" * n
        self.consumed += n
        return n


@pytest.fixture
def world(db):
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield build_api_world()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def call(path: str, *, body: CountingInput, declared: int, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """One request straight into the WSGI app; returns (status, JSON body)."""
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "SERVER_NAME": "localhost", "SERVER_PORT": "80",
               "HTTP_HOST": "localhost", "wsgi.url_scheme": "http", "wsgi.input": body,
               "wsgi.errors": sys.stderr, "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(declared),
               "SERVER_PROTOCOL": "HTTP/1.1"}
    environ.update({"HTTP_" + k.upper().replace("-", "_"): v for k, v in (headers or {}).items()})
    status: list[str] = []
    chunks = APP(environ, lambda s, h, exc_info=None: status.append(s))
    data = b"".join(chunks)
    return int(status[0].split()[0]), json.loads(data)


def _basic() -> str:
    return "Basic " + base64.b64encode(f"{OPERATOR}:{OPERATOR_PASSWORD}".encode()).decode()


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint", ["admission", "replay"])
def test_oversized_body_is_refused_unread_in_bounded_memory(world, endpoint):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    size = 64 * MiB
    assert size > limit
    path = ADMIT.format(account=world.account_key) if endpoint == "admission" else \
        f"/api/v2/accounts/{world.account_key}/replays"
    headers = {"Idempotency-Key": "big-1", "Connector-Signature": world.sign(b"", int(time.time()))} \
        if endpoint == "admission" else {"Authorization": _basic()}
    call(path, body=CountingInput(size), declared=size, headers=headers)  # warm up: imports, URL resolver, caches
    before = row_counts()
    body = CountingInput(size)
    tracemalloc.start()
    try:
        status, data = call(path, body=body, declared=size, headers=headers)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (status, data["code"]) == (413, "BODY_TOO_LARGE"), data
    assert set(data) == {"code", "detail"}
    assert body.consumed == 0, f"the app read {body.consumed} bytes of an oversized body"
    assert peak < 1 * MiB, f"peak Python allocation {peak / MiB:.1f} MiB for a {size // MiB} MiB body"
    assert row_counts() == before


@pytest.mark.django_db
def test_body_at_the_limit_is_read_and_a_lying_length_is_not_overread(world):
    """At exactly the limit the body is read (and refused on its merits: not signed, 401); a body longer than its
    declared Content-Length is read only up to that length."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    before = row_counts()
    body = CountingInput(limit)
    status, data = call(ADMIT.format(account=world.account_key), body=body, declared=limit,
                        headers={"Idempotency-Key": "edge-1", "Connector-Signature": "t=1,v1=00"})
    assert (status, data["code"]) == (401, "SIGNATURE_INVALID") and body.consumed == limit

    real = delivery(7)
    liar = CountingInput(10 * MiB)
    status, data = call(ADMIT.format(account=world.account_key), body=liar, declared=len(real),
                        headers={"Idempotency-Key": "liar-1", "Connector-Signature": "t=1,v1=00"})
    assert status == 401 and liar.consumed == len(real)
    assert row_counts() == before


@pytest.mark.django_db
def test_oversized_header_values_are_refused_by_the_app(world, client):
    """Header values far beyond any identity or signature size: catalog codes, nothing written."""
    before = row_counts()
    url = ADMIT.format(account=world.account_key)
    body = delivery(1)
    response = client.post(url, data=body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k" * 8192,
                           HTTP_CONNECTOR_SIGNATURE=world.sign(body, int(time.time())))
    assert response.status_code == 400 and response.json()["code"] == "NONCANONICAL_KEY"
    assert "IDENTITY_TOO_LONG" in response.json()["detail"]
    for signature in ("t=1,v1=" + "ab" * 4096, "x" * 8192, f"t={int(time.time())},v1=" + "zz" * 4096):
        response = client.post(url, data=body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1",
                               HTTP_CONNECTOR_SIGNATURE=signature)
        assert response.status_code == 401 and response.json()["code"] == "SIGNATURE_INVALID", response.content
    response = client.post(url, data=body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1",
                           HTTP_CONNECTOR_SIGNATURE=world.sign(body, int(time.time())) + "0" * 8192)
    assert response.status_code == 401 and response.json()["code"] == "SIGNATURE_INVALID"
    assert row_counts() == before


def _raw_http(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.mark.django_db
def test_web_process_refuses_oversized_headers_and_keeps_serving(settings, tmp_path):
    port = free_port()
    env = child_environment(secret_dir=settings.CONNECTOR["SECRET_BACKEND_DIR"], REDIS_URL="redis://127.0.0.1:1/0",
                            **run_database_env())
    web = Child("web", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload",
                        "--skip-checks"], env, tmp_path).start()
    try:
        wait_port(port, 30, web.proc)
        path = ADMIT.format(account="nobody").encode()
        long_line = b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: " + b"k" * (70 * 1024) \
            + b"\r\nContent-Length: 0\r\n\r\n"
        answer = _raw_http(port, long_line)
        assert answer.startswith(b"HTTP/1.0 431") or answer.startswith(b"HTTP/1.1 431"), answer[:200]
        many = b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(
            f"X-Filler-{i}: v\r\n".encode() for i in range(150)) + b"Content-Length: 0\r\n\r\n"
        answer = _raw_http(port, many)
        assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"431", answer[:200]
        # below the server's limits the app answers with its catalog code, and the server is still up
        ok = _raw_http(port, b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                             b"Idempotency-Key: " + b"k" * 16000 + b"\r\nContent-Length: 0\r\n\r\n")
        assert ok.split(b"\r\n", 1)[0].split(b" ")[1] == b"404" and b'"ACCOUNT_NOT_FOUND"' in ok, ok[:300]
        assert web.proc.poll() is None, web.output()
    finally:
        web.stop()


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


@pytest.mark.django_db
@pytest.mark.xfail(strict=True, reason="BUG: the web process of scripts/run.py (`manage.py runserver`) drains an "
                   "oversized body in one read after the app refused it unread (django.core.servers.basehttp."
                   "ServerHandler.close reads the whole remaining LimitedStream), so its peak memory grows by the "
                   "declared Content-Length; serve the app with a WSGI server or proxy that enforces a body limit")
def test_web_process_refuses_an_oversized_body_in_bounded_memory(settings, tmp_path):
    port = free_port()
    env = child_environment(secret_dir=settings.CONNECTOR["SECRET_BACKEND_DIR"], REDIS_URL="redis://127.0.0.1:1/0",
                            **run_database_env())
    web = Child("web", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload",
                        "--skip-checks"], env, tmp_path).start()
    try:
        wait_port(port, 30, web.proc)
        path = ADMIT.format(account="nobody").encode()
        _raw_http(port, b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                        b"Content-Length: 0\r\n\r\n")
        baseline = _peak_rss_kib(web.proc.pid)
        size = 64 * MiB
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST " + path + f" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {size}\r\n\r\n".encode())
            chunk = b"x" * MiB
            try:
                for _ in range(size // MiB):
                    sock.sendall(chunk)
            except OSError:
                pass  # the server may close early: that is what a bounded server does
            answer = sock.recv(200)
        assert answer.split(b" ")[1] == b"413", answer
        growth_mib = (_peak_rss_kib(web.proc.pid) - baseline) / 1024
        assert growth_mib < 16, f"peak RSS of the web process grew by {growth_mib:.0f} MiB for a 64 MiB body"
    finally:
        web.stop()
