"""What the egress adapter reports of one receiver answer, and how the receiver contract reads it (pure).

The receiver contract (both receiver kinds; served for the tests by tests/effects/delivery/receiver.py and for
`make run` by the demo receiver, demo/crm.py):
- sync_batch: `POST <path>` with the sealed body and `Idempotency-Key: <receiver mutation key>`. 200
  `{"status": "succeeded", "applied": n, "payload_sha256": hex}` or `{"status": "failed", "applied": k|null,
  "rolled_back": bool}`. 400/409/422: refused before any change (a failed acknowledgement, rolled back).
  429: rejected by the rate limiter before processing (the request did not start), with `Retry-After`.
- async_bulk_job: `POST <path>` answers 202 `{"job_id": id}`; `GET <poll_path>/<id>` answers
  `{"status": "running"|"succeeded"|"failed"|"cancelled", "applied": n|null}`; 404/410 means the receipt
  expired. Any other answer is PROTOCOL_UNKNOWN.
A connection that was never established proves the request did not start. Anything else without a definite
answer (timeout, reset, 5xx, unparsable body) is ambiguous: the effect may have happened.
"""
from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    transport: str  # not_started | answered | ambiguous
    acknowledgement: str = "NOT_ACCEPTED"  # contract acknowledgement axis value
    http_status: int | None = None
    applied: int | None = None
    rolled_back: bool = False
    payload_sha256: str = ""
    receipt_id: str = ""
    retry_after_seconds: float | None = None
    body_sha256: str = ""
    detail: str = ""


def _json(body: bytes):
    try:
        value = json.loads(body or b"null")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def read_submit(status: int, body: bytes, headers: dict, *, receiver_kind: str, body_sha256: str) -> Answer:
    data = _json(body)
    if status == 429:
        retry_after = headers.get("retry-after")
        try:
            seconds = float(retry_after) if retry_after is not None else None
        except ValueError:
            seconds = None
        return Answer("not_started", http_status=status, retry_after_seconds=seconds, body_sha256=body_sha256,
                      detail="rate limited before processing")
    if status in (400, 409, 422):
        return Answer("answered", "FAILED", http_status=status, applied=0, rolled_back=True,
                      body_sha256=body_sha256, detail="refused before any change")
    if receiver_kind == "async_bulk_job" and status == 202 and data and isinstance(data.get("job_id"), str) \
            and data["job_id"]:
        return Answer("answered", "ACCEPTED", http_status=status, receipt_id=data["job_id"], body_sha256=body_sha256)
    if receiver_kind == "sync_batch" and status == 200 and data and data.get("status") in ("succeeded", "failed"):
        ack = "SUCCEEDED" if data["status"] == "succeeded" else "FAILED"
        return Answer("answered", ack, http_status=status, applied=_count(data.get("applied")),
                      rolled_back=data.get("rolled_back") is True, payload_sha256=str(data.get("payload_sha256", "")),
                      body_sha256=body_sha256)
    return Answer("ambiguous", http_status=status, body_sha256=body_sha256,
                  detail=f"no definite answer (HTTP {status})")


POLL_ACKS = {"running": "RUNNING", "succeeded": "SUCCEEDED", "failed": "FAILED", "cancelled": "CANCELLED"}


def read_poll(status: int, body: bytes, *, body_sha256: str) -> Answer:
    if status in (404, 410):
        return Answer("answered", "EXPIRED", http_status=status, body_sha256=body_sha256, detail="receipt expired")
    data = _json(body)
    if status == 200 and data and data.get("status") in POLL_ACKS:
        return Answer("answered", POLL_ACKS[data["status"]], http_status=status, applied=_count(data.get("applied")),
                      rolled_back=data.get("rolled_back") is True,
                      payload_sha256=str(data.get("payload_sha256", "")), body_sha256=body_sha256)
    return Answer("answered", "PROTOCOL_UNKNOWN", http_status=status, body_sha256=body_sha256,
                  detail=f"unrecognised receipt answer (HTTP {status})")
