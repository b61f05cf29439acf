"""The production web server's worker: gunicorn's threaded worker, answering its own refusals like the API.

Loaded by config/gunicorn.py (`worker_class`). Three things differ from `gthread` (decisions D-160, D-161, D-164):

- **Every refusal the server makes answers with the API's JSON error catalog** (connector.api.exceptions,
  `{"code", "detail"}`, `Connection: close`), never gunicorn's HTML page: a header field or header block over the
  limits is 431 `HEADERS_TOO_LARGE`, a request line over the limit 414 `URI_TOO_LONG`, anything else that is not
  HTTP/1.1 400 `REQUEST_MALFORMED`, a server fault 500 `INTERNAL_ERROR`.
- **A body is refused before a byte of it is read** when its `Content-Length` exceeds Django's
  `DATA_UPLOAD_MAX_MEMORY_SIZE` (413 `BODY_TOO_LARGE`), and when it is not framed by `Content-Length` at all
  (411 `LENGTH_REQUIRED`: Django reads only `Content-Length` bodies). The app is not called, no `100 Continue` is
  sent, and the connection is closed after a bounded linger (gunicorn's `close_graceful`: at most 64 KiB or 2 s).
- **The raw `Idempotency-Key`**: the value exactly as received after the field's one conventional space, in the
  environ under connector.api.transport.RAW_IDEMPOTENCY_KEY, so a padded key is refused, not trimmed.
"""
from __future__ import annotations

import errno
import json
import ssl
import threading
from datetime import timedelta
from functools import partial
from http import HTTPStatus

from gunicorn import util
from gunicorn.http.body import ChunkedReader, LengthReader
from gunicorn.http.errors import (
    ConfigurationProblem,
    InvalidResponseHeader,
    InvalidResponseHeaderName,
    LimitRequestHeaders,
    LimitRequestLine,
    ParseException,
    UnsupportedTransferCoding,
)
from gunicorn.http.message import Request
from gunicorn.http.parser import RequestParser
from gunicorn.http.wsgi import Response, default_environ
from gunicorn.workers.gthread import TConn, ThreadWorker

from connector.api.transport import RAW_IDEMPOTENCY_KEY

_KEY_FIELD = b"idempotency-key:"


def refusal_code(exc: BaseException) -> str:
    """The catalog code the server answers for an exception gunicorn raised while reading a request."""
    if isinstance(exc, (InvalidResponseHeader, InvalidResponseHeaderName, ConfigurationProblem)):
        return "INTERNAL_ERROR"  # the application's or the configuration's fault, not the client's
    if isinstance(exc, LimitRequestHeaders):
        return "HEADERS_TOO_LARGE"
    if isinstance(exc, LimitRequestLine):
        return "URI_TOO_LONG"
    if isinstance(exc, UnsupportedTransferCoding):
        return "LENGTH_REQUIRED"
    if isinstance(exc, (ParseException, ssl.SSLError)):
        return "REQUEST_MALFORMED"
    return "INTERNAL_ERROR"


#: Every code the server answers by itself (refusal_code, body_refusal_code).
SERVER_CODES = ("REQUEST_MALFORMED", "LENGTH_REQUIRED", "BODY_TOO_LARGE", "URI_TOO_LONG", "HEADERS_TOO_LARGE",
                "INTERNAL_ERROR")


def body_refusal_code(req: Request, limit: int | None) -> str | None:
    """`LENGTH_REQUIRED` for a body not framed by Content-Length, `BODY_TOO_LARGE` for one declared larger than
    `limit` (DATA_UPLOAD_MAX_MEMORY_SIZE; None: no limit), None otherwise. Read before any of the body is."""
    reader = req.body.reader
    if isinstance(reader, ChunkedReader):
        return "LENGTH_REQUIRED"
    if limit is not None and isinstance(reader, LengthReader) and reader.length > limit:
        return "BODY_TOO_LARGE"
    return None


def catalog_answers() -> dict[str, tuple[str, bytes]]:
    """code -> (status line, the whole HTTP/1.1 answer) of each server refusal: the catalog body, then the
    connection closes. Built once per worker, after Django is set up."""
    from connector.api.exceptions import API_ERROR_CODES

    answers = {}
    for code in SERVER_CODES:
        status, meaning = API_ERROR_CODES[code]
        status_line = f"{status} {HTTPStatus(status).phrase}"
        body = json.dumps({"code": code, "detail": meaning}).encode()
        head = (f"HTTP/1.1 {status_line}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n")
        answers[code] = (status_line, head.encode("latin-1") + body)
    return answers


