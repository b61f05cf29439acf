"""Fenced transitions of AccountServingGate and CredentialGenerationDispatchGate.

Each service locks the one gate row FOR UPDATE, compares the caller's observed fence (a stale caller writes
nothing), checks the transition and its guards with django-fsm, applies it (the fence advances by one), and
writes the audit row, all in one transaction. The two coordinator transitions that bind an epoch
(`activate_first`, `activate_successor`) belong to the activation transactions, not to this module.
"""
from __future__ import annotations

from django.db import transaction
from django_fsm import can_proceed, has_transition_perm

from connector import hooks, locks
from connector.actors import Actor
from connector.errors import FenceStale, PermissionRefused, TransitionRefused
from connector.models import AccountServingGate, CredentialGeneration, CredentialGenerationDispatchGate
from connector.services.audit import audit_record

GATE_ACTIONS = (
    "halt_v1", "abort_halt_v1", "stop_v1", "certify_drained", "cold_abort", "begin_validation", "restore_v1",
    "halt_v2", "confirm_halted", "resume_predecessor",
)
CREDENTIAL_GATE_ACTIONS = ("revoke", "reenable")


def _apply(row, action: str, *, expected_fence: int | None, actor: Actor, blockers: list[str]) -> str:
    if expected_fence is not None and row.fence != expected_fence:
        raise FenceStale(f"{row} was acted on with fence {expected_fence}; it now holds fence {row.fence}")
    method = getattr(row, action)
    if not can_proceed(method, check_conditions=False):
        raise TransitionRefused(f"{action} is not allowed from {row.mode}")
    if not can_proceed(method):
        raise TransitionRefused(f"{action} is blocked: {'; '.join(blockers) or 'guard failed'}")
    if actor.user is not None and not has_transition_perm(method, actor.user):
        raise PermissionRefused(f"{actor} may not {action}")
    from_state = row.mode
    method()
    row.save()
    return from_state


@transaction.atomic
def gate_transition(*, account_id: int, action: str, expected_fence: int | None, actor: Actor, reason: str = "",
                    evidence_digest: bytes | None = None, coordinated: bool = False) -> AccountServingGate:
    """Apply one named gate transition (GATE_ACTIONS). Raises FenceStale, TransitionRefused or
    PermissionRefused and writes nothing when refused. `coordinated` is for cutover coordinators only: without it
    a V1-path action on a gate frozen by an open service cutover is refused."""
    if action not in GATE_ACTIONS:
        raise TransitionRefused(f"{action!r} is not a gate action; allowed: {', '.join(GATE_ACTIONS)}")
    gate = locks.gate_for_update(account_id)
    if not coordinated:
        frozen = hooks.gate_action_blockers(gate, action)
        if frozen:
            raise TransitionRefused("; ".join(frozen))
    blockers = (hooks.halt_blockers(gate) if action == "confirm_halted"
                else hooks.resume_blockers(gate) if action == "resume_predecessor" else [])
    from_state = _apply(gate, action, expected_fence=expected_fence, actor=actor, blockers=blockers)
    audit_record(actor=actor, entity=gate, action=f"gate_{action}", from_state=from_state, to_state=gate.mode,
                 fence=gate.fence, evidence_digest=evidence_digest, reason=reason)
    return gate


@transaction.atomic
def credential_gate_transition(*, generation_id: str, action: str, expected_fence: int | None, actor: Actor,
                               reason: str = "") -> CredentialGenerationDispatchGate:
    """Revoke or explicitly re-enable one credential generation's dispatch (new fence each time). Never touches
    the CredentialGeneration itself (CV2-04-004) nor any existing permit."""
    if action not in CREDENTIAL_GATE_ACTIONS:
        raise TransitionRefused(f"{action!r} is not a credential gate action")
    if action == "reenable" and not reason.strip():
        raise TransitionRefused("re-enablement is an explicit authorized decision and needs a reason")
    generation = CredentialGeneration.objects.filter(generation_id=generation_id).first()
    if generation is None:
        raise TransitionRefused(f"credential generation {generation_id} is absent")
    gate = locks.credential_gate_for_update(generation.pk)
    if action == "revoke":
        hooks.revocation_guard(gate)
    from_state = _apply(gate, action, expected_fence=expected_fence, actor=actor, blockers=[])
    evidence = hooks.revocation_evidence(gate) if action == "revoke" else []
    audit_record(actor=actor, entity=gate, action=f"credential_gate_{action}", from_state=from_state,
                 to_state=gate.mode, fence=gate.fence,
                 reason="; ".join([reason, *evidence]) if evidence else reason)
    return gate
