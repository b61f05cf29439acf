"""The one transition helper of delivery operations, shared by submission (execution) and finalization so that
neither imports the other."""
from __future__ import annotations

from connector.actors import Actor
from connector.services.audit import audit_record
from effects.models import DeliveryOperation

SYSTEM = Actor.system("delivery")


def move(op: DeliveryOperation, target: str, *, actor: Actor = SYSTEM, reason: str = "",
         evidence: bytes | None = None) -> None:
    """One automatic transition: the django-fsm method generated from the contract, revision + 1, audit."""
    source = op.state
    getattr(op, f"to_{target}")()
    op.revision += 1
    op.save()
    audit_record(actor=actor, entity=op, action="delivery_transition", from_state=source, to_state=target,
                 fence=op.revision, evidence_digest=evidence, reason=reason)
