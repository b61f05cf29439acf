"""Worker process generations (ProcessGeneration): registration, heartbeat and the durable termination that
revokes a generation's egress capability. Split from effects.services.dispatch (module size, D-260), which
re-exports these names, so callers of `dispatch.holder_register` are unchanged."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from connector.actors import Actor
from connector.services.audit import audit_record
from effects import locks
from effects.choices import HolderState
from effects.errors import AbandonRefused, PermitRefused
from effects.models import ProcessGeneration


def holder_register(*, holder_id: str) -> ProcessGeneration:
    holder, _ = ProcessGeneration.objects.get_or_create(holder_id=holder_id)
    if holder.state != HolderState.RUNNING:
        raise PermitRefused(f"holder generation {holder_id} is terminated and can never run again")
    return holder


def holder_heartbeat(*, holder_id: str) -> None:
    ProcessGeneration.objects.filter(holder_id=holder_id, state=HolderState.RUNNING).update(
        heartbeat_at=timezone.now())


@transaction.atomic
def holder_terminate(*, holder_id: str, evidence: str, actor: Actor) -> ProcessGeneration:
    """Durably record that a worker process generation is terminated and its egress capability revoked. From
    this commit on the egress adapter refuses every send from it, so its open permits may be abandoned."""
    holder = locks.holder_for_update(holder_id)
    if holder is None:
        raise AbandonRefused(f"no holder generation {holder_id}")
    if holder.state == HolderState.RUNNING:
        if not evidence.strip():
            raise AbandonRefused("termination needs evidence (supervisor receipt, process exit, egress revocation)")
        holder.terminate(at=timezone.now(), by=str(actor), evidence=evidence)
        holder.save()
        audit_record(actor=actor, entity=holder, action="holder_terminate", from_state=HolderState.RUNNING,
                     to_state=holder.state, reason=evidence)
    return holder
