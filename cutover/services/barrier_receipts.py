"""The per-owner fenced receipts of a publication barrier set (CV2-15-009, CV2-11-033/037).

A set holds exactly one receipt for the Catalog (the candidate's IntegrationBindingView), one for every
binding-definition owner (each `owner_pack` the candidate's Catalog bindings name: the receipt covers that owner's
binding proofs in ordinal order), one for the L2 configuration owner (the exact configuration generation) and one
for credential authority (every credential-generation proof of the candidate, in ordinal order). They are written
in the transaction that writes the set `acquiring` (the holder and the set's fence that recorded them), checked
against the candidate's owners before the set is held and on every recovery, and never change (append-only,
migration 0015). The expected receipts are computed from the epoch's immutable proof rows, never from a caller.
"""
from __future__ import annotations

import hashlib
import json

from django.db import transaction

from connector.selectors.rows import (ServiceConfigurationGeneration, ServingEpoch, ServingEpochBindingProof,
                                     ServingEpochCredentialProof)
from cutover.choices import BarrierOwnerKind
from cutover.models import BarrierOwnerReceipt, ServingPublicationBarrierSet

__all__ = ["expected_owner_receipts", "record_owner_receipts", "owner_receipt_problems"]

Receipt = tuple[str, str, bytes]  # (owner kind, owner ID, receipt digest)

# The Catalog's tables, named through the epoch's foreign keys (their model classes are private to connector).
CATALOG_BINDINGS = ServingEpochBindingProof._meta.get_field("binding").related_model._meta.db_table
CATALOG_VIEWS = ServingEpoch._meta.get_field("catalog_view").related_model._meta.db_table
PROOFS_SQL = f"""
SELECT 'b', b.owner_pack, p.ordinal, encode(p.owner_receipt_digest, 'hex')
  FROM {ServingEpochBindingProof._meta.db_table} AS p JOIN {CATALOG_BINDINGS} AS b ON b.id = p.binding_id
 WHERE p.epoch_id = %(e)s
UNION ALL
SELECT 'c', '', ordinal, encode(owner_receipt_digest, 'hex') FROM {ServingEpochCredentialProof._meta.db_table}
 WHERE epoch_id = %(e)s
UNION ALL
SELECT 'v', view_key || '@' || revision, 0, encode(receipt_digest, 'hex') FROM {CATALOG_VIEWS}
 WHERE id = %(v)s
ORDER BY 1, 2, 3
"""


def _digest(kind: str, owner_id: str, parts: list) -> bytes:
    return hashlib.sha256(json.dumps([kind, owner_id, parts], separators=(",", ":")).encode()).digest()


def expected_owner_receipts(epoch: ServingEpoch) -> list[Receipt]:
    """The receipts the candidate's owners give, sorted by (kind, owner ID): one per owner."""
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(PROOFS_SQL, {"e": epoch.pk, "v": epoch.catalog_view_id})
        proofs = cursor.fetchall()
    receipts: list[Receipt] = []
    view = next(((owner_id, hex_digest) for kind, owner_id, _, hex_digest in proofs if kind == "v"), ("-", None))
    receipts.append((BarrierOwnerKind.CATALOG, view[0], _digest("catalog", view[0], [view[1]])))
    packs: dict[str, list] = {}
    for kind, pack, ordinal, hex_digest in proofs:
        if kind == "b":
            packs.setdefault(pack, []).append([ordinal, hex_digest])
    for pack, parts in sorted(packs.items()):
        receipts.append((BarrierOwnerKind.BINDING_DEFINITION, pack, _digest("binding_definition", pack, parts)))
    generation = (ServiceConfigurationGeneration.objects.filter(pk=epoch.configuration_id)
                  .values_list("generation_id", flat=True).first()) or "-"
    configuration = bytes(epoch.configuration_receipt_digest).hex() if epoch.configuration_receipt_digest else None
    receipts.append((BarrierOwnerKind.CONFIGURATION, generation,
                     _digest("configuration", generation, [configuration])))
    credentials = [[ordinal, hex_digest] for kind, _, ordinal, hex_digest in proofs if kind == "c"]
    receipts.append((BarrierOwnerKind.CREDENTIAL_AUTHORITY, "credential_authority",
                     _digest("credential_authority", "credential_authority", credentials)))
    return sorted(receipts)


def record_owner_receipts(row: ServingPublicationBarrierSet, epoch: ServingEpoch) -> list[BarrierOwnerReceipt]:
    """Write one receipt per owner for the set just written `acquiring` (inside the caller's transaction), under the
    set's holder and fence. The unique constraints refuse a second receipt of the same owner."""
    return BarrierOwnerReceipt.objects.bulk_create([
        BarrierOwnerReceipt(barrier_set=row, owner_kind=kind, owner_id=owner_id, receipt_digest=digest,
                            holder=row.holder, fence=row.fence)
        for kind, owner_id, digest in expected_owner_receipts(epoch)])


def owner_receipt_problems(row: ServingPublicationBarrierSet, epoch: ServingEpoch) -> list[str]:
    """Empty when the set holds exactly the receipts of the candidate's owners (each owner once, same bytes);
    otherwise what is missing, extra or different. A missing or mismatched receipt blocks activation."""
    stored = {(kind, owner_id): bytes(digest) for kind, owner_id, digest in
              BarrierOwnerReceipt.objects.filter(barrier_set_id=row.pk)
              .values_list("owner_kind", "owner_id", "receipt_digest")}
    expected = {(kind, owner_id): digest for kind, owner_id, digest in expected_owner_receipts(epoch)}
    problems = [f"no receipt of {kind}:{owner_id}" for kind, owner_id in sorted(expected.keys() - stored.keys())]
    problems += [f"receipt of {kind}:{owner_id} is not an owner of the candidate"
                 for kind, owner_id in sorted(stored.keys() - expected.keys())]
    problems += [f"receipt of {kind}:{owner_id} differs from the owner's" for (kind, owner_id), digest
                 in sorted(expected.items()) if (kind, owner_id) in stored and stored[(kind, owner_id)] != digest]
    return problems
