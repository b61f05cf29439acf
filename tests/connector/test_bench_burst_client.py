"""`manage.py bench burst`'s load generator (bench/burst_client.py, D-359): every body is posted exactly once, signed,
with its own idempotency key, over one keep-alive connection per client thread; a dropped connection is counted
and the next delivery opens a new one. Proves: CV2-14-002 (the bench's figures are measured)."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.burst_client import post_all
from connector.services.signatures import parse_header, sign

SECRET = b"burst-client-test-secret"


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as gunicorn answers
    seen: list[tuple[str, bytes, str, int]] = []
    lock = threading.Lock()
    drop_key = None

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        key = self.headers["Idempotency-Key"]
        if key == type(self).drop_key:
            type(self).drop_key = None
            self.close_connection = True
            self.wfile.flush()
            self.connection.shutdown(2)  # no answer at all: the client sees the connection drop
            return
        with self.lock:
            self.seen.append((key, body, self.headers["Connector-Signature"], self.client_address[1]))
        self.send_response(201)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


def _serve():
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_every_body_posted_once_signed_over_one_connection_per_client():
    """40 bodies from 3 clients: 40 answers of 201, each key once with its own body and a valid signature of that
    body, over at most 3 client connections (keep-alive)."""
    server = _serve()
    try:
        bodies = [f'{{"n": {n}}}'.encode() for n in range(40)]
        out = post_all(url=f"http://127.0.0.1:{server.server_address[1]}/api/v2/receipts", secret=SECRET,
                       bodies=bodies, clients=3, key_prefix="k-")
    finally:
        server.shutdown()
        server.server_close()
    assert out["accepted"] == 40 and out["statuses"] == {"201": 40} and out["transport_error_count"] == 0, out
    assert out["first_201"] <= out["last_201"]
    by_key = {key: (body, header) for key, body, header, _ in _Recorder.seen}
    assert len(_Recorder.seen) == 40 and sorted(by_key) == sorted(f"k-{n}" for n in range(40))
    for n in range(40):
        body, header = by_key[f"k-{n}"]
        assert body == bodies[n]
        timestamp, _ = parse_header(header)
        assert header == sign(SECRET, timestamp, body)
    assert len({port for *_, port in _Recorder.seen}) <= 3  # one keep-alive connection per client thread


def test_a_dropped_connection_is_counted_and_the_next_delivery_reconnects():
    """The server drops the connection of one delivery without answering: it is one transport error, not a 201,
    and every other delivery of that client still gets its 201 over a new connection."""
    server = _serve()
    _Recorder.drop_key = "k-3"
    try:
        out = post_all(url=f"http://127.0.0.1:{server.server_address[1]}/r", secret=SECRET,
                       bodies=[b"{}"] * 10, clients=1, key_prefix="k-")
    finally:
        server.shutdown()
        server.server_close()
    assert out["accepted"] == 9 and out["transport_error_count"] == 1, out
    assert sorted(key for key, *_ in _Recorder.seen) == sorted(f"k-{n}" for n in range(10) if n != 3)
    assert len({port for *_, port in _Recorder.seen}) == 2  # a new connection after the drop
