"""The whole-service halt, set-based (issue 19, D-281): `halt_v2` and `confirm_halted` for a chunk of gates in one
transaction, with the locks the per-gate `gate_transition` takes.

A whole-service halt moves every gate of a service v2_serving -> halting_v2 -> v2_halted. Per gate it was two
transactions per account; here one transaction per chunk of at most CONNECTOR["HALT_CHUNK_ACCOUNTS"] accounts
takes each gate's fair advisory lock exclusive and the gate FOR UPDATE (ascending account id, as
`locks.gate_for_update` per gate: writers hold a v2_serving gate FOR SHARE with that advisory lock shared, D-209),
moves the v2_serving gates with ONE UPDATE and ONE audit INSERT, evaluates the halt blockers of the halting gates
with one query per registered blocker (`hooks.halt_blockers_of`), and moves the unblocked ones with ONE UPDATE and
ONE audit INSERT. A blocked gate stays halting_v2 and is reported with the reasons `gate_transition` gives.

The edges are read from the django-fsm declarations (`gates.fsm_edge` for halt_v2; `confirm_edge` for
confirm_halted, whose one condition must be `models.serving.halt_clear`, the very check evaluated here set-based);
the transition and fence triggers judge every row. The chunk bounds the advisory locks held at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction

from connector import hooks, locks
from connector.actors import Actor
from connector.errors import PermissionRefused, TransitionRefused
from connector.models import AccountServingGate
from connector.models.serving import halt_clear
from connector.services.gates import fsm_edge, gates_move

DEFAULT_HALT_CHUNK_ACCOUNTS = 256


def halt_chunk_accounts() -> int:
    """CONNECTOR["HALT_CHUNK_ACCOUNTS"]: gates one halt transaction locks (each with an advisory lock)."""
    return max(1, int(settings.CONNECTOR.get("HALT_CHUNK_ACCOUNTS", DEFAULT_HALT_CHUNK_ACCOUNTS)))


def confirm_edge() -> tuple[str, str]:
    """(source, target) of `confirm_halted`, read from its django-fsm declaration, which must be one explicit
    edge whose only condition is `halt_clear` (no halt blocker): the condition `halt_chunk` evaluates set-based
    through `hooks.halt_blockers_of`. Any other declaration refuses the set-based confirm."""
    declared = list(AccountServingGate.confirm_halted._django_fsm.transitions.values())
    if len(declared) != 1 or declared[0].conditions != [halt_clear] or declared[0].source in ("*", "+"):
        raise TransitionRefused("confirm_halted is not the one edge guarded by halt_clear; it cannot run set-based")
    return str(declared[0].source), str(declared[0].target)


@dataclass
class HaltChunk:
    """What one chunk transaction did: final mode per account, refusals per account (gate_transition's detail)."""

    modes: dict[int, str] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    halted: int = 0
    confirmed: int = 0


def _permitted(actor: Actor, action: str, source: str, gate: AccountServingGate) -> None:
    """django-fsm's permission check of `action` from `source` (the declaration's `permission`), without
    re-evaluating its conditions per gate (has_transition_perm would run the halt blockers again)."""
    meta = getattr(AccountServingGate, action)._django_fsm
    if actor.user is not None and not meta.has_transition_perm(gate, source, actor.user):
        raise PermissionRefused(f"{actor} may not {action}")


@transaction.atomic
def halt_chunk(*, account_ids: list[int], actor: Actor, reason: str = "") -> HaltChunk:
    """halt_v2 then confirm_halted for the gates of `account_ids` (at most `halt_chunk_accounts()`), one
    transaction: the gates' advisory locks exclusive and the gates FOR UPDATE, ascending account id
    (`locks.gates_fair_for_update`); v2_serving gates -> halting_v2 (one UPDATE, one audit INSERT); the halt
    blockers of every halting_v2 gate in one query per blocker; the unblocked -> v2_halted (one UPDATE, one audit
    INSERT). A blocked gate stays halting_v2 and is listed in `refused` with `gate_transition`'s detail; a gate in
    any other mode is left as it is (v2_halted: already done). The same gate-action guard as `gate_transition`
    (uncoordinated) refuses an account. PermissionRefused (the actor lacks the transition permission) writes
    nothing."""
    if len(set(account_ids)) > halt_chunk_accounts():
        raise TransitionRefused(f"a halt chunk holds at most {halt_chunk_accounts()} accounts (HALT_CHUNK_ACCOUNTS)")
    halt_source, halt_target = fsm_edge(AccountServingGate.halt_v2)
    confirm_source, confirm_target = confirm_edge()
    gates = locks.gates_fair_for_update(account_ids)
    out = HaltChunk()
    usable = []
    for gate in gates:  # gate_transition's uncoordinated guard, for the action the gate's mode calls for
        action = {halt_source: "halt_v2", confirm_source: "confirm_halted"}.get(gate.mode)
        frozen = hooks.gate_action_blockers(gate, action) if action else []
        if frozen:
            out.refused[gate.account_id] = "; ".join(frozen)
        else:
            usable.append(gate)
    to_halt = [g for g in usable if g.mode == halt_source]
    if to_halt:
        _permitted(actor, "halt_v2", halt_source, to_halt[0])
    out.halted = len(gates_move(gates=to_halt, action="halt_v2", source=halt_source, target=halt_target,
                                actor=actor, reason=reason))
    # The halting gates as stored now (the ones just moved included), read under the locks held.
    halting = list(AccountServingGate.objects.filter(pk__in=[g.pk for g in usable], mode=confirm_source)
                   .order_by("account_id")) if out.halted or any(g.mode == confirm_source for g in usable) else []
    blockers = hooks.halt_blockers_of(halting)
    for gate in halting:
        if blockers[gate.pk]:
            out.refused[gate.account_id] = f"confirm_halted is blocked: {'; '.join(blockers[gate.pk])}"
    clear = [g for g in halting if not blockers[g.pk]]
    if clear:
        _permitted(actor, "confirm_halted", confirm_source, clear[0])
    out.confirmed = len(gates_move(gates=clear, action="confirm_halted", source=confirm_source,
                                   target=confirm_target, actor=actor, reason=reason))
    modes = {g.account_id: g.mode for g in gates}
    modes.update({g.account_id: confirm_source for g in halting})
    modes.update({g.account_id: confirm_target for g in clear})
    out.modes = modes
    return out