class ConnectorRequest(Request):
    """gunicorn's HTTP/1.1 request that also keeps the raw Idempotency-Key value (bytes, None when absent).

    gunicorn strips a field value's SP/HTAB edges; here the value is what follows `Idempotency-Key:` less one
    leading SP (the conventional separator), so `Idempotency-Key:  k1 ` keeps ` k1 `. Repeated fields are joined
    with `,`, as gunicorn joins them for the environ. Always the pure-Python parser: the optional C parser never
    shows the raw header block."""

    raw_idempotency_key: bytes | None = None

    def parse(self, unreader):
        self._use_fast = False
        return super().parse(unreader)

    def parse_headers(self, data, from_trailer=False):
        headers = super().parse_headers(data, from_trailer)  # validates first: limits, grammar
        if not from_trailer:
            values = [line[len(_KEY_FIELD):] for line in data.split(b"\r\n")
                      if line[:len(_KEY_FIELD)].lower() == _KEY_FIELD]
            if values:
                self.raw_idempotency_key = b",".join(v[1:] if v[:1] == b" " else v for v in values)
        return headers


class ConnectorConn(TConn):
    """A connection whose HTTP/1.1 requests are ConnectorRequests."""

    def init(self):
        super().init()
        if type(self.parser) is RequestParser:
            self.parser.mesg_class = ConnectorRequest


class ConnectorWorker(ThreadWorker):
    """`gthread` with catalog refusals, the body limit and the raw Idempotency-Key (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._current = threading.local()

    def load_wsgi(self):
        from django.conf import settings

        super().load_wsgi()  # sets Django up
        self.wsgi = partial(self._with_raw_key, self.wsgi)
        # Read once at boot: a refusal then imports and builds nothing.
        self.body_limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        self.answers = catalog_answers()

    def _with_raw_key(self, app, environ, start_response):
        raw = getattr(self._current, "raw_idempotency_key", None)
        if raw is not None:
            environ[RAW_IDEMPOTENCY_KEY] = raw
        return app(environ, start_response)

    def accept(self, listener):
        # gthread's accept (gunicorn 27), creating a ConnectorConn.
        try:
            client_sock, client_addr = listener.accept()
            self.nr_conns += 1
            client_sock.setblocking(True)
            self.enqueue_req(ConnectorConn(self.cfg, client_sock, client_addr, listener.getsockname()))
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise

    def handle_request(self, req, conn):
        code = body_refusal_code(req, self.body_limit)
        if code is not None:
            addr = conn.client if isinstance(conn.client, tuple) else ("", -1)
            self.log.warning("Refused request from ip=%s: %s %s (%s)", addr[0], req.method, req.path, code)
            self._answer(req, conn.sock, addr, code)
            return False  # no keep-alive: finish_request closes the connection (bounded linger)
        self._current.raw_idempotency_key = getattr(req, "raw_idempotency_key", None)
        try:
            return super().handle_request(req, conn)
        finally:
            self._current.raw_idempotency_key = None

    def handle_error(self, req, client, addr, exc):
        addr = addr or ("", -1)  # unix socket
        code = refusal_code(exc)
        if code == "INTERNAL_ERROR":
            self.log.exception("Error handling request %s", getattr(req, "uri", "(no URI read)"))
        else:
            self.log.warning("Invalid request from ip=%s: %s (%s)", addr[0], exc, code)
        if req is None and isinstance(getattr(exc, "req", None), Request):  # a head that failed on a header
            req = exc.req
        self._answer(req, client, addr, code)

    def _answer(self, req, sock, addr, code: str) -> None:
        status_line, answer = self.answers[code]
        try:
            util.write_nonblock(sock, answer)
        except Exception:
            self.log.debug("Failed to send the refusal %s.", code)
        if req is not None and req.version is not None:  # the access log line, as gunicorn's handle_error writes
            environ = default_environ(req, sock, self.cfg)
            environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = addr[0], str(addr[1])
            resp = Response(req, sock, self.cfg)
            resp.status = status_line
            resp.response_length = resp.sent = len(answer)
            self.log.access(resp, req, environ, timedelta(0))
