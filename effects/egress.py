"""The sole egress adapter: the only module that performs provider I/O (a test proves no other module imports an
HTTP client). A permit's exchange is made only after it won its own committed `granted -> sending`
compare-and-swap (`effects.egress_batch.win_sending_batch`), which re-locks the exact credential dispatch gate and
checks the permit, holder and fences (`sending_refusal`); every other caller is refused before any byte leaves
(CV2-10-036..039, CV2-04-008)."""
from __future__ import annotations

import contextlib
import email.utils
import hashlib
import json
import logging
import os
import ssl
import tempfile
import time
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.utils import timezone

from connector import stage_metrics, tracing
from connector.errors import ConnectorError
from connector.faults import fault_point
from connector.interpreters import callout as callout_paths
from connector.services.secrets import read_secret
from effects.choices import AttemptOutcome, HolderState, PermitState
from effects.delivery.protocol import Answer, read_poll, read_submit
from effects.errors import EgressRefused
from effects.models import DeliveryOperation, DispatchPermit
from effects.services.delivery import execution
from effects.services.delivery.setup import current_secret_ref
from effects.services.outbound import frozen_path_template

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SendResult:
    outcome: str
    status: int | None
    remote_id: str
    evidence: str
    defer_seconds: float | None = None


DEFER_WITHOUT_RETRY_AFTER = 1.0


def _defer_seconds(response: httpx.Response) -> float | None:
    """How long the receiver asks its destination to be left alone: `Retry-After` (delta-seconds or an HTTP-date)
    on any answer, or DEFER_WITHOUT_RETRY_AFTER for a bare `429`; capped at CONNECTOR["RATE_LIMIT_MAX_DEFER_SECONDS"]
    (default 300) so a hostile or broken header cannot park a destination for ever (D-223). None: no deferral."""
    value = response.headers.get("Retry-After")
    seconds = None
    if value is not None:
        value = value.strip()
        if value.isdigit():
            seconds = float(int(value))
        else:
            try:
                seconds = (email.utils.parsedate_to_datetime(value) - timezone.now()).total_seconds()
            except (TypeError, ValueError, OverflowError):
                seconds = None
    if seconds is None and response.status_code == 429:
        seconds = DEFER_WITHOUT_RETRY_AFTER
    if seconds is None:
        return None
    cap = float(settings.CONNECTOR.get("RATE_LIMIT_MAX_DEFER_SECONDS", 300))
    return min(max(seconds, 0.0), cap)


_CLIENTS: dict[int, httpx.Client] = {}
_TLS_CLIENTS: dict[tuple[int, bytes], httpx.Client] = {}
TLS_CLIENTS_MAX = 64


def _client() -> httpx.Client:
    """One pooled client per process (building one per call costs ~38 ms of CPU for its SSL context); a forked
    worker builds its own."""
    pid = os.getpid()
    client = _CLIENTS.get(pid)
    if client is None:
        client = _CLIENTS[pid] = httpx.Client()
    return client


def _tls_client(ca_file: str | None, client_pem: str | None) -> httpx.Client:
    """One pooled client per process and per TLS configuration: the CA bundle a binding's TLS policy names and, for
    mTLS, the client identity. Keyed by a digest of both (issue 20, decision D-221): building an SSL context costs
    80-166 ms under load, and a kept client reuses its keep-alive connections to the destination. The identity's
    PEM is written to a private 0600 file only while the context loads it, then removed; it stays only in this
    process's memory, never on disk or in the database. At most TLS_CLIENTS_MAX configurations are kept; the
    oldest is closed when another arrives (a rotated credential gets a new digest, so its old client ages out)."""
    key = (os.getpid(), hashlib.sha256(repr((ca_file, client_pem)).encode()).digest())
    client = _TLS_CLIENTS.get(key)
    if client is not None:
        return client
    context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    if client_pem is not None:
        with tempfile.TemporaryDirectory(prefix="mtls-") as folder:
            pem = os.path.join(folder, "client.pem")
            fd = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(client_pem)
            context.load_cert_chain(pem)
    while len(_TLS_CLIENTS) >= TLS_CLIENTS_MAX:
        _TLS_CLIENTS.pop(next(iter(_TLS_CLIENTS))).close()
    client = _TLS_CLIENTS[key] = httpx.Client(verify=context)
    return client


