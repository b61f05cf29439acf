"""The typed V1 predecessor ref of a replay (CV2-09-002, CV2-09-014; decision D-331).

A replay may name a V1-accepted item as its predecessor. V1 work lives in V2 only as an immutable acceptance
tombstone (account, channel, transport key, authorized payload digest, `v1:workitem:<n>`), with no bytes, so the
operator supplies the exact V1 item bytes; the ref is admitted only when every identity in it is canonical and
matches that tombstone exactly and the bytes hash to the tombstone's authorized digest. The ref is stored as
immutable evidence (`V1PredecessorRef`): it has no state, lease or fence, no lane or execution relates to it, and
the original V1 epoch it names is evidence only: the replay Receipt and every descendant carry the V2 epoch the
replay admission locked. This module validates; `replay.replay_request_admit` writes."""
from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

from connector.canonical.encoding import encode
from connector.canonical.identity import IdentityRejected, canonical_identity
from connector.errors import ConnectorError
from connector.models import ServingEpoch, V1AcceptanceTombstone, V1PredecessorRef
from connector.models.owners import ConnectorAccount
from connector.receipts import rec

V1_REF_PROTOCOL = "nexuscrm.connector.v1-predecessor-ref.v1"
# The V1 owner exports each accepted item as `v1:workitem:<n>` (cutover.ports.TransportIdentity.predecessor_ref).
# In V1 the accepted item is also the event (V1 encodes the event in its WorkItem), so its Event identity is
# `v1:event:<n>` with the same n; the V1 Receipt is the accepted transport identity (channel, transport key).
_WORK_ITEM = re.compile(r"v1:workitem:([1-9][0-9]{0,18})")
_EVENT = re.compile(r"v1:event:([1-9][0-9]{0,18})")
# The original epoch is a V1 identity (a V1 release or process generation), never a V2 ServingEpoch ID.
_EPOCH = re.compile(r"v1:(release|generation):(.+)")


class ReplayPredecessorInvalid(ConnectorError):
    """The predecessor ref is malformed: not an exact V2 event with the authorized payload digest, or a V1 ref
    whose protocol, identities, epoch, digests or bytes are not canonical and consistent."""

    code = "REPLAY_PREDECESSOR_INVALID"
    http_status = 422


class ReplayV1PredecessorUnknown(ConnectorError):
    """The V1 predecessor ref is well formed but matches no V1 acceptance tombstone of the account exactly (V1
    Receipt, WorkItem and authorized payload digest): it is not evidence of anything V1 accepted."""

    code = "REPLAY_V1_PREDECESSOR_UNKNOWN"
    http_status = 422


@dataclass(frozen=True)
class V1Predecessor:
    """The V1 predecessor ref as submitted, with the exact V1 item bytes whose digest the tombstone authorized."""

    protocol_version: str
    receipt_channel: str
    receipt_transport_key: str
    event_id: str
    work_item_id: str
    original_epoch: str
    payload_digest: bytes
    result_digest: bytes
    payload: bytes


@dataclass(frozen=True)
class CheckedV1Predecessor:
    ref: V1Predecessor  # canonical
    tombstone: V1AcceptanceTombstone
    ref_digest: bytes

    def row(self) -> V1PredecessorRef:
        r = self.ref
        return V1PredecessorRef(
            tombstone=self.tombstone, protocol_version=r.protocol_version, v1_receipt_channel=r.receipt_channel,
            v1_receipt_transport_key=r.receipt_transport_key, v1_event_id=r.event_id,
            v1_work_item_id=r.work_item_id, original_epoch=r.original_epoch, payload_digest=r.payload_digest,
            result_digest=r.result_digest, ref_digest=self.ref_digest)


def _identity(value: object, field: str) -> str:
    try:
        return canonical_identity(value, field=field)
    except IdentityRejected as exc:
        raise ReplayPredecessorInvalid(f"v1 predecessor {field} is not canonical: {exc.code}") from exc


