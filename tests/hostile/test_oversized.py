"""Oversized bodies and headers are refused with a clear code, in bounded memory, and write nothing.

- Bodies above DATA_UPLOAD_MAX_MEMORY_SIZE: the WSGI app is called directly with a lazily generated 64 MiB input
  stream that counts what is read. The app answers 413 `BODY_TOO_LARGE` from the declared Content-Length without
  reading a byte of the body; Python's peak allocation during the request stays far below the body size. A body
  that lies about its length is read only up to the declared length.
- Oversized headers: an 8 KiB Idempotency-Key or Connector-Signature is refused by the app with its catalog code
  (NONCANONICAL_KEY / SIGNATURE_INVALID); above the server's own limits (a header field over 8190 bytes, more than
  100 header fields, a request line over 8190 bytes) the web process of `make run` (gunicorn with
  config/gunicorn.py, the `web_server` fixture) refuses before the app runs, with the JSON error catalog, and keeps
  serving; it refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE from its Content-Length without reading it.
"""
from __future__ import annotations

import base64
import io
import json
import socket
import sys
import threading
import time
import tracemalloc

import pytest
from django.conf import settings
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections

from connector.api.exceptions import API_ERROR_CODES
from tests.hostile.support import OPERATOR, OPERATOR_PASSWORD, build_api_world, delivery, row_counts
from tests.support import scaled

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
    with socket.create_connection(("127.0.0.1", port), timeout=scaled(30)) as sock:
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


def _answer(raw: bytes) -> tuple[int, dict[str, str], dict]:
    """(status, lower-cased headers, JSON body) of one raw HTTP/1.1 answer; fails on a body that is not JSON."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    try:
        data = json.loads(body)
    except ValueError:
        raise AssertionError(f"not a JSON body: {raw[:300]!r}") from None
    return int(lines[0].split(" ")[1]), headers, data


def _catalog_refusal(raw: bytes, code: str) -> None:
    """The answer is the catalog's status and a `{"code", "detail"}` body with `code`, and the server closes the
    connection."""
    status, headers, data = _answer(raw)
    assert (status, data.get("code"), set(data)) == (API_ERROR_CODES[code][0], code, {"code", "detail"}), raw[:300]
    assert headers["content-type"] == "application/json" and headers.get("connection") == "close", raw[:300]


@pytest.mark.django_db
def test_web_process_refuses_oversized_headers_and_keeps_serving(web_server):
    """The web process of `make run` (gunicorn, config/gunicorn.py) refuses a request head over its limits itself,
    before the app runs, and answers with the API's JSON error catalog, never an HTML page: a 100,000-character
    Idempotency-Key and more than 100 header fields are 431 HEADERS_TOO_LARGE, a request line over 8190 bytes is 414
    URI_TOO_LONG, a request line that is not HTTP 400 REQUEST_MALFORMED, a chunked body 411 LENGTH_REQUIRED. Below
    the limits the app answers with its own catalog code, and the server keeps serving.
    Proves: CV2-01-004 (a bad key is refused with a clear code, before persistence)"""
    port = web_server.port
    path = ADMIT.format(account="nobody").encode()
    before = row_counts()
    huge_key = b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: " + b"k" * 100_000 \
        + b"\r\nContent-Length: 0\r\n\r\n"
    _catalog_refusal(_raw_http(port, huge_key), "HEADERS_TOO_LARGE")
    many = b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(
        f"X-Filler-{i}: v\r\n".encode() for i in range(150)) + b"Content-Length: 0\r\n\r\n"
    _catalog_refusal(_raw_http(port, many), "HEADERS_TOO_LARGE")
    long_line = b"GET /api/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    _catalog_refusal(_raw_http(port, long_line), "URI_TOO_LONG")
    _catalog_refusal(_raw_http(port, b"NOT AN HTTP REQUEST\r\n\r\n"), "REQUEST_MALFORMED")
    _catalog_refusal(_raw_http(port, b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: v\r\n\r\n"),
                     "REQUEST_MALFORMED")
    chunked = b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    _catalog_refusal(_raw_http(port, chunked), "LENGTH_REQUIRED")
    # below the server's limits the app answers with its catalog code, and the server is still up
    ok = _raw_http(port, b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                         b"Idempotency-Key: " + b"k" * 4000 + b"\r\nContent-Length: 0\r\n\r\n")
    status, _, data = _answer(ok)
    assert (status, data["code"]) == (404, "ACCOUNT_NOT_FOUND"), ok[:300]
    assert web_server.child.proc.poll() is None, web_server.child.output()
    assert row_counts() == before


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


@pytest.mark.django_db
def test_web_process_refuses_an_oversized_body_in_bounded_memory(web_server):
    """A 64 MiB body (Content-Length above DATA_UPLOAD_MAX_MEMORY_SIZE) sent to the web process of `make run`
    (gunicorn) is refused with 413 BODY_TOO_LARGE and the connection closed as soon as the head is read: the server
    neither drains nor buffers the body (the client cannot send most of it; no worker's peak RSS grows by more than
    16 MiB). A client that waits for `100 Continue` gets the 413 instead, and a body of exactly the limit is still
    read and answered by the app."""
    port = web_server.port
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    path = ADMIT.format(account="nobody").encode()
    workers = web_server.worker_pids()
    assert workers, web_server.child.output()
    baseline = {pid: _peak_rss_kib(pid) for pid in workers}
    size = 64 * MiB
    sent = 0

    with socket.create_connection(("127.0.0.1", port), timeout=scaled(30)) as sock:
        sock.sendall(b"POST " + path + f" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {size}\r\n\r\n".encode())

        def push_body() -> None:
            nonlocal sent
            chunk = b"x" * MiB
            try:
                for _ in range(size // MiB):
                    sock.sendall(chunk)
                    sent += MiB
            except OSError:
                pass  # the server closed the connection: that is what a bounded server does

        pusher = threading.Thread(target=push_body)
        pusher.start()
        answer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            answer += chunk
        pusher.join(scaled(60))
    status, _, data = _answer(answer)
    assert (status, data["code"]) == (413, "BODY_TOO_LARGE"), answer[:300]
    growth_mib = max(_peak_rss_kib(pid) - baseline[pid] for pid in workers) / 1024
    assert growth_mib < 16, f"a worker's peak RSS grew by {growth_mib:.0f} MiB for a 64 MiB body"
    assert sent < size // 2, f"the server took {sent // MiB} MiB of a {size // MiB} MiB body it had refused"
    _catalog_refusal(answer, "BODY_TOO_LARGE")

    waiting = _raw_http(port, b"POST " + path + f" HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
                                                 f"Content-Length: {limit + 1}\r\n\r\n".encode())
    assert not waiting.startswith(b"HTTP/1.1 100"), waiting[:200]
    _catalog_refusal(waiting, "BODY_TOO_LARGE")
    at_limit = _raw_http(port, b"POST " + path + f" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                                                  f"Content-Length: {limit}\r\n\r\n".encode() + b"x" * limit)
    status, _, data = _answer(at_limit)
    assert (status, data["code"]) == (404, "ACCOUNT_NOT_FOUND"), at_limit[:300]