def sending_refusal(*, permit: DispatchPermit, holder, credential_gate, holder_id: str, holder_fence: int,
                    credential_gate_fence: int) -> str | None:
    """Why the locked permit may not move `granted -> sending` for this caller (None: it may): the checks of the
    sending marker (`effects.egress_batch.win_sending_batch`)."""
    if permit.state != PermitState.GRANTED:
        return f"permit is {permit.state}; only the one caller that wins granted -> sending sends"
    if holder.holder_id != holder_id or permit.holder_fence != holder_fence:
        return "the permit belongs to another holder or fence"
    if holder.state != HolderState.RUNNING:
        return f"holder generation {holder_id} is terminated; its egress is revoked"
    if credential_gate.mode != "enabled" or credential_gate.fence != credential_gate_fence \
            or credential_gate.fence != permit.credential_gate_fence:
        return f"credential dispatch gate is {credential_gate.mode} at fence {credential_gate.fence}"
    return None


def _path_refusal(command) -> tuple[str, bool] | None:
    """None when the frozen path has exactly the shape of its callout's frozen path template; else (evidence,
    final). Final: the path is outside its template, or the template itself is invalid, so no attempt of these
    frozen bytes can ever be sent. Not final: the template could not be read right now (retryable)."""
    try:
        template = frozen_path_template(command)
    except ConnectorError as exc:
        if exc.retryable:
            return f"{exc.code}, nothing sent: the callout template could not be read: {exc.detail}", False
        return f"OUTBOUND_PATH_UNSAFE, nothing sent: {exc.code}: {exc.detail}", True
    reason = callout_paths.path_fits_template(template, command.path)
    return (f"OUTBOUND_PATH_UNSAFE, nothing sent: {reason}", True) if reason else None


def _classify(response: httpx.Response) -> SendResult:
    body_digest = hashlib.sha256(response.content).hexdigest()
    defer = _defer_seconds(response)
    if 200 <= response.status_code < 300:
        try:
            remote_id = str(json.loads(response.content or b"{}").get("id", ""))
        except ValueError:
            remote_id = ""
        return SendResult(AttemptOutcome.REMOTE_CONFIRMED, response.status_code, remote_id, f"body sha256 {body_digest}",
                          defer)
    if response.status_code in (400, 404, 409, 422, 429):
        # The receiver contract: these answers mean the request was refused before any change (429: refused by the
        # receiver's rate limit, D-224).
        return SendResult(AttemptOutcome.NO_EFFECT, response.status_code, "", f"refused, body sha256 {body_digest}",
                          defer)
    return SendResult(AttemptOutcome.UNCERTAIN, response.status_code, "", f"status {response.status_code}", defer)


@dataclass(frozen=True)
class Exchange:
    """What one exchange (or its refusal before any byte) leaves to settle: permit_settle's outcome arguments; the
    answer's label and duration for the egress metric (None: nothing was sent, nothing is counted)."""
    outcome: dict
    answered: str | None = None
    seconds: float = 0.0


