"""What a final tuple commits with it, inside the caller's transaction (which holds the domain lock and the
operation): the remote job capacity release per the contract's release policy, the watermark split/merge for a
fully applied partition_replace generation, and checkpoint promotion along the parent's contiguous frontier."""
from __future__ import annotations

from django.db import transaction

from effects.delivery import watermark as intervals
from effects.models import DeliveryAttempt, DeliveryOperation, DeliveryParent, DeliveryWatermark
from effects.choices import CapacityState

from .transitions import move

RETAINED = ("UNKNOWN", "PARTIALLY_APPLIED")


def release(attempt: DeliveryAttempt, reason: str, *, transfer: bool = False) -> None:
    assert transaction.get_connection().in_atomic_block
    if attempt.capacity_state != CapacityState.RESERVED:
        return
    attempt.capacity_state = CapacityState.TRANSFERRED if transfer else CapacityState.RELEASED
    attempt.capacity_released_reason = reason
    attempt.save()


def release_all(op: DeliveryOperation, reason: str, *, transfer: bool = False) -> None:
    for attempt in op.attempts.select_for_update().filter(capacity_state=CapacityState.RESERVED):
        release(attempt, reason, transfer=transfer)


def capacity_retained(op: DeliveryOperation) -> bool:
    """Release policy: accepted_or_running -> released at the terminal observation; unknown_or_partial (and a
    full effect that failed verification) -> kept until reconciliation or an audited incident transfer."""
    return op.axis("remote_effect") in RETAINED or op.state == "final_full_unverified"


def after_final(op: DeliveryOperation, *, parent: DeliveryParent | None = None) -> None:
    if not op.state.startswith("final_"):
        return
    if not capacity_retained(op):
        release_all(op, "terminal_observation")
    if op.axis("remote_effect") == "FULLY_APPLIED" and op.axis("checkpoint") == "ELIGIBLE":
        if op.profile.mutation_policy == "partition_replace":
            apply_watermark(op)
        promote(parent or DeliveryParent.objects.select_for_update().get(pk=op.parent_id))


def apply_watermark(op: DeliveryOperation) -> None:
    """Split/merge the domain's interval map so every point of the operation's scope holds at least its
    generation (never lowering one). Runs under the domain lock, in the effect commit."""
    field = "scope_date" if op.scope_date is not None else "scope_ts"
    rng = op.scope
    touching = list(DeliveryWatermark.objects.select_for_update().filter(domain_id=op.domain_id).filter(
        **{f"{field}__overlap": rng}) | DeliveryWatermark.objects.select_for_update().filter(
        domain_id=op.domain_id, **{f"{field}__adjacent_to": rng}))
    current = [(getattr(w, field).lower, getattr(w, field).upper, (w.generation_end, w.correction_revision))
               for w in touching]
    updated = intervals.apply(current, rng.lower, rng.upper, (op.generation_end, op.correction_revision))
    if updated == intervals.normalize(current):
        return
    DeliveryWatermark.objects.filter(pk__in=[w.pk for w in touching]).delete()
    kind = type(rng)
    DeliveryWatermark.objects.bulk_create([
        DeliveryWatermark(domain_id=op.domain_id, generation_end=gen[0], correction_revision=gen[1],
                          **{field: kind(start, end, "[)")}) for start, end, gen in updated])


def promote(parent: DeliveryParent) -> int:
    """eligible -> promoted in frontier order while the next child is eligible (revision_and_frontier CAS).
    Returns the new contiguous checkpoint frontier."""
    frontier = parent.contiguous_checkpoint_frontier
    for child in parent.children.select_for_update().filter(frontier_order__gt=frontier).order_by("frontier_order"):
        if child.frontier_order != frontier + 1 or child.axis("checkpoint") != "ELIGIBLE":
            break
        move(child, child.state.replace("_eligible", "_promoted"), reason=f"frontier {frontier + 1}")
        frontier += 1
    if frontier != parent.contiguous_checkpoint_frontier:
        parent.contiguous_checkpoint_frontier = frontier
        DeliveryParent.objects.filter(pk=parent.pk).update(contiguous_checkpoint_frontier=frontier)
    return frontier
