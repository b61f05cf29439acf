"""The audit write path. Called inside the transaction of the state change it records (STYLE R12)."""
from __future__ import annotations

from django.db import transaction

from connector.actors import Actor
from connector.models import AuditRecord


def audit_record(*, actor: Actor, entity, action: str, from_state: str = "", to_state: str = "",
                 fence: int | None = None, evidence_digest: bytes | None = None, reason: str = "") -> AuditRecord:
    assert transaction.get_connection().in_atomic_block, "audit rows are written inside the audited transaction"
    return AuditRecord.objects.create(
        actor=str(actor), actor_user_id=getattr(actor.user, "pk", None), entity_type=type(entity)._meta.label, entity_id=str(entity.pk), action=action,
        from_state=from_state, to_state=to_state, fence=fence, evidence_digest=evidence_digest, reason=reason)
