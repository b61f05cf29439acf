"""The load generator of `manage.py bench burst` (bench/burst.py): threads posting signed deliveries
to the admission API. It lives outside the product packages on purpose: only effects/egress.py may import an HTTP
client there (tests/effects/test_egress_isolation.py).

Each thread holds one keep-alive connection of the standard library's http.client, not httpx: the clients share
the machine's cores with the server they measure, and httpx cost 1.0-1.1 ms of CPU per request on the 2-core
machine against 0.22-0.28 ms for http.client, signing included (D-359, docs/benchmarks.md)."""
from __future__ import annotations

import http.client
import queue
import threading
import time
from urllib.parse import urlsplit

from connector.services.signatures import sign


def post_all(*, url: str, secret: bytes, bodies: list[bytes], clients: int, key_prefix: str) -> dict:
    """`clients` threads post every body once (each thread its own keep-alive connection), with the idempotency
    key `<key_prefix><index>`. Returns the wall-clock times of the first and last 201 and the answers' counts."""
    todo: queue.Queue[int] = queue.Queue()
    for n in range(len(bodies)):
        todo.put(n)
    answers: list[tuple[float, int]] = []
    errors: list[str] = []
    lock = threading.Lock()

    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")

    def client() -> None:
        conn = None
        try:
            while True:
                try:
                    n = todo.get_nowait()
                except queue.Empty:
                    return
                body = bodies[n]
                headers = {"Idempotency-Key": f"{key_prefix}{n}", "Content-Type": "application/json",
                           "Connector-Signature": sign(secret, int(time.time()), body)}
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
                    conn.request("POST", path, body=body, headers=headers)
                    response = conn.getresponse()
                    response.read()
                    status = response.status
                except (OSError, http.client.HTTPException) as exc:
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    if conn is not None:
                        conn.close()
                    conn = None  # the next delivery opens a new connection
                    continue
                with lock:
                    answers.append((time.time(), status))
        finally:
            if conn is not None:
                conn.close()

    began = time.time()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    created = sorted(at for at, status in answers if status == 201)
    statuses: dict[str, int] = {}
    for _, status in answers:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {"began": began, "first_201": created[0] if created else None, "last_201": created[-1] if created else None,
            "accepted": len(created), "statuses": statuses, "transport_errors": errors[:5],
            "transport_error_count": len(errors)}
