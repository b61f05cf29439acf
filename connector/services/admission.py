"""Transport admission: the ReceiptAdmissionKey and Receipt in one guarded transaction, then materialization of
the Receipt's children (connector.services.materialize) in a second one, so a crash between them leaves a
durable Receipt whose missing children the sweeper materializes (CV2-05-016/017)."""
from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from connector.actors import Actor
from connector import logcontext, tracing
from connector.canonical.identity import IdentityRejected, canonical_identity
from connector.choices import EpochState, ReceiptKind
from connector.errors import ConnectorError
from connector.faults import fault_point
from connector.models import (ConnectorAccount, MaterializationDue, Receipt, ReceiptAdmissionKey, ReceiptTrace,
                              ServingEpoch)
from connector.selectors.routes import route_for
from connector.services import storable
from connector.services.guard import lock_serving

log = logging.getLogger(__name__)


class NoncanonicalKey(ConnectorError):
    """The transport idempotency key is empty, padded, not UTF-8 or otherwise non-canonical."""

    code = "NONCANONICAL_KEY"
    http_status = 400
    operator_action = "Send the exact canonical key bytes; the service never trims."


class AccountNotFound(ConnectorError):
    """No connector account has that exact key."""

    code = "ACCOUNT_NOT_FOUND"
    http_status = 404


class ReceiptDigestMismatch(ConnectorError):
    """This idempotency key was accepted with different bytes; nothing was written."""

    code = "RECEIPT_DIGEST_MISMATCH"
    http_status = 409
    operator_action = "Use a new idempotency key for different content."


@dataclass(frozen=True)
class Admission:
    outcome: str  # "created" | "duplicate" | "v1_accepted"
    receipt: Receipt | None
    key: ReceiptAdmissionKey


def canonical_key(raw: str | bytes | None) -> str:
    try:
        return canonical_identity(raw, field="Idempotency-Key")
    except IdentityRejected as exc:
        raise NoncanonicalKey(f"Idempotency-Key rejected: {exc.code}", reason=exc.code) from exc


def account_get(account_key: str) -> ConnectorAccount:
    account = ConnectorAccount.objects.filter(account_key=account_key).first()
    if account is None:
        raise AccountNotFound(f"no account {account_key!r}")
    return account


def _existing(account: ConnectorAccount, channel: str, key: str, digest: bytes) -> Admission | None:
    """Load and byte-compare an existing key (V2 Receipt or V1 tombstone)."""
    row = (ReceiptAdmissionKey.objects.select_related("receipt", "tombstone", "receipt__epoch")
           .defer("receipt__epoch__preimage").filter(account=account, channel=channel, transport_key=key).first())
    if row is None:
        return None
    held = row.receipt.payload_digest if row.receipt_id else row.tombstone.payload_digest
    if not hmac.compare_digest(bytes(held), digest):
        raise ReceiptDigestMismatch(f"key {key!r} was accepted with different bytes"
                                    + (" by V1" if row.tombstone_id else ""))
    return Admission("duplicate" if row.receipt_id else "v1_accepted", row.receipt, row)


def receipt_admit(*, account_key: str, channel: str, transport_key: str | bytes | None, body: bytes,
                  actor: Actor) -> Admission:
    """Admit one transport delivery exactly once.

    Validates the key, resolves a duplicate (same bytes: the original Receipt and epoch; a V1 tombstone: already
    accepted, no descendant; different bytes: RECEIPT_DIGEST_MISMATCH) before any lock. Otherwise, in one
    transaction: the serving guard (gate `v2_serving`, exact active epoch), the route from the frozen epoch, a
    whole-body parse and the check that every extracted value fits every column that stores it and every
    outbound use (`storable.events_check`; BODY_UNPARSEABLE refuses everything), then the Receipt and its key.
    Concurrent submissions of one key race on the key's unique constraint; losers resolve as duplicates or
    mismatches. Children are materialized afterwards by `receipt_materialize`."""
    key = canonical_key(transport_key)
    account = account_get(account_key)
    logcontext.note(account_id=account.pk)
    body = bytes(body)
    digest = hashlib.sha256(body).digest()
    found = _existing(account, channel, key, digest)
    if found is not None:
        return found
    try:
        with transaction.atomic():
            ctx = lock_serving(account_id=account.pk)
            route = route_for(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, account_id=account.pk,
                              channel=channel)
            events = route.parse(body)
            storable.events_check(events=events, route=route, epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest)
            receipt = Receipt.objects.create(
                account=account, epoch_id=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, gate_fence=ctx.fence,
                kind=ReceiptKind.TRANSPORT, channel=channel, payload=body, payload_digest=digest,
                component_count=len(events))
            admission_key = ReceiptAdmissionKey.objects.create(account=account, channel=channel, transport_key=key,
                                                               receipt=receipt)
            MaterializationDue.objects.create(receipt=receipt)
            tracing.remember(ReceiptTrace, receipt.pk)  # issue 21: the trace continues from this durable row
            # The answer names the receipt's epoch: bind the exact one the guard locked (and found `active`), as
            # the ORM would load it with .only() (its other columns, the preimage among them, stay deferred).
            receipt.epoch = ServingEpoch.from_db(receipt._state.db, ["id", "epoch_id", "digest", "state"],
                                                 [ctx.epoch_pk, ctx.epoch_id, ctx.epoch_digest, EpochState.ACTIVE])
    except IntegrityError as exc:
        name = getattr(getattr(exc.__cause__, "diag", None), "constraint_name", "")
        if name != "connector_admissionkey_unique_key":
            raise
        found = _existing(account, channel, key, digest)  # lost the race: the winner committed
        if found is None:  # pragma: no cover - the unique violation proves a committed row
            raise
        return found
    fault_point("admission.after_receipt_commit")
    logcontext.note(receipt_id=receipt.pk)
    log.info("receipt admitted", extra={"receipt": receipt.pk, "account": account.account_key,
                                        "components": receipt.component_count, "epoch": ctx.epoch_id})
    return Admission("created", receipt, admission_key)
