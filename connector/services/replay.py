"""Replay admission: an immutable ReplayRequest and its inert replay Receipt in one guarded transaction
(CV2-09). Only `suppress_external_effects` is accepted. The same request ID byte-compares and returns the same
request; a mismatch fails closed; a different ID is a separate generation. The predecessor stays byte-identical."""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from connector import hooks
from connector.actors import Actor
from connector.canonical.encoding import encode
from connector.choices import ComponentDisposition, ReceiptKind, ReplayMode
from connector.errors import ConnectorError, FenceStale, PermissionRefused, roots_closed
from connector.models import Execution, MaterializationDue, Receipt, ReceiptComponent, ReplayRequest
from connector.receipts import rec
from connector.selectors.replay import remediation_request_id
from connector.selectors.serving import gate_get
from connector.services import execution, materialize
from connector.services.admission import account_get
from connector.services.audit import audit_record
from connector.services.guard import lock_serving
from connector.services.owners import ident
from connector.services.replay_v1 import ReplayPredecessorInvalid, V1Predecessor, v1_predecessor_check

REPLAY_PROTOCOL = "nexuscrm.connector.replay-request.v1"


class ReplayModeRefused(ConnectorError):
    """Only `suppress_external_effects` replays are accepted."""

    code = "REPLAY_MODE_REFUSED"
    http_status = 400


class ReplayMismatch(ConnectorError):
    """This ReplayRequest ID exists with different bytes; nothing was written."""

    code = "REPLAY_MISMATCH"
    http_status = 409


class ReplayRequestInvalid(ConnectorError):
    """The replay request lacks a reason or names a target epoch that is not the account's serving epoch."""

    code = "REPLAY_REQUEST_INVALID"
    http_status = 409


@dataclass(frozen=True)
class ReplayAdmission:
    outcome: str  # "created" | "duplicate"
    request: ReplayRequest
    receipt: Receipt


def _request_digest(**fields) -> bytes:
    return hashlib.sha256(encode(REPLAY_PROTOCOL, rec(**fields))).digest()


def replay_request_admit(*, account_key: str, request_id: str, target_epoch_id: str, target_epoch_digest: bytes,
                         predecessor_event_id: int | None = None, predecessor_payload_digest: bytes | None = None,
                         v1_predecessor: V1Predecessor | None = None, reason: str, principal: str,
                         mode: str, actor: Actor) -> ReplayAdmission:
    """Admit one ReplayRequest and its replay Receipt, which copies the exact predecessor bytes whose digest was
    authorized: the component bytes of a V2 Event (`predecessor_event_id`, `predecessor_payload_digest`), or the
    V1 item bytes of a typed V1 predecessor ref (`v1_predecessor`, D-331) bound to its V1 acceptance tombstone.
    Exactly one form. The request and Receipt are inert until materialized under the same guard, and always
    under the locked V2 serving epoch: a V1 ref's original epoch is evidence only (CV2-09-014)."""
    request_id = ident(request_id, "request_id")
    principal = ident(principal, "principal")
    if mode != ReplayMode.SUPPRESS_EXTERNAL_EFFECTS:
        raise ReplayModeRefused(f"replay mode {mode!r} is refused; only suppress_external_effects is valid")
    mode = str(ReplayMode(mode).value)
    if not reason.strip():
        raise ReplayRequestInvalid("a replay needs a reason")
    account = account_get(account_key)
    common = dict(account_key=account.account_key, request_id=request_id, target_epoch_id=target_epoch_id,
                  target_epoch_digest=bytes(target_epoch_digest))
    if (v1_predecessor is None) == (predecessor_event_id is None):
        raise ReplayPredecessorInvalid("name exactly one predecessor: a V2 event or a V1 predecessor ref")
    if v1_predecessor is not None:
        checked = v1_predecessor_check(v1_predecessor, account=account)
        payload_digest = checked.ref.payload_digest
        digest = _request_digest(**common, v1_predecessor_ref_digest=checked.ref_digest,
                                 predecessor_payload_digest=payload_digest, reason=reason, principal=principal,
                                 mode=mode)
    else:
        if not isinstance(predecessor_event_id, int) or not 0 < predecessor_event_id < 2 ** 63:
            raise ReplayPredecessorInvalid("predecessor event id is not an exact event identity")
        payload_digest = bytes(predecessor_payload_digest or b"")
        digest = _request_digest(**common, predecessor_event_id=predecessor_event_id,
                                 predecessor_payload_digest=payload_digest, reason=reason, principal=principal,
                                 mode=mode)
    existing = ReplayRequest.objects.select_related("receipt").filter(account=account, request_id=request_id).first()
    if existing is not None:
        if not hmac.compare_digest(bytes(existing.request_digest), digest):
            raise ReplayMismatch(f"replay request {request_id} exists with different bytes")
        return ReplayAdmission("duplicate", existing, existing.receipt)
    if v1_predecessor is not None:
        event, channel, payload = None, checked.ref.receipt_channel, checked.ref.payload
    else:
        component = (ReceiptComponent.objects.filter(event_id=predecessor_event_id, event__account=account,
                                                     disposition=ComponentDisposition.EVENT)
                     .select_related("event").first())
        if component is None or not hmac.compare_digest(hashlib.sha256(bytes(component.payload)).digest(),
                                                        payload_digest):
            raise ReplayPredecessorInvalid("predecessor event and authorized payload digest do not match exactly")
        event, channel, payload = component.event, component.event.route, bytes(component.payload)
    try:
        with transaction.atomic():
            ctx = lock_serving(account_id=account.pk)
            if ctx.epoch_id != target_epoch_id or not hmac.compare_digest(ctx.epoch_digest,
                                                                          bytes(target_epoch_digest)):
                raise ReplayRequestInvalid(f"target epoch {target_epoch_id} is not the account's serving epoch")
            v1_ref = None
            if v1_predecessor is not None:
                v1_ref = checked.row()
                v1_ref.save()
            request = ReplayRequest.objects.create(
                account=account, request_id=request_id, target_epoch_id=ctx.epoch_pk,
                target_epoch_digest=ctx.epoch_digest, predecessor_event=event, v1_predecessor=v1_ref,
                predecessor_payload_digest=payload_digest, reason=reason, principal=principal,
                mode=mode, request_digest=digest, gate_fence=ctx.fence)
            receipt = Receipt.objects.create(
                account=account, epoch_id=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, gate_fence=ctx.fence,
                kind=ReceiptKind.REPLAY, channel=channel, payload=payload, payload_digest=payload_digest,
                component_count=1, replay_request=request)
            MaterializationDue.objects.create(receipt=receipt)
            hooks.replay_admitted(request)  # the predecessor's EffectRoots, as correlation evidence (D-309)
            audit_record(actor=actor, entity=request, action="replay_request_admit", fence=ctx.fence,
                         evidence_digest=digest, reason=reason)
    except IntegrityError as exc:
        if (closed := roots_closed(exc)) is not None:  # a succession drain closed the epoch's roots (D-315)
            raise closed from None
        existing = ReplayRequest.objects.select_related("receipt").filter(account=account,
                                                                          request_id=request_id).first()
        if existing is None:
            raise
        if not hmac.compare_digest(bytes(existing.request_digest), digest):
            raise ReplayMismatch(f"replay request {request_id} exists with different bytes") from None
        return ReplayAdmission("duplicate", existing, existing.receipt)
    return ReplayAdmission("created", request, receipt)


