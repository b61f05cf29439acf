"""Fenced transitions of AccountServingGate and CredentialGenerationDispatchGate.

Each service locks the one gate row FOR UPDATE, compares the caller's observed fence (a stale caller writes
nothing), checks the transition and its guards with django-fsm, applies it (the fence advances by one), and
writes the audit row, all in one transaction. The two coordinator transitions that bind an epoch
(`activate_first`, `activate_successor`) belong to the activation transactions; they apply them to every gate of
the service at once through `gates_bind_epoch` (one UPDATE, one audit INSERT; STYLE R31, D-210).
"""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from django_fsm import TransitionNotAllowed, can_proceed, has_transition_perm

from connector import hooks, locks
from connector.actors import Actor
from connector.errors import FenceStale, PermissionRefused, TransitionRefused
from connector.models import AccountServingGate, CredentialGeneration, CredentialGenerationDispatchGate, ServingEpoch
from connector.services.audit import audit_record, audit_records

GATE_ACTIONS = (
    "halt_v1", "abort_halt_v1", "stop_v1", "certify_drained", "cold_abort", "begin_validation", "restore_v1",
    "halt_v2", "confirm_halted", "resume_predecessor",
)
CREDENTIAL_GATE_ACTIONS = ("revoke", "reenable")
# The transitions that bind a gate to an epoch (AccountServingGate._bind): whole-service activations apply them
# set-based. Their edges are read from the django-fsm declarations (fsm_edge), never restated here.
BINDING_ACTIONS = ("activate_first", "activate_successor")

# AccountServingGate._bind as one statement over the locked gates: the columns the django-fsm transition sets
# (mode, epoch, epoch digest, fence + 1, and changed_at as auto_now would). `g.mode = source AND g.fence = v.fence`
# is the same second line of defence as ConcurrentTransitionMixin's `WHERE mode = <old>`; the transition and fence
# triggers (connector_enforce_transition, connector_fenced_row) fire for every row and stay the authority.
GATES_BIND_SQL = """
UPDATE connector_accountservinggate AS g
   SET mode = %(target)s, epoch_id = %(epoch_pk)s, epoch_digest = %(epoch_digest)s::bytea, fence = g.fence + 1,
       changed_at = %(changed_at)s::timestamptz
  FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[]) AS v(id, fence)
 WHERE g.id = v.id AND g.mode = %(source)s AND g.fence = v.fence
RETURNING g.account_id, g.id, g.fence
"""

# The transitions whose django-fsm body is `_advance` alone (mode and fence + 1; epoch unchanged) and that whole-
# service coordinators apply to every frozen gate at once: V1 shutdown's per-gate steps (D-208). Each edge is
# read from its declaration (fsm_edge); a test pins, for every action here, that the instance transition changes
# exactly mode and fence, so GATES_ADVANCE_SQL writes what the instance would.
ADVANCE_ACTIONS = ("halt_v1", "abort_halt_v1", "stop_v1", "certify_drained")

# AccountServingGate._advance as one statement over the locked gates (same defence in depth as GATES_BIND_SQL).
GATES_ADVANCE_SQL = """
UPDATE connector_accountservinggate AS g
   SET mode = %(target)s, fence = g.fence + 1, changed_at = %(changed_at)s::timestamptz
  FROM unnest(%(ids)s::bigint[], %(fences)s::bigint[]) AS v(id, fence)
 WHERE g.id = v.id AND g.mode = %(source)s AND g.fence = v.fence
RETURNING g.account_id, g.id, g.fence
"""


def _apply(row, action: str, *, expected_fence: int | None, actor: Actor, blockers=list) -> str:
    """`blockers` names why a guard refused; it is called only then (D-381: the confirm that succeeds reads the
    open-permit set through the transition's own conditions, not once more for a message it does not need)."""
    if expected_fence is not None and row.fence != expected_fence:
        raise FenceStale(f"{row} was acted on with fence {expected_fence}; it now holds fence {row.fence}")
    method = getattr(row, action)
    if not can_proceed(method, check_conditions=False):
        raise TransitionRefused(f"{action} is not allowed from {row.mode}")
    from_state = row.mode
    if actor.user is not None:
        if not can_proceed(method):
            raise TransitionRefused(f"{action} is blocked: {'; '.join(blockers()) or 'guard failed'}")
        if not has_transition_perm(method, actor.user):
            raise PermissionRefused(f"{actor} may not {action}")
    try:
        method()  # django-fsm evaluates the transition's conditions here, under the caller's lock (D-384)
    except TransitionNotAllowed:
        raise TransitionRefused(f"{action} is blocked: {'; '.join(blockers()) or 'guard failed'}") from None
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
    blockers = ((lambda: hooks.halt_blockers(gate)) if action == "confirm_halted"
                else (lambda: hooks.resume_blockers(gate)) if action == "resume_predecessor" else list)
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
    from_state = _apply(gate, action, expected_fence=expected_fence, actor=actor)
    evidence = hooks.revocation_evidence(gate) if action == "revoke" else []
    audit_record(actor=actor, entity=gate, action=f"credential_gate_{action}", from_state=from_state,
                 to_state=gate.mode, fence=gate.fence,
                 reason="; ".join([reason, *evidence]) if evidence else reason)
    return gate


