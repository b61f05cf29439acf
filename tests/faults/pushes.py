"""Signed deliveries of the demo webhook (`records.webhook`) over HTTP to `make run`'s web process, and polling, for
the fault tests that push records to the demo CRM."""
from __future__ import annotations

import json
import time

import httpx


def wait_for(predicate, timeout: float, what: str):
    """Poll `predicate` until it answers something true (returned), or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def post(product, account: str, key: str, record: str, sequence: int) -> None:
    """One signed delivery with one `record.updated` event of `record` at position `sequence` (name v<sequence>)."""
    from connector.models import CredentialGeneration
    from connector.secrets import secret_backend
    from connector.services.signatures import sign

    body = json.dumps({"events": [{"id": f"{record}-{sequence}", "type": "record.updated", "record_id": record,
                                   "sequence": sequence, "occurred_at": "2026-12-07T12:00:00Z",
                                   "data": {"name": f"v{sequence}", "email": f"{record}@example.com"}}]}).encode()
    secret = secret_backend().read(CredentialGeneration.objects.get(
        generation_id=f"{account}.webhook-signing.g1").secret_version_ref)
    response = httpx.post(f"{product['url']}/api/v2/accounts/{account}/channels/records.webhook/receipts",
                          content=body, headers={"Idempotency-Key": key, "Content-Type": "application/json",
                                                 "Connector-Signature": sign(secret, int(time.time()), body)},
                          timeout=30)
    assert response.status_code == 201, response.text