# -- after admission: run it, and remediate a quarantined execution by replay ------------------------------------

def replay_request_settle(*, request_pk: int) -> bool:
    """Materialize a replay Receipt and take one step on each lane it reached, each in its own guarded transaction
    (materialization and lane advance are the same services the sweeper runs, so this only makes the replay's
    disposition known at once). A ConnectorError (the gate moved, say) leaves the rest to the sweeper, which finds
    the Receipt through MaterializationDue and the lane through its pending projection. Returns whether the
    Receipt is materialized."""
    row = Receipt.objects.filter(replay_request_id=request_pk).values_list("pk", "account_id").first()
    if row is None:
        return False
    receipt_pk, account_pk = row
    try:
        out = materialize.receipt_materialize(receipt_pk=receipt_pk, account_id=account_pk)
    except ConnectorError:
        return False
    try:
        execution.lanes_advance(lane_pks=sorted(out.lanes), account_id=account_pk)
    except ConnectorError:
        pass  # the sweeper steps the lanes later
    return True


REMEDIATION_PERMISSION = "connector.add_replayrequest"


def execution_replay(*, execution_pk: int, reason: str, actor: Actor, expected_changed_at) -> ReplayAdmission:
    """An operator's remediation of a quarantined execution (RESULT_FAILED, RESULT_REJECTED, DEPENDENCY_*): admit
    a ReplayRequest of its source event under the account's serving epoch, with `suppress_external_effects`, then
    settle it. Its execution runs under a new generation; on a lane halted by this execution it runs first and the
    partition resumes (`lanes.replay_resumption`). The quarantined execution stays as it is (CV2-13-003). One
    replay per quarantined execution: its request ID is derived from the execution, and asking again returns it.

    Raises PermissionRefused, FenceStale (the page showed another state), ReplayRequestInvalid (not quarantined, a
    window execution) and every `replay_request_admit` refusal."""
    if actor.user is not None and not actor.user.has_perm(REMEDIATION_PERMISSION):
        raise PermissionRefused(f"{actor} lacks the {REMEDIATION_PERMISSION} permission")
    if not reason.strip():
        raise ReplayRequestInvalid("a replay needs a reason")
    execution = Execution.objects.select_related("projection__event", "account").get(pk=execution_pk)
    if expected_changed_at is None or execution.changed_at != expected_changed_at:
        raise FenceStale(f"execution #{execution_pk} changed since the page was shown; reload and decide again")
    if execution.state != "quarantined":
        raise ReplayRequestInvalid(f"execution #{execution_pk} is {execution.state}; only a quarantined execution is "
                                   "remedied by replay")
    event = execution.projection.event
    if event is None:
        raise ReplayRequestInvalid("a window execution has no single source event: replay its member events")
    request_id = remediation_request_id(execution.pk)
    existing = ReplayRequest.objects.select_related("receipt").filter(account=execution.account,
                                                                      request_id=request_id).first()
    if existing is not None:
        return ReplayAdmission("duplicate", existing, existing.receipt)
    component = ReceiptComponent.objects.get(event=event, disposition=ComponentDisposition.EVENT)
    gate = gate_get(account_id=execution.account_id)
    epoch = gate.epoch
    if epoch is None:
        raise ReplayRequestInvalid("the account gate names no serving epoch")
    admission = replay_request_admit(
        account_key=execution.account.account_key, request_id=request_id, target_epoch_id=epoch.epoch_id,
        target_epoch_digest=bytes(gate.epoch_digest), predecessor_event_id=event.pk,
        predecessor_payload_digest=hashlib.sha256(bytes(component.payload)).digest(),
        reason=f"remediate quarantined execution #{execution.pk} ({execution.quarantine_reason}): {reason}",
        principal=actor.principal, mode=ReplayMode.SUPPRESS_EXTERNAL_EFFECTS, actor=actor)
    replay_request_settle(request_pk=admission.request.pk)
    return admission