def _digest(value: object, field: str) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)) or len(bytes(value)) != 32:
        raise ReplayPredecessorInvalid(f"v1 predecessor {field} is not a 32-byte SHA-256 digest")
    return bytes(value)


def ref_digest(ref: V1Predecessor) -> bytes:
    """The canonical digest of the ref's evidence fields (the bytes are bound through `payload_digest`)."""
    return hashlib.sha256(encode(V1_REF_PROTOCOL, rec(
        protocol_version=ref.protocol_version, receipt_channel=ref.receipt_channel,
        receipt_transport_key=ref.receipt_transport_key, event_id=ref.event_id, work_item_id=ref.work_item_id,
        original_epoch=ref.original_epoch, payload_digest=ref.payload_digest,
        result_digest=ref.result_digest))).digest()


def v1_predecessor_canonical(ref: V1Predecessor) -> V1Predecessor:
    """The ref with every identity canonical and consistent, or REPLAY_PREDECESSOR_INVALID. Reads nothing."""
    if not isinstance(ref, V1Predecessor) or ref.protocol_version != V1_REF_PROTOCOL:
        raise ReplayPredecessorInvalid(f"v1 predecessor protocol must be {V1_REF_PROTOCOL!r}")
    channel = _identity(ref.receipt_channel, "receipt channel")
    key = _identity(ref.receipt_transport_key, "receipt transport key")
    work_item = _WORK_ITEM.fullmatch(_identity(ref.work_item_id, "work item id"))
    event = _EVENT.fullmatch(_identity(ref.event_id, "event id"))
    if work_item is None or event is None:
        raise ReplayPredecessorInvalid("v1 predecessor identities must be v1:workitem:<n> and v1:event:<n>")
    if work_item.group(1) != event.group(1):
        raise ReplayPredecessorInvalid("a V1 item's Event and WorkItem identities name the same V1 item")
    epoch = _identity(ref.original_epoch, "original epoch")
    matched = _EPOCH.fullmatch(epoch)
    if matched is None:
        raise ReplayPredecessorInvalid("the original epoch must be a V1 identity (v1:release:<id> or "
                                       "v1:generation:<id>)")
    _identity(matched.group(2), "original epoch")
    payload_digest, result_digest = _digest(ref.payload_digest, "payload digest"), _digest(ref.result_digest,
                                                                                          "result digest")
    if not isinstance(ref.payload, (bytes, bytearray)) or not hmac.compare_digest(
            hashlib.sha256(bytes(ref.payload)).digest(), payload_digest):
        raise ReplayPredecessorInvalid("the V1 item bytes do not hash to the authorized payload digest")
    return V1Predecessor(V1_REF_PROTOCOL, channel, key, event.group(0), work_item.group(0), epoch, payload_digest,
                         result_digest, bytes(ref.payload))


def v1_predecessor_check(ref: V1Predecessor, *, account: ConnectorAccount) -> CheckedV1Predecessor:
    """Canonicalize `ref` and bind it to the account's exact V1 acceptance tombstone (V1 Receipt = channel and
    transport key, WorkItem = the tombstone's predecessor ref, the authorized payload digest). Reads only: the
    tombstone is immutable, so no lock is needed."""
    ref = v1_predecessor_canonical(ref)
    if ServingEpoch.objects.filter(epoch_id=ref.original_epoch).exists():
        raise ReplayPredecessorInvalid("the original epoch names a V2 serving epoch, not a V1 one")
    tombstone = V1AcceptanceTombstone.objects.filter(account=account, channel=ref.receipt_channel,
                                                     transport_key=ref.receipt_transport_key).first()
    if (tombstone is None or tombstone.predecessor_ref != ref.work_item_id
            or not hmac.compare_digest(bytes(tombstone.payload_digest), ref.payload_digest)):
        raise ReplayV1PredecessorUnknown("the V1 receipt, work item and payload digest match no V1 acceptance "
                                         "tombstone of this account exactly")
    return CheckedV1Predecessor(ref, tombstone, ref_digest(ref))
