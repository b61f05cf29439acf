"""Transport admission: the ReceiptAdmissionKey and Receipt in one guarded transaction, then materialization of
the Receipt's children (connector.services.materialize) in a second one, so a crash between them leaves a
durable Receipt whose missing children the sweeper materializes (CV2-05-016/017).

The hot path (issue 18 goal 1, D-201/D-202): a new receipt is admitted by one statement,
`connector_receipt_admit` (migrations 0016, 0018), which locks in the canonical order, makes every check of the serving
guard and writes the Receipt, its key and its MaterializationDue, or writes nothing. The body is parsed and
checked before that statement against the route of a hint, the (account pk, epoch pk, epoch digest) this process
last saw; the statement admits only when the rows it holds locked are exactly the hint's, so the parse always
ran against the exact epoch the receipt binds to. A stale hint is replaced by what the statement locked and the
call is made once more; everything else that is not a new receipt (a refusal of the route or the body, a second
stale hint) takes the ordered path below (`_admit_ordered`), which decides the documented error exactly as
before."""
from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction

from connector.actors import Actor
from connector import logcontext, tracing
from connector.canonical.identity import IdentityRejected, canonical_identity
from connector.choices import EpochState, ReceiptKind
from connector.errors import ConnectorError, GateNotServing, roots_closed
from connector.faults import fault_point
from connector.locks import ServingLock
from connector.models import (AccountServingGate, ConnectorAccount, MaterializationDue, Receipt,
                              ReceiptAdmissionKey, ReceiptTrace, ServingEpoch)
from connector.selectors.routes import route_for
from connector.services import storable
from connector.services.guard import lock_serving, serving_check

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


@dataclass(frozen=True)
class AdmissionHint:
    """Which account pk and which exact epoch (pk, digest) an account key was last seen serving under. Only a
    hint: the admission statement admits nothing unless the rows it holds locked are exactly these."""

    account_pk: int
    epoch_pk: int
    epoch_digest: bytes


# Per process, by account key. Not a cache of facts (R30 caches only immutable facts by exact identity): an
# account key's pk and a gate's epoch can both change, and the statement that uses a hint re-checks it under its
# locks (D-202). A hint is replaced by what the statement locked whenever it differs.
_HINTS: dict[str, AdmissionHint] = {}


# Per process: the account pk of an account key. An account's key and pk never change (accounts are not renamed and
# their rows are referenced by PROTECT foreign keys); a pk whose gate row is gone (a deleted test world) is
# forgotten and resolved again. Split out of the gate read so that read names its account (docs/scale-out.md,
# D-245): the key lookup is the reference table's, the gate read is the account's shard's.
_ACCOUNT_PKS: dict[str, int] = {}


class HintStale(Exception):
    """The rows the admission locked are not the hint the caller verified the request against (the gate moved to
    another epoch since the caller's hint): nothing was written. `hint` is what the admission found (D-297)."""

    def __init__(self, hint: AdmissionHint) -> None:
        super().__init__(f"the gate serves epoch {hint.epoch_pk}, not the caller's hint")
        self.hint = hint


def admission_hint_cached(account_key: str) -> AdmissionHint | None:
    """This process's last hint for the account (None: none yet), without a round trip. Never trusted: the
    admission statement admits only if the rows it locks are exactly this hint (D-202, D-297)."""
    return _HINTS.get(account_key)


def admission_hint_get(account_key: str) -> AdmissionHint | None:
    """The account's pk and its gate's current epoch, read without locking: the gate by the account's pk (known to
    the process after the first admission of the key), else first the account by its key (ACCOUNT_NOT_FOUND when no
    account has that key). None when the gate names no epoch. The epoch's preimage is never read."""
    pk = _ACCOUNT_PKS.get(account_key)
    row = None
    if pk is not None:
        row = AccountServingGate.objects.filter(account_id=pk).values_list("epoch_id", "epoch_digest").first()
        if row is None:
            _ACCOUNT_PKS.pop(account_key, None)
            pk = None
    if pk is None:
        pk = ConnectorAccount.objects.filter(account_key=account_key).values_list("pk", flat=True).first()
        if pk is None:
            _HINTS.pop(account_key, None)
            raise AccountNotFound(f"no account {account_key!r}")
        row = AccountServingGate.objects.filter(account_id=pk).values_list("epoch_id", "epoch_digest").first()
        _ACCOUNT_PKS[account_key] = pk
    if row is None or row[0] is None or row[1] is None:
        return None
    hint = AdmissionHint(pk, row[0], bytes(row[1]))
    _HINTS[account_key] = hint
    return hint


class _Statement:
    """One row of `connector_receipt_admit` (migrations 0016, 0018)."""

    __slots__ = ("outcome", "account_pk", "receipt_pk", "key_pk", "created_at", "lock")

    def __init__(self, row: tuple) -> None:
        self.outcome, self.account_pk, self.receipt_pk, self.key_pk, self.created_at = row[:5]
        lock = ServingLock(*row[5:])
        self.lock = lock._replace(
            gate_epoch_digest=None if lock.gate_epoch_digest is None else bytes(lock.gate_epoch_digest),
            epoch_digest=None if lock.epoch_digest is None else bytes(lock.epoch_digest))


