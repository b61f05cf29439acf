"""The production web server's worker: gunicorn's threaded worker, answering its own refusals like the API.

Loaded by config/gunicorn.py (`worker_class`). Four things differ from `gthread` (decisions D-160, D-161, D-164, D-412):

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
- **A slow client holds no thread** (issue 37 item 6, D-412): the worker's main loop reads each request's head, and
  a body framed by a `Content-Length` within the limit, without blocking, and hands the connection to a thread only
  once they are all here. The head must arrive within `header_timeout` seconds of the connection's accept (on a
  kept-alive connection: of the next request's first byte), the body within `body_timeout` seconds of the head's
  end; otherwise the connection is closed without an answer. At most `worker_connections` connections per worker are
  open at once (gthread stops accepting above it); the rest wait in the listen backlog. gthread alone gave a thread
  to each connection from its first byte to its head's end, with no deadline, so 12 trickling sockets held every
  thread of 3 workers.
"""
from __future__ import annotations

import errno
import json
import selectors
import ssl
import threading
import time
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

from config.env import env_int
from connector.api.exceptions import API_ERROR_CODES
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
    """A connection whose HTTP/1.1 requests are ConnectorRequests, with the bytes the worker's main loop read for
    the next request (`inbox`) handed to the parser when a thread takes the connection."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.inbox = bytearray()
        self.deadline = 0.0  # monotonic: close it if the request is not all here by then
        self.head_end: int | None = None  # index just past the head's blank line, once it arrived
        self.needed = 0  # bytes of head and body to wait for before a thread takes it

    def init(self):
        super().init()  # creates the parser once; later calls (keep-alive) keep it
        if type(self.parser) is RequestParser:
            self.parser.mesg_class = ConnectorRequest
        if self.inbox:
            self.parser.unreader.unread(bytes(self.inbox))
            self.inbox = bytearray()


def declared_length(head: bytes) -> int | None:
    """The body length a request head declares by exactly one valid `Content-Length` and no `Transfer-Encoding`;
    None otherwise (no body, or a framing the request thread refuses without reading the body)."""
    lengths = []
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            lengths.append(value.strip())
    if len(lengths) != 1 or not lengths[0].isdigit():
        return None
    return int(lengths[0])


def bytes_needed(buffer: bytes | bytearray, *, head_limit: int, line_limit: int, body_limit: int) -> tuple[
        int | None, int]:
    """(head_end, needed) of a request's first bytes: head_end None while the head is incomplete (needed: its
    limit, past which the parser refuses it); else the head and the body it declares, when within `body_limit`
    (a larger or unframed one is refused by the thread before any of it is read)."""
    end = buffer.find(b"\r\n\r\n", 0, head_limit + 4)
    if end < 0:
        line_end = buffer.find(b"\r\n", 0, line_limit + 2)
        if line_end < 0 and len(buffer) > line_limit + 2:
            return None, 0  # the request line is already over its limit: let the parser refuse it now
        return None, head_limit + 4
    head_end = end + 4
    length = declared_length(bytes(buffer[:end]))
    return head_end, head_end + (length if length is not None and length <= body_limit else 0)


class ConnectorWorker(ThreadWorker):
    """`gthread` with catalog refusals, the body limit and the raw Idempotency-Key (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._current = threading.local()
        self.reading: set[ConnectorConn] = set()  # connections whose request the main loop is reading
        self.header_timeout = float(env_int("WEB_HEADER_TIMEOUT", 10))
        self.body_timeout = float(env_int("WEB_BODY_TIMEOUT", 30))
        # the largest head the parser accepts: the request line and every field at their limits
        self.head_limit = (self.cfg.limit_request_line + 2
                           + self.cfg.limit_request_fields * (self.cfg.limit_request_field_size + 2))

    def load_wsgi(self):
        from django.conf import settings

        super().load_wsgi()  # sets Django up
        self.wsgi = partial(self._with_raw_key, self.wsgi)
        # Read once at boot: a refusal then imports and builds nothing.
        self.body_limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        # a body up to this size is read by the main loop before a thread takes the request
        self.buffered_body_limit = self.body_limit if self.body_limit is not None else 2_621_440
        self.answers = catalog_answers()

    def _with_raw_key(self, app, environ, start_response):
        raw = getattr(self._current, "raw_idempotency_key", None)
        if raw is not None:
            environ[RAW_IDEMPOTENCY_KEY] = raw
        return app(environ, start_response)

    def accept(self, listener):
        # gthread's accept (gunicorn 27), creating a ConnectorConn that the main loop reads until its request is here.
        try:
            client_sock, client_addr = listener.accept()
            self.nr_conns += 1
            client_sock.setblocking(True)
            conn = ConnectorConn(self.cfg, client_sock, client_addr, listener.getsockname())
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        if self.cfg.is_ssl:  # TLS ends at the reverse proxy (config/gunicorn.py); if not, gthread's own way
            self.enqueue_req(conn)
            return
        self._await_request(conn, self.header_timeout)

    # -- reading requests in the main loop (D-412) --------------------------------------------------------------
    def _await_request(self, conn, timeout: float) -> None:
        """Watch `conn` in the main loop until its request is here (or `timeout` seconds pass without it)."""
        conn.deadline = time.monotonic() + timeout
        conn.head_end, conn.needed = None, 0
        conn.sock.setblocking(False)
        self.reading.add(conn)
        if conn.inbox and self._complete(conn):
            return
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_request_bytes, conn))

    def _on_request_bytes(self, conn, sock) -> None:
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away before its request was complete
            self._forget(conn)
            return
        conn.inbox += data
        if self._complete(conn):
            self.poller.unregister(sock)

    def _complete(self, conn) -> bool:
        """Hand `conn` to a thread when its head and declared body are all here; True when it was."""
        if conn.head_end is None:
            conn.head_end, conn.needed = bytes_needed(conn.inbox, head_limit=self.head_limit,
                                                      line_limit=self.cfg.limit_request_line,
                                                      body_limit=self.buffered_body_limit)
            if conn.head_end is not None and conn.needed > conn.head_end:
                conn.deadline = time.monotonic() + self.body_timeout
        if conn.needed and len(conn.inbox) < conn.needed:
            return False
        self.reading.discard(conn)
        conn.data_ready = True  # gthread's handle() must not wait for data again
        self.enqueue_req(conn)
        return True

    def _forget(self, conn, why: str = "") -> None:
        self.reading.discard(conn)
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        self.nr_conns -= 1
        if why:
            addr = conn.client[0] if isinstance(conn.client, tuple) else ""
            self.log.info("Closed the connection from ip=%s: %s", addr, why)
        conn.close()

    def murder_pending(self):
        """gthread's expiry of deferred connections, and of connections whose request did not arrive in time."""
        super().murder_pending()
        now = time.monotonic()
        for conn in [c for c in self.reading if c.deadline <= now]:
            if not conn.inbox:
                why = ""  # a connection that never sent a byte closes quietly, like an idle kept-alive one
            elif conn.head_end is None:
                why = f"no complete request head within {self.header_timeout:g} s"
            else:
                why = f"the body did not arrive within {self.body_timeout:g} s of the head"
            self._forget(conn, why)

    def on_client_socket_readable(self, conn, client):
        """A kept-alive connection's next request begins: read it in the main loop too."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        if self.cfg.is_ssl:
            self.enqueue_req(conn)
            return
        self._await_request(conn, self.header_timeout)
        self._on_request_bytes(conn, client)

    def finish_request(self, conn, fs):
        """Bytes of a next request read ahead with this one's body go back to the main loop, not straight to a
        thread that would block on the rest of them (gthread enqueues such a connection at once)."""
        try:
            keep = fs.result() if not fs.cancelled() else False
        except Exception:  # noqa: BLE001 - gthread's finish_request closes it
            keep = False
        if keep and self.alive and not self.cfg.is_ssl and conn.parser is not None \
                and conn.parser.unreader.buf.getvalue():
            conn.inbox = bytearray(conn.parser.unreader.take_buffered())
            conn.data_ready = False
            self._await_request(conn, self.header_timeout)
            return
        super().finish_request(conn, fs)

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
