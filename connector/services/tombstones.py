"""Import of V1 transport identities as non-executable acceptance tombstones (CV2-05-007/008). Each import
row reserves the ReceiptAdmissionKey namespace for that key; re-importing the same row is a no-op, a different
digest or predecessor for an existing key fails closed."""
from __future__ import annotations

import hmac
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.models import ReceiptAdmissionKey, V1AcceptanceTombstone
from connector.services.admission import account_get, canonical_key
from connector.services.audit import audit_record
from connector.services.owners import ident


class TombstoneConflict(ConnectorError):
    """The key already names a V2 Receipt, or a tombstone with a different digest or predecessor."""

    code = "TOMBSTONE_CONFLICT"
    http_status = 409


@dataclass(frozen=True)
class TombstoneImport:
    created: int
    unchanged: int


@transaction.atomic
def tombstones_import(*, rows: list[dict], actor: Actor) -> TombstoneImport:
    """Import rows {account, channel, transport_key, payload_digest (32 bytes), predecessor_ref} in one
    transaction: all or nothing."""
    created = unchanged = 0
    for row in rows:
        account = account_get(row["account"])
        key = canonical_key(row["transport_key"])
        channel = ident(row["channel"], "channel")
        digest = bytes(row["payload_digest"])
        if len(digest) != 32:
            raise TombstoneConflict(f"payload digest for {key!r} is not 32 bytes")
        existing = ReceiptAdmissionKey.objects.select_related("tombstone").filter(
            account=account, channel=channel, transport_key=key).first()
        if existing is not None:
            t = existing.tombstone
            if t is None or not hmac.compare_digest(bytes(t.payload_digest), digest) or (
                    t.predecessor_ref != row["predecessor_ref"]):
                raise TombstoneConflict(f"key {key!r} is already held with different evidence")
            unchanged += 1
            continue
        try:
            with transaction.atomic():
                tombstone = V1AcceptanceTombstone.objects.create(account=account, channel=channel, transport_key=key,
                                                                 payload_digest=digest,
                                                                 predecessor_ref=ident(row["predecessor_ref"],
                                                                                       "predecessor_ref"))
                ReceiptAdmissionKey.objects.create(account=account, channel=channel, transport_key=key,
                                                   tombstone=tombstone)
        except IntegrityError as exc:
            raise TombstoneConflict(f"key {key!r} was taken concurrently") from exc
        audit_record(actor=actor, entity=tombstone, action="v1_tombstone_import", evidence_digest=digest)
        created += 1
    return TombstoneImport(created, unchanged)
