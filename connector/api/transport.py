"""What the web server hands the API besides PEP 3333's environ: the exact bytes of the `Idempotency-Key` header.

HTTP servers strip the optional whitespace around a header value before the application sees it, so `" k1 "`
would arrive as `k1` and be accepted, although a padded key is refused, never trimmed (docs/api.md). The
production web server (config/webserver.py, decision D-160) keeps the value as received and passes it under
`RAW_IDEMPOTENCY_KEY`, an environ key no client can set: client headers only reach the environ as `HTTP_*`
(and `CONTENT_TYPE` / `CONTENT_LENGTH`). Standard library only: the gunicorn worker imports this module before
Django is set up."""
from __future__ import annotations

from collections.abc import Mapping

#: environ key under which config/webserver.py passes the raw Idempotency-Key value (bytes).
RAW_IDEMPOTENCY_KEY = "connector.raw_idempotency_key"


def idempotency_key_from(meta: Mapping[str, object]) -> bytes | str | None:
    """The Idempotency-Key as the client sent it: the server's raw bytes when it passed them, otherwise the
    header's original bytes restored from the latin-1 text PEP 3333 servers hand over (a server that strips the
    value's edges, such as runserver, loses a padding here). A value that is not latin-1 text did not come from a
    server (a test client passing text) and is validated as text."""
    raw = meta.get(RAW_IDEMPOTENCY_KEY)
    if isinstance(raw, bytes):
        return raw
    value = meta.get("HTTP_IDEMPOTENCY_KEY")
    if value is None:
        return None
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value