def fsm_edge(method) -> tuple[str, str]:
    """The (source, target) of a django-fsm transition declared with exactly one explicit source and no
    conditions: the only kind a set-based statement may apply, since it cannot evaluate per-row guards."""
    declared = list(method._django_fsm.transitions.values())
    if len(declared) != 1 or declared[0].conditions or declared[0].source in ("*", "+"):
        raise TransitionRefused(f"{method.__name__} is not a single unconditional edge; it cannot run set-based")
    return str(declared[0].source), str(declared[0].target)


def gates_bind_epoch(*, gates: list[locks.GateRow], action: str, epoch: ServingEpoch, actor: Actor,
                     evidence_digest: bytes) -> int:
    """Apply the binding transition `action` (BINDING_ACTIONS) to every gate of `gates`, which the caller holds
    FOR UPDATE (locks.gates_for_update, ascending account id) and has checked: ONE statement (D-279) moves them all
    from the transition's source to its target naming `epoch` with a new fence each (GATES_BIND_SQL) and writes,
    from the rows it moved, the audit row `gate_<action>` of each (from, to, new fence, evidence digest), in
    account order (audit.AUDIT_MOVED_SQL). Returns the number of gates moved. Raises TransitionRefused before any
    write if a gate is not in the source mode, and after the statement if fewer gates moved than were given (a
    gate changed under its lock: impossible while the caller holds the locks): the caller's transaction then rolls
    back and nothing commits."""
    assert transaction.get_connection().in_atomic_block, "runs inside the activation transaction"
    if action not in BINDING_ACTIONS:
        raise TransitionRefused(f"{action!r} is not a binding transition; allowed: {', '.join(BINDING_ACTIONS)}")
    source, target = fsm_edge(getattr(AccountServingGate, action))
    wrong = [g for g in gates if g.mode != source]
    if wrong:
        raise TransitionRefused(f"{action} is not allowed from "
                                + ", ".join(f"{g.account_id}={g.mode}" for g in wrong[:10]))
    if not gates:
        return 0
    bind = {"source": source, "target": target, "epoch_pk": epoch.pk, "epoch_digest": bytes(epoch.digest),
            "changed_at": timezone.now(), "ids": [g.pk for g in gates], "fences": [g.fence for g in gates]}
    # from_state/to_state of the audit rows are the edge's: the UPDATE's WHERE and the transition trigger hold
    # every moved row to exactly that edge.
    written = audit_records(actor=actor, model=AccountServingGate, action=f"gate_{action}", from_state=source,
                            to_state=target, evidence_digest=evidence_digest,
                            moved=(GATES_BIND_SQL, bind, "account_id"))
    if written != len(gates):
        # Cannot happen under the caller's FOR UPDATE; raising rolls the whole activation back.
        raise TransitionRefused(f"{len(gates) - written} gate(s) changed under their lock; nothing moved")
    return written


def gates_advance(*, gates: list[AccountServingGate], action: str, actor: Actor, evidence_digest: bytes | None,
                  reason: str = "") -> list[tuple[int, int, int]]:
    """Apply the unconditional transition `action` (ADVANCE_ACTIONS) to the gates of `gates` that are in its source
    mode, which the caller holds FOR UPDATE (locks.gates_for_update, ascending account id) inside its transaction:
    ONE UPDATE moves them (mode, fence + 1, changed_at) and ONE INSERT writes the audit row `gate_<action>` of each
    (from, to, new fence, evidence digest, reason), in account order. Gates in another mode are left as they are
    (a resumed phase skips what it already moved; the caller decides which other modes it tolerates). Returns
    (account id, gate pk, new fence) of the moved gates. Raises TransitionRefused if a gate changed under its lock
    (impossible while the caller holds it); the caller's transaction then rolls back. (STYLE R31, D-208)"""
    assert transaction.get_connection().in_atomic_block, "runs inside the coordinator's transaction"
    if action not in ADVANCE_ACTIONS:
        raise TransitionRefused(f"{action!r} is not a set-based advance; allowed: {', '.join(ADVANCE_ACTIONS)}")
    source, target = fsm_edge(getattr(AccountServingGate, action))
    return gates_move(gates=[g for g in gates if g.mode == source], action=action, source=source, target=target,
                      actor=actor, evidence_digest=evidence_digest, reason=reason)


def gates_move(*, gates, action: str, source: str, target: str, actor: Actor, evidence_digest: bytes | None = None,
               reason: str = "") -> list[tuple[int, int, int]]:
    """ONE UPDATE moving `gates` (held FOR UPDATE by the caller's transaction, all in `source`) to `target` with
    fence + 1, and ONE INSERT of their audit rows `gate_<action>`, in account order; the caller has read the edge
    from its django-fsm declaration and judged any condition. Returns (account id, gate pk, new fence). Raises
    TransitionRefused if a gate changed under its lock (impossible while the caller holds it): the caller's
    transaction then rolls back. Used by gates_advance (V1 shutdown, D-208) and gate_sets.halt_chunk (D-281)."""
    if not gates:
        return []
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(GATES_ADVANCE_SQL, {"source": source, "target": target, "changed_at": timezone.now(),
                                           "ids": [g.pk for g in gates], "fences": [g.fence for g in gates]})
        moved = sorted(cursor.fetchall())
    if len(moved) != len(gates):
        raise TransitionRefused(f"{len(gates) - len(moved)} gate(s) changed under their lock; nothing moved")
    audit_records(actor=actor, model=AccountServingGate, rows=[(pk, fence) for _, pk, fence in moved],
                  action=f"gate_{action}", from_state=source, to_state=target, evidence_digest=evidence_digest,
                  reason=reason)
    return moved
