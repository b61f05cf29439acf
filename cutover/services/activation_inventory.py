"""The first activation's closed inventory (seed "Delivery gates" 3; CV2-12-010, D-320).

`inventory_freeze` runs inside `first_activation_hold`'s transaction (the set locked FOR UPDATE, the candidate
epoch FOR SHARE): it computes the per-activation inventory (connector.selectors.inventory.activation_inventory:
every account, gate, enabled route, credential dispatch gate, and every partition the attempt certified through
its OrderingBaselines, each with its selected authority) and refuses with ACTIVATION_INVENTORY_UNCOVERED while any
supported path lacks its authority: the transaction rolls back and the set stays `acquiring`. Otherwise it freezes
the inventory's digest, the digest of the code-level path registry and the count per kind in one append-only
ActivationInventory row of that set.

`inventory_check` runs in `first_activation_commit` before the activation transaction: it refuses (nothing written)
if the path registry is not the frozen one or an authority the inventory named is gone since. The inputs are
frozen rows (the configuration and the epoch's proofs are immutable, lanes are created only at validation, gate
and dispatch-gate rows are never deleted) and the gates, which the activation transaction compares again under
its locks (its held evidence), so a check before those locks is exact.
"""
from __future__ import annotations

import hashlib
import hmac

from connector.actors import Actor
from connector.selectors import inventory
from connector.selectors.rows import ServingEpoch
from connector.services.audit import audit_record
from cutover.errors import ActivationInventoryUncovered
from cutover.models import ActivationInventory, OrderingBaseline, ServiceCutoverAttempt, ServingPublicationBarrierSet
from cutover.services.v1_shutdown import evidence_digest

__all__ = ["inventory_compute", "inventory_freeze", "inventory_check"]
SHOWN = 20  # uncovered paths named in a refusal's detail


def inventory_compute(attempt: ServiceCutoverAttempt, epoch: ServingEpoch):
    """(inventory, its digest, the registry's digest) of this attempt's activation of `epoch`."""
    partitions = list(OrderingBaseline.objects.filter(attempt=attempt).values_list("account_id", "route_key",
                                                                                 "partition"))
    found = inventory.activation_inventory(epoch_pk=epoch.pk, configuration_pk=attempt.configuration_id,
                                           partitions=partitions)
    registry = evidence_digest("path_registry", inventory.registry_value())[1]
    digest = evidence_digest("activation_inventory", {
        "registry": registry.hex(), "epoch": bytes(epoch.digest).hex(), "attempt": attempt.attempt_key,
        "entries": _entries_digest(found.entries).hex()})[1]
    return found, digest, registry


def _entries_digest(entries: list[list[str]]) -> bytes:
    """sha256 of the ordered entries, each field length-prefixed UTF-8 and each entry counted: unambiguous, and
    about a tenth of the canonical encoder's cost for thousands of entries (the activation's recovery reads it)."""
    h = hashlib.sha256(b"nexuscrm.activation-inventory.entries.v1" + len(entries).to_bytes(8, "big"))
    for entry in entries:
        h.update(len(entry).to_bytes(2, "big"))
        for field in entry:
            data = field.encode("utf-8")
            h.update(len(data).to_bytes(4, "big") + data)
    return h.digest()


def _refuse_uncovered(found) -> None:
    if found.uncovered:
        shown = "; ".join(f"{kind} {subject}: {reason}" for kind, subject, reason in found.uncovered[:SHOWN])
        more = len(found.uncovered) - SHOWN
        raise ActivationInventoryUncovered(f"{len(found.uncovered)} supported path(s) without their selected "
                                           f"authority: {shown}" + (f"; and {more} more" if more > 0 else ""))


def inventory_freeze(attempt: ServiceCutoverAttempt, barrier_set: ServingPublicationBarrierSet, epoch: ServingEpoch,
                     actor: Actor) -> ActivationInventory:
    """Inside the hold's transaction: refuse an uncovered path, else freeze the inventory of this set."""
    found, digest, registry = inventory_compute(attempt, epoch)
    _refuse_uncovered(found)
    row = ActivationInventory.objects.create(attempt=attempt, barrier_set=barrier_set,
                                             epoch_digest=bytes(epoch.digest), registry_digest=registry,
                                             counts=found.counts(), digest=digest)
    audit_record(actor=actor, entity=row, action="activation_inventory_freeze", evidence_digest=digest,
                 reason=", ".join(f"{k}={n}" for k, n in sorted(found.counts().items())))
    return row


def inventory_check(attempt: ServiceCutoverAttempt, barrier_set: ServingPublicationBarrierSet) -> None:
    """Before the activation transaction: the set's inventory was frozen under the same path registry, and no
    authority it named is gone since (`inventory.activation_inventory_lost`: three set-based reads). The rest of
    the inventory's inputs are immutable or compared again under the activation's locks, so recomputing its whole
    digest here proved nothing more and cost the coordinator's recovery a recomputation per activation (D-320)."""
    frozen = ActivationInventory.objects.filter(barrier_set=barrier_set).first()
    if frozen is None:
        raise ActivationInventoryUncovered(f"{barrier_set} was held without a frozen activation inventory")
    registry = evidence_digest("path_registry", inventory.registry_value())[1]
    if not hmac.compare_digest(registry, bytes(frozen.registry_digest)):
        raise ActivationInventoryUncovered("the path registry differs from the one frozen when the set was held "
                                           "(another release?); nothing activated")
    partitions = list(OrderingBaseline.objects.filter(attempt=attempt).values_list("account_id", "route_key",
                                                                                 "partition"))
    lost = inventory.activation_inventory_lost(configuration_pk=attempt.configuration_id,
                                               epoch_pk=attempt.candidate_epoch_id, partitions=partitions)
    if lost:
        _refuse_uncovered(inventory.Inventory(uncovered=lost))