ADMIT_SQL = "SELECT * FROM connector_receipt_admit(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"


def _admit_statement(*, account_key: str, hint: AdmissionHint, channel: str, key: str, body: bytes, digest: bytes,
                     component_count: int) -> _Statement:
    """The one statement. Outside a transaction it is its own transaction (autocommit: one round trip, committed
    when it returns); inside a caller's transaction it runs in a savepoint so that a lost key race leaves the
    caller's transaction usable, as the ordered path's `atomic()` does."""
    # With tracing on, the current span's context is written beside the receipt by the same statement (D-235).
    traceparent, tracestate = tracing.current() or (None, None)
    params = [account_key, hint.account_pk, hint.epoch_pk, hint.epoch_digest, channel, key, body, digest,
              component_count, 1 + int(settings.CONNECTOR.get("GUARD_RETRY_LIMIT", 1)), traceparent, tracestate]
    connection = transaction.get_connection()
    if connection.in_atomic_block:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(ADMIT_SQL, params)
            return _Statement(cursor.fetchone())
    with connection.cursor() as cursor:
        cursor.execute(ADMIT_SQL, params)
        return _Statement(cursor.fetchone())


def _admitted(*, account_key: str, channel: str, key: str, body: bytes, digest: bytes, count: int,
              out: _Statement) -> Admission:
    """The Admission of a receipt the statement created, built from what it returned (no read back). Its epoch is
    the exact one the statement locked and found `active`, loaded as `.only()` would (the preimage deferred)."""
    db = transaction.get_connection().alias
    lock = out.lock
    account = ConnectorAccount.from_db(db, ["id", "account_key"], [out.account_pk, account_key])
    receipt = Receipt.from_db(
        db, ["id", "account_id", "epoch_id", "epoch_digest", "gate_fence", "kind", "channel", "payload",
             "payload_digest", "component_count", "replay_request_id", "created_at"],
        [out.receipt_pk, out.account_pk, lock.gate_epoch_pk, lock.epoch_digest, lock.gate_fence,
         ReceiptKind.TRANSPORT, channel, body, digest, count, None, out.created_at])
    receipt.account = account
    receipt.epoch = ServingEpoch.from_db(db, ["id", "epoch_id", "digest", "state"],
                                         [lock.gate_epoch_pk, lock.epoch_id, lock.epoch_digest, EpochState.ACTIVE])
    admission_key = ReceiptAdmissionKey.from_db(
        db, ["id", "account_id", "channel", "transport_key", "receipt_id", "tombstone_id"],
        [out.key_pk, out.account_pk, channel, key, out.receipt_pk, None])
    admission_key.account = account
    admission_key.receipt = receipt
    return Admission("created", receipt, admission_key)


def _admit_hinted(*, account_key: str, channel: str, key: str, body: bytes, digest: bytes,
                  hint: AdmissionHint | None, fixed: bool = False) -> Admission | None:
    """The one-statement path: parse against the hint's route, then the statement; a stale hint is replaced by the
    rows the statement locked and tried once more, or, with `fixed` (the caller verified the request against this
    hint), raises HintStale. None: take the ordered path."""
    for _attempt in range(2):
        if hint is None:
            return None
        try:
            route = route_for(epoch_pk=hint.epoch_pk, epoch_digest=hint.epoch_digest, account_id=hint.account_pk,
                              channel=channel)
            events = route.parse(body)
            storable.events_check(events=events, route=route, epoch_pk=hint.epoch_pk, epoch_digest=hint.epoch_digest)
        except ConnectorError:
            return None  # the ordered path decides which refusal (or duplicate) answers, in its documented order
        try:
            out = _admit_statement(account_key=account_key, hint=hint, channel=channel, key=key, body=body,
                                   digest=digest, component_count=len(events))
        except IntegrityError as exc:
            if (closed := roots_closed(exc)) is not None:  # a succession drain closed the epoch's roots (D-315)
                raise closed from None
            name = getattr(getattr(exc.__cause__, "diag", None), "constraint_name", "")
            if name != "connector_admissionkey_unique_key":
                raise
            return None  # lost the race to a concurrent admission of this key: resolve it as a duplicate
        if out.outcome == "created":
            return _admitted(account_key=account_key, channel=channel, key=key, body=body, digest=digest,
                             count=len(events), out=out)
        if out.outcome == "existing":  # resolved before any lock, as the ordered path does
            if fixed:
                _current(account_key, hint)
            account = ConnectorAccount.from_db(transaction.get_connection().alias, ["id", "account_key"],
                                               [out.account_pk, account_key])
            return _existing(account, channel, key, digest)
        if out.outcome == "no_account":
            _HINTS.pop(account_key, None)
            return None
        # refused: the guard's own checks on the locked rows raise its documented error; passing them means only
        # the hint was stale, so parse again against the epoch the statement found and call once more
        ctx = serving_check(out.lock, account_id=out.account_pk)
        hint = AdmissionHint(out.account_pk, ctx.epoch_pk, ctx.epoch_digest)
        _HINTS[account_key] = hint
        if fixed:
            raise HintStale(hint)
    return None


