"""The sole egress adapter: the only module that performs provider I/O (a test proves no other module imports an
HTTP client). It sends only for a `granted` permit it wins in its own committed `granted -> sending`
compare-and-swap, after re-locking the exact credential dispatch gate and checking the permit, holder and fences;
every other caller is refused before any byte leaves (CV2-10-036..039, CV2-04-008)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from connector import locks as connector_locks
from connector.faults import fault_point
from connector.secrets import secret_backend
from effects import locks
from effects.choices import AttemptOutcome, HolderState, PermitState
from effects.errors import EgressRefused
from effects.models import DispatchPermit
from effects.services.dispatch import permit_settle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SendResult:
    outcome: str
    status: int | None
    remote_id: str
    evidence: str


_CLIENTS: dict[int, httpx.Client] = {}


def _client() -> httpx.Client:
    """One pooled client per process (building one per call costs ~38 ms of CPU for its SSL context); a forked
    worker builds its own."""
    pid = os.getpid()
    client = _CLIENTS.get(pid)
    if client is None:
        client = _CLIENTS[pid] = httpx.Client()
    return client


def _win_sending(*, permit_pk: int, holder_id: str, holder_fence: int, credential_gate_fence: int) -> DispatchPermit:
    permit = DispatchPermit.objects.select_related("credential_gate").get(pk=permit_pk)
    with transaction.atomic():
        credential_gate = connector_locks.credential_gate_for_share(permit.credential_gate.credential_generation_id)
        permit = locks.permit_for_update(permit_pk)
        holder = locks.holder_for_share(permit.holder_id)
        if permit.state != PermitState.GRANTED:
            raise EgressRefused(f"permit is {permit.state}; only the one caller that wins granted -> sending sends")
        if holder.holder_id != holder_id or permit.holder_fence != holder_fence:
            raise EgressRefused("the permit belongs to another holder or fence")
        if holder.state != HolderState.RUNNING:
            raise EgressRefused(f"holder generation {holder_id} is terminated; its egress is revoked")
        if credential_gate.mode != "enabled" or credential_gate.fence != credential_gate_fence \
                or credential_gate.fence != permit.credential_gate_fence:
            raise EgressRefused(f"credential dispatch gate is {credential_gate.mode} at fence {credential_gate.fence}")
        permit.start_sending(at=timezone.now())
        permit.save()
    return permit


def _classify(response: httpx.Response) -> SendResult:
    body_digest = hashlib.sha256(response.content).hexdigest()
    if 200 <= response.status_code < 300:
        try:
            remote_id = str(json.loads(response.content or b"{}").get("id", ""))
        except ValueError:
            remote_id = ""
        return SendResult(AttemptOutcome.REMOTE_CONFIRMED, response.status_code, remote_id, f"body sha256 {body_digest}")
    if response.status_code in (400, 404, 409, 422):
        # The receiver contract: these answers mean the request was refused before any change.
        return SendResult(AttemptOutcome.NO_EFFECT, response.status_code, "", f"refused, body sha256 {body_digest}")
    return SendResult(AttemptOutcome.UNCERTAIN, response.status_code, "", f"status {response.status_code}")


def send(*, permit_pk: int, holder_id: str, holder_fence: int, credential_gate_fence: int,
         base_url: str | None = None):
    """Win `granted -> sending` (committed), then make the one HTTP call and settle the permit with the answer or
    the ambiguity. Returns the settled RemoteEffect."""
    permit = _win_sending(permit_pk=permit_pk, holder_id=holder_id, holder_fence=holder_fence,
                          credential_gate_fence=credential_gate_fence)
    fault_point("egress.after_sending")
    command = permit.effect.command
    try:
        secret = secret_backend().read(command.credential_generation.secret_version_ref).decode()
    except Exception as exc:  # noqa: BLE001 - no byte was sent: the request never left
        return permit_settle(permit_pk=permit.pk, outcome=AttemptOutcome.NO_EFFECT, response_status=None,
                             response_digest=None, remote_id="",
                             evidence=f"frozen secret version unreadable, nothing sent: {exc}")
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    if command.provider_idempotency_key:
        headers["Idempotency-Key"] = command.provider_idempotency_key
    timeout = httpx.Timeout(connect=2.0, read=float(settings.CONNECTOR.get("EGRESS_TIMEOUT_SECONDS", 5)),
                            write=5.0, pool=2.0)
    url = (base_url or settings.CONNECTOR["EGRESS_BASE_URL"]).rstrip("/") + command.path
    try:
        response = _client().request(command.method, url, content=bytes(command.request_body), headers=headers,
                                     timeout=timeout)
        result = _classify(response)
        digest = hashlib.sha256(response.content).digest()
    except httpx.ConnectError as exc:
        # The connection was never established: no request bytes reached the receiver.
        result, digest = SendResult(AttemptOutcome.NO_EFFECT, None, "", f"connect failed: {exc}"), None
    except httpx.HTTPError as exc:
        result, digest = SendResult(AttemptOutcome.UNCERTAIN, None, "", f"{type(exc).__name__}: {exc}"), None
    fault_point("egress.after_request")
    log.info("egress settled", extra={"permit": permit.pk, "outcome": result.outcome, "status": result.status})
    return permit_settle(permit_pk=permit.pk, outcome=result.outcome, response_status=result.status,
                         response_digest=digest, remote_id=result.remote_id, evidence=result.evidence)