def permit_exchange(*, permit_pk: int, command, base_url: str | None) -> Exchange:
    """The one HTTP call of a permit that won `granted -> sending` (committed), or its refusal before any byte."""
    refusal = _path_refusal(command)
    if refusal is not None:
        # The frozen path is outside its callout's template (a row written before D-170, or a changed rule): no
        # byte leaves, and no later attempt can do better, so the effect settles as terminal no_effect.
        evidence, final = refusal
        log.warning("egress refused to send", extra={"permit": permit_pk, "reason": evidence})
        return Exchange({"outcome": AttemptOutcome.NO_EFFECT, "response_status": None, "response_digest": None,
                         "remote_id": "", "final": final, "evidence": evidence[:1000]})
    try:
        secret = read_secret(command.credential_generation.secret_version_ref).decode()
    except Exception as exc:  # noqa: BLE001 - no byte was sent: the request never left
        return Exchange({"outcome": AttemptOutcome.NO_EFFECT, "response_status": None, "response_digest": None,
                         "remote_id": "", "evidence": f"frozen secret version unreadable, nothing sent: {exc}"})
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    if command.provider_idempotency_key:
        headers["Idempotency-Key"] = command.provider_idempotency_key
    tracing.inject(headers)  # issue 21: W3C traceparent of this span to the receiver (nothing while tracing is off)
    timeout = httpx.Timeout(connect=2.0, read=float(settings.CONNECTOR.get("EGRESS_TIMEOUT_SECONDS", 5)),
                            write=5.0, pool=2.0)
    url = (base_url or settings.CONNECTOR["EGRESS_BASE_URL"]).rstrip("/") + command.path
    began = time.perf_counter()
    try:
        response = _client().request(command.method, url, content=bytes(command.request_body), headers=headers,
                                     timeout=timeout)
        result = _classify(response)
        digest = hashlib.sha256(response.content).digest()
        answered = stage_metrics.status(response.status_code)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        # The connection was never established (refused, DNS, TLS handshake, connect timeout) or none was free in
        # the pool: no request byte reached the receiver. The frozen retry schedule decides what follows (D-420).
        result, digest = SendResult(AttemptOutcome.NO_EFFECT, None, "",
                                    f"connect failed: {type(exc).__name__}: {exc}"), None
        answered = "transport_error"
    except httpx.HTTPError as exc:
        result, digest = SendResult(AttemptOutcome.UNCERTAIN, None, "", f"{type(exc).__name__}: {exc}"), None
        answered = "timeout" if isinstance(exc, httpx.TimeoutException) else "transport_error"
    seconds = time.perf_counter() - began
    fault_point("egress.after_request")
    log.info("egress settled", extra={"permit": permit_pk, "outcome": result.outcome, "status": result.status})
    return Exchange({"outcome": result.outcome, "response_status": result.status, "response_digest": digest,
                     "remote_id": result.remote_id, "evidence": result.evidence,
                     "defer_seconds": result.defer_seconds}, answered, seconds)


# -- REST bulk delivery ---------------------------------------------------------------------------------------
# The same rule for the delivery path: an attempt is sent only after `attempt_start_io` committed
# `io_may_have_started` for the operation's current attempt (MAY_ATTEMPT marker, capacity and SUBMITTING already
# committed by the submit transaction); the answer is recorded through the delivery services.

def _tls_ca_file(binding) -> str | None:
    """The binding's TLS policy identity names a CA bundle in settings (CONNECTOR["DELIVERY_TLS_POLICIES"]);
    unknown identities verify against the system store."""
    policies = settings.CONNECTOR.get("DELIVERY_TLS_POLICIES", {})
    return policies.get(binding.tls_policy_identity, {}).get("ca_file") or None


@contextlib.contextmanager
def _delivery_client(binding, secret: str, headers: dict, params: dict):
    """Yield (client, auth) for one delivery exchange, on the process's pooled client for the binding's TLS
    configuration (`_tls_client`). The secret goes only into headers, query parameters (the audited
    api_key_query exception), basic auth, a token request, or the mTLS client identity loaded into the pooled
    client's SSL context; it is never logged or stored."""
    mode, _, parameter = binding.authentication_semantics.partition(":")
    ca_file = _tls_ca_file(binding)
    if mode == "mtls":
        yield _tls_client(ca_file, secret), None
        return
    client = _tls_client(ca_file, None) if ca_file else _client()
    auth = None
    if mode == "bearer":
        headers["Authorization"] = f"Bearer {secret}"
    elif mode == "api_key_header":
        headers[parameter or "X-Api-Key"] = secret
    elif mode == "http_basic":
        user, _, password = secret.partition(":")
        auth = httpx.BasicAuth(user, password)
    elif mode == "api_key_query":
        params[parameter or "api_key"] = secret  # only with the recorded exception; never logged
    elif mode == "oauth2_client_credentials":
        client_id, _, client_secret = secret.partition(":")
        token = client.post(binding.base_url.rstrip("/") + (parameter or "/oauth/token"),
                            data={"grant_type": "client_credentials"}, auth=(client_id, client_secret),
                            timeout=httpx.Timeout(5.0))
        token.raise_for_status()
        headers["Authorization"] = f"Bearer {token.json()['access_token']}"
    else:
        raise EgressRefused(f"authentication mode {mode} is not available")
    yield client, auth