def _current(account_key: str, hint: AdmissionHint) -> None:
    """A duplicate is answered before any lock: with a caller-verified hint, the gate must still name exactly
    that hint's epoch (one read, only on this rare path), else HintStale: the caller verifies again (D-297)."""
    found = admission_hint_get(account_key)
    if found != hint:
        raise HintStale(found) if found is not None else GateNotServing(
            f"account {account_key!r} gate names no epoch; no epoch serves it")


def receipt_admit(*, account_key: str, channel: str, transport_key: str | bytes | None, body: bytes,
                  actor: Actor, hint: AdmissionHint | None = None, hint_fixed: bool = False) -> Admission:
    """Admit one transport delivery exactly once.

    Validates the key, resolves a duplicate (same bytes: the original Receipt and epoch; a V1 tombstone: already
    accepted, no descendant; different bytes: RECEIPT_DIGEST_MISMATCH) before any lock. Otherwise, in one
    transaction: the serving guard (gate `v2_serving`, exact active epoch), the route from the frozen epoch, a
    whole-body parse and the check that every extracted value fits every column that stores it and every
    outbound use (`storable.events_check`; BODY_UNPARSEABLE refuses everything), then the Receipt, its key and its
    MaterializationDue. Concurrent submissions of one key race on the key's unique constraint; losers resolve as
    duplicates or mismatches. Children are materialized afterwards by `receipt_materialize`.

    A new receipt is admitted by one statement (module docstring, D-201/D-202): the parse and the check run
    against the route of `hint` (or this process's last hint for the account, read when there is none), and the
    statement writes only if the rows it locks are exactly the hint's; otherwise nothing is written and the
    answer is the ordered path's. Raises NoncanonicalKey, AccountNotFound, ReceiptDigestMismatch, GateNotServing,
    ChannelNotFound, BodyUnparseable (and the route's own definition errors).

    `hint_fixed` (the REST view, which verified the request's signature with the credential of `hint`'s epoch,
    D-297): a new receipt is admitted only under exactly `hint` (account, epoch pk and digest), on either path;
    if the gate serves another epoch, nothing is written and HintStale says which, so that the caller verifies
    again against it."""
    key = canonical_key(transport_key)
    body = bytes(body)
    digest = hashlib.sha256(body).digest()
    # With tracing on, the receipt's trace context commits in the receipt's own transaction (D-225): the one
    # statement writes it (D-235), as the ordered path does with `tracing.remember`.
    if hint is None:
        hint = _HINTS.get(account_key) or admission_hint_get(account_key)
    admission = _admit_hinted(account_key=account_key, channel=channel, key=key, body=body, digest=digest,
                              hint=hint, fixed=hint_fixed)
    if admission is None:
        admission = _admit_ordered(account_key=account_key, channel=channel, key=key, body=body, digest=digest,
                                   expected=hint if hint_fixed else None)
    if admission.outcome != "created":
        return admission
    receipt = admission.receipt
    fault_point("admission.after_receipt_commit")
    logcontext.note(account_id=receipt.account_id, receipt_id=receipt.pk)
    log.info("receipt admitted", extra={"receipt": receipt.pk, "account": account_key,
                                        "components": receipt.component_count, "epoch": receipt.epoch.epoch_id})
    return admission


def _admit_ordered(*, account_key: str, channel: str, key: str, body: bytes, digest: bytes,
                   expected: AdmissionHint | None = None) -> Admission:
    """The ordered path (every check in its documented order, one statement each): the answer for everything the
    one-statement path does not admit: account, duplicate, then in one transaction the serving guard, the route,
    the parse and the check, and the three rows (`receipt_admit`'s docstring). With `expected`, the guard must
    have locked exactly that hint's account and epoch, else HintStale (nothing written)."""
    account = account_get(account_key)
    found = _existing(account, channel, key, digest)
    if found is not None:
        if expected is not None:
            _current(account_key, expected)
        return found
    try:
        with transaction.atomic():
            ctx = lock_serving(account_id=account.pk)
            found = AdmissionHint(account.pk, ctx.epoch_pk, ctx.epoch_digest)
            if expected is not None and found != expected:
                _HINTS[account_key] = found
                raise HintStale(found)
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
        if (closed := roots_closed(exc)) is not None:  # a succession drain closed the epoch's roots (D-315)
            raise closed from None
        name = getattr(getattr(exc.__cause__, "diag", None), "constraint_name", "")
        if name != "connector_admissionkey_unique_key":
            raise
        found = _existing(account, channel, key, digest)  # lost the race: the winner committed
        if found is None:  # pragma: no cover - the unique violation proves a committed row
            raise
        return found
    _HINTS[account_key] = AdmissionHint(account.pk, ctx.epoch_pk, ctx.epoch_digest)
    return Admission("created", receipt, admission_key)
