"""The load generator of `manage.py bench burst` (bench/burst.py): threads posting signed deliveries
to the admission API. It lives outside the product packages on purpose: only effects/egress.py may import an HTTP
client there (tests/effects/test_egress_isolation.py)."""
from __future__ import annotations

import queue
import threading
import time

import httpx

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

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while True:
                try:
                    n = todo.get_nowait()
                except queue.Empty:
                    return
                body = bodies[n]
                headers = {"Idempotency-Key": f"{key_prefix}{n}", "Content-Type": "application/json",
                           "Connector-Signature": sign(secret, int(time.time()), body)}
                try:
                    status = http.post(url, content=body, headers=headers).status_code
                except httpx.HTTPError as exc:
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                with lock:
                    answers.append((time.time(), status))

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