def _delivery_timeout(profile) -> httpx.Timeout:
    policy = profile.policy("timeout_policy", {})
    return httpx.Timeout(connect=float(policy.get("connect_seconds", 2)), read=float(policy.get("read_seconds", 10)),
                         write=float(policy.get("write_seconds", 10)), pool=2.0)


def delivery_send(*, attempt_pk: int):
    """Send one delivery attempt: commit io_may_have_started, then the one request; record what came back."""
    attempt = execution.attempt_start_io(attempt_pk)
    fault_point("delivery.after_io_marked")
    op = attempt.operation
    binding, profile = op.binding, op.profile
    headers = {"Content-Type": "application/json", "Idempotency-Key": bytes(op.receiver_mutation_key).hex()}
    params: dict = {}
    semantics = profile.operation_semantics
    url = binding.base_url.rstrip("/") + semantics["authority_relative_path_semantics"]
    try:
        secret = read_secret(current_secret_ref(binding)).decode()
        with _delivery_client(binding, secret, headers, params) as (client, auth):
            try:
                response = client.request(semantics["method_semantics"], url, content=bytes(op.payload),
                                          headers=headers, params=params or None, auth=auth,
                                          timeout=_delivery_timeout(profile))
                answer = read_submit(response.status_code, response.content, dict(response.headers),
                                     receiver_kind=profile.receiver_kind,
                                     body_sha256=hashlib.sha256(response.content).hexdigest())
            except httpx.ConnectError as exc:
                answer = Answer("not_started", detail=f"connect failed: {type(exc).__name__}")
            except httpx.HTTPError as exc:
                answer = Answer("ambiguous", detail=f"{type(exc).__name__} after the request may have left: {exc}")
    except (httpx.HTTPError, EgressRefused, ConnectorError, OSError, KeyError, ValueError) as exc:
        # Credentials unreadable, token endpoint refused, client certificate unusable: the mutation never left.
        answer = Answer("not_started", detail=f"no usable credentials, nothing sent: {type(exc).__name__}")
    fault_point("delivery.after_request")
    log.info("delivery attempt answered", extra={"attempt": attempt_pk, "transport": answer.transport,
                                                 "ack": answer.acknowledgement, "status": answer.http_status})
    return execution.record_submit_outcome(attempt_pk, answer)


def delivery_poll(*, operation_pk: int):
    """The poll_receipt continuation: one GET of the job receipt (reads only; no mutation is sent)."""
    op = DeliveryOperation.objects.select_related("binding", "profile").get(pk=operation_pk)
    if op.state not in ("accepted", "waiting") or not op.remote_receipt_id:
        return op
    headers: dict = {}
    params: dict = {}
    poll_path = op.profile.operation_semantics["acknowledgement_contract"]["poll_path"]
    url = op.binding.base_url.rstrip("/") + poll_path.rstrip("/") + "/" + op.remote_receipt_id
    try:
        secret = read_secret(current_secret_ref(op.binding)).decode()
        with _delivery_client(op.binding, secret, headers, params) as (client, auth):
            response = client.get(url, headers=headers, params=params or None, auth=auth,
                                  timeout=_delivery_timeout(op.profile))
    except (httpx.HTTPError, EgressRefused, ConnectorError, OSError) as exc:
        log.info("receipt poll failed; will poll again", extra={"operation": operation_pk, "error": str(exc)})
        return op
    answer = read_poll(response.status_code, response.content,
                       body_sha256=hashlib.sha256(response.content).hexdigest())
    return execution.record_poll(operation_pk, answer)
