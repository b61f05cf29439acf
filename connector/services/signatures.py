"""Transport authentication: HMAC-SHA256 over `<t>.` + the exact body, keyed by the account's exact credential
generation for the route's inbound CredentialRef, selected through the active epoch's frozen configuration
(never a mutable credential name or a newer secret). Header: `Connector-Signature: t=<unix>,v1=<hex>`."""
from __future__ import annotations

import hashlib
import hmac
import time
from functools import lru_cache

from django.conf import settings

from connector.errors import ConnectorError
from connector.models import AccountServingGate, ServiceConfigurationCredentialMapping, ServingEpochBindingProof
from connector.secrets import secret_backend


class SigningCredentialUnavailable(ConnectorError):
    """The account's exact signing credential cannot be read right now (server side); retry later."""

    code = "SIGNING_CREDENTIAL_UNAVAILABLE"
    http_status = 503
    retryable = True
    operator_action = "Check the secret backend for the exact signing credential version of the active epoch."


class SignatureInvalid(ConnectorError):
    """The Connector-Signature header is missing, malformed, outside the time tolerance, or does not match."""

    code = "SIGNATURE_INVALID"
    http_status = 401
    operator_action = "Sign `<t>.<body>` with the account's current signing credential generation."


def parse_header(header: str | None) -> tuple[int, bytes]:
    if not header:
        raise SignatureInvalid("Connector-Signature header is missing")
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    try:
        return int(parts["t"]), bytes.fromhex(parts["v1"])
    except (KeyError, ValueError) as exc:
        raise SignatureInvalid("Connector-Signature must be t=<unix>,v1=<hex>") from exc


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret, f"{timestamp}.".encode() + bytes(body), hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


@lru_cache(maxsize=1024)
def _signing_ref(epoch_digest: bytes, epoch_pk: int, account_id: int, channel: str) -> str | None:
    """The secret version reference of the signing credential generation an exact epoch binds for an account's
    channel. Cached by the epoch's exact identity (STYLE R30): the binding proof, the configuration's credential
    mapping and the credential generation are immutable rows (migration 0002), so an entry never goes stale; a
    new epoch is a new key. The secret itself is read from the backend on every call."""
    proof = (ServingEpochBindingProof.objects.select_related("binding", "epoch").defer("epoch__preimage")
             .filter(epoch_id=epoch_pk, epoch__digest=epoch_digest, binding__kind="inbound_route",
                     binding__business_key=channel).first())
    if proof is None or not proof.binding.credential_refs:
        return None
    mapping = (ServiceConfigurationCredentialMapping.objects.select_related("credential_generation")
               .filter(generation_id=proof.epoch.configuration_id, account_id=account_id,
                       credential_ref=proof.binding.credential_refs[0]).first())
    return None if mapping is None else mapping.credential_generation.secret_version_ref


def signing_secret(*, account_id: int, channel: str, epoch_pk: int | None = None,
                   epoch_digest: bytes | None = None) -> bytes | None:
    """The exact secret of the account's signing credential generation for this channel in the active epoch (the
    epoch the gate names now, or the exact `epoch_pk` + `epoch_digest` the caller just read from the gate)."""
    if epoch_pk is None or epoch_digest is None:
        gate = AccountServingGate.objects.filter(account_id=account_id).values("epoch_id", "epoch_digest").first()
        if not gate or gate["epoch_id"] is None or gate["epoch_digest"] is None:
            return None
        epoch_pk, epoch_digest = gate["epoch_id"], gate["epoch_digest"]
    ref = _signing_ref(bytes(epoch_digest), epoch_pk, account_id, channel)
    if ref is None:
        return None
    try:
        return secret_backend().read(ref)
    except ConnectorError as exc:
        raise SigningCredentialUnavailable("the signing credential of the active epoch is unavailable") from exc


def signature_verify(*, account_id: int, channel: str, header: str | None, body: bytes,
                     now: float | None = None, epoch_pk: int | None = None, epoch_digest: bytes | None = None) -> None:
    timestamp, given = parse_header(header)
    tolerance = int(settings.CONNECTOR.get("SIGNATURE_TOLERANCE_SECONDS", 300))
    if abs((now if now is not None else time.time()) - timestamp) > tolerance:
        raise SignatureInvalid(f"signature timestamp is outside the {tolerance}s tolerance")
    secret = signing_secret(account_id=account_id, channel=channel, epoch_pk=epoch_pk, epoch_digest=epoch_digest)
    if secret is None:
        raise SignatureInvalid("no signing credential for this account and channel in the active epoch")
    expected = hmac.new(secret, f"{timestamp}.".encode() + bytes(body), hashlib.sha256).digest()
    if not hmac.compare_digest(expected, given):
        raise SignatureInvalid("signature does not match")
