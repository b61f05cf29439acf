"""The whole-service halt is set-based (issue 19, D-281): `gate_sets.halt_chunk` moves a chunk of gates
v2_serving -> halting_v2 -> v2_halted in one transaction. These tests pin that it agrees with the per-gate
`gate_transition` path on every source mode (same rows, same audit rows), that a gate with a halt blocker is not
confirmed (and is refused with the per-gate path's detail), that the set form of the open-permit blocker agrees
with its per-gate form, that the chunk is bounded, and that its statement count does not grow with the chunk.

Proves: CV2-11-008, CV2-03-013, CV2-14-005, CV2-14-007 (set-based form)
"""
from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from connector import hooks
from connector.actors import Actor
from connector.choices import GATE_TRANSITIONS, GateMode
from connector.errors import TransitionRefused
from connector.models import AccountServingGate, AuditRecord
from connector.services import gate_sets, serving
from connector.services import gates as gate_services
from tests.connector.test_activation_set_based import _activation_world, every_mode  # noqa: F401 (fixture)

ACTOR = Actor.system("halt-set-test")
REASON = "set-based halt test"


class _Rollback(Exception):
    pass


def _gate_row(account_id: int) -> tuple:
    gate = AccountServingGate.objects.get(account_id=account_id)
    return gate.mode, gate.fence, gate.epoch_id, None if gate.epoch_digest is None else bytes(gate.epoch_digest)


def _audits(after_pk: int) -> list[tuple]:
    return list(AuditRecord.objects.filter(pk__gt=after_pk).order_by("pk").values_list(
        "actor", "entity_type", "entity_id", "action", "from_state", "to_state", "fence", "evidence_digest",
        "reason"))


def _per_gate(account_id: int) -> tuple[tuple, list[tuple], str | None]:
    """What the per-gate path (halt_all before D-281) wrote for one account, rolled back."""
    last = AuditRecord.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    refused = None
    try:
        with transaction.atomic():
            gate = AccountServingGate.objects.get(account_id=account_id)
            try:
                for action, source in (("halt_v2", GateMode.V2_SERVING), ("confirm_halted", GateMode.HALTING_V2)):
                    if gate.mode == source:
                        gate = gate_services.gate_transition(account_id=account_id, action=action,
                                                             expected_fence=gate.fence, actor=ACTOR, reason=REASON)
            except TransitionRefused as exc:
                refused = exc.detail
            raise _Rollback((_gate_row(account_id), _audits(last)))
    except _Rollback as done:
        row, audits = done.args[0]
    return row, audits, refused


def _set_based(account_ids: list[int]) -> tuple[dict, list[tuple], gate_sets.HaltChunk]:
    last = AuditRecord.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    try:
        with transaction.atomic():
            result = gate_sets.halt_chunk(account_ids=account_ids, actor=ACTOR, reason=REASON)
            raise _Rollback(({a: _gate_row(a) for a in account_ids}, _audits(last), result))
    except _Rollback as done:
        return done.args[0]


def test_set_based_halt_agrees_with_the_per_gate_transitions_on_every_mode(every_mode):  # noqa: F811
    """For every gate mode as source, `halt_chunk` leaves the gate exactly as halt_v2 then confirm_halted through
    `gate_transition` did (mode, fence, epoch, digest) with the same audit rows in the same order (actor, action,
    from, to, fence, reason), and moves only v2_serving and halting_v2 gates. The edges are the django-fsm
    declarations' and edges of the trigger table. (STYLE R31, D-281)"""
    by_mode, _candidate = every_mode
    assert gate_services.fsm_edge(AccountServingGate.halt_v2) in GATE_TRANSITIONS
    assert gate_sets.confirm_edge() == (GateMode.HALTING_V2, GateMode.V2_HALTED) in GATE_TRANSITIONS
    for mode, account_id in by_mode.items():
        before = _gate_row(account_id)
        row, audits, refused = _per_gate(account_id)
        rows, set_audits, result = _set_based([account_id])
        assert rows[account_id] == row, mode
        assert set_audits == audits, mode
        assert refused is None and result.refused == {}, mode
        moved = mode in (GateMode.V2_SERVING, GateMode.HALTING_V2)
        assert (row[0] == GateMode.V2_HALTED) == (moved or mode == GateMode.V2_HALTED), mode
        assert (row == before) == (not moved), mode
        assert result.modes == {account_id: row[0]}
    # All eight in one chunk: the same rows as eight per-gate runs.
    rows, _audits_all, result = _set_based(sorted(by_mode.values()))
    assert rows == {a: _per_gate(a)[0] for a in by_mode.values()}
    assert (result.halted, result.confirmed) == (1, 2)


def test_a_gate_with_a_halt_blocker_is_not_confirmed_and_is_refused_as_per_gate(db):
    """A halt blocker registered without a set form (asked gate by gate) keeps its gate halting_v2: the chunk
    confirms the others, lists the blocked account with the detail gate_transition raises, and after the blocker
    clears a rerun confirms it. (CV2-11-008)"""
    world, epoch = _activation_world("hb-", 3)
    serving.epoch_activate_first(epoch_pk=epoch.pk, actor=ACTOR)
    accounts = sorted(a.pk for a in world.accounts)
    blocked = accounts[1]
    blocker = hooks.register_halt_blocker(lambda gate: ["1 open permit"] if gate.account_id == blocked else [])
    try:
        _row, _audits, refused = _per_gate(blocked)
        assert refused == "confirm_halted is blocked: 1 open permit"
        result = gate_sets.halt_chunk(account_ids=accounts, actor=ACTOR, reason=REASON)
        assert result.refused == {blocked: refused}
        assert result.modes == {a: GateMode.HALTING_V2 if a == blocked else GateMode.V2_HALTED for a in accounts}
        assert _gate_row(blocked)[0] == GateMode.HALTING_V2
    finally:
        hooks._HALT_BLOCKERS.remove(blocker)
    result = gate_sets.halt_chunk(account_ids=accounts, actor=ACTOR, reason=REASON)
    assert (result.halted, result.confirmed, result.refused) == (0, 1, {})
    assert {_gate_row(a)[0] for a in accounts} == {GateMode.V2_HALTED}


def test_an_open_permit_blocks_the_set_based_confirm_and_its_set_form_agrees(db):
    """A real granted DispatchPermit: the set form of the open-permit blocker (one query for the chunk) gives, gate
    by gate, the reasons of the per-gate form, and the gate stays halting_v2 with the per-gate detail while the
    other gates are confirmed. (CV2-11-008)"""
    from effects.selectors import open_permit_reasons_of
    from effects.services.dispatch import open_permit_reasons
    from tests.effects.helpers import acquire, author, build_push_world

    world = build_push_world()
    account = world.accounts[0]
    author(account)
    acquire(account=account)
    accounts = sorted(a.pk for a in world.accounts)
    result = gate_sets.halt_chunk(account_ids=accounts, actor=ACTOR, reason=REASON)
    gates = list(AccountServingGate.objects.filter(account_id__in=accounts).order_by("account_id"))
    per_gate = {g.pk: open_permit_reasons(g) for g in gates}
    assert per_gate[next(g.pk for g in gates if g.account_id == account.pk)]
    assert {pk: r for pk, r in per_gate.items() if r} == open_permit_reasons_of(gates)
    assert hooks.halt_blockers_of(gates) == {g.pk: hooks.halt_blockers(g) for g in gates}
    gate = next(g for g in gates if g.account_id == account.pk)
    assert gate.mode == GateMode.HALTING_V2
    assert result.refused == {account.pk: f"confirm_halted is blocked: {'; '.join(hooks.halt_blockers(gate))}"}
    assert all(g.mode == GateMode.V2_HALTED for g in gates if g.pk != gate.pk)


def test_a_chunk_above_the_declared_size_is_refused_before_any_lock(db, settings):
    """More accounts than CONNECTOR["HALT_CHUNK_ACCOUNTS"] in one chunk is refused and writes nothing: the bound
    keeps the advisory locks one transaction holds below the lock table's capacity (D-209, D-281)."""
    world, epoch = _activation_world("hc-", 3)
    serving.epoch_activate_first(epoch_pk=epoch.pk, actor=ACTOR)
    settings.CONNECTOR = {**settings.CONNECTOR, "HALT_CHUNK_ACCOUNTS": 2}
    with pytest.raises(TransitionRefused, match="at most 2 accounts"):
        gate_sets.halt_chunk(account_ids=[a.pk for a in world.accounts], actor=ACTOR)
    assert {_gate_row(a.pk)[0] for a in world.accounts} == {GateMode.V2_SERVING}


def _chunk_statements(prefix: str, accounts: int) -> int:
    world, epoch = _activation_world(prefix, accounts)
    serving.epoch_activate_first(epoch_pk=epoch.pk, actor=ACTOR)
    with CaptureQueriesContext(connection) as queries:
        result = gate_sets.halt_chunk(account_ids=[a.pk for a in world.accounts], actor=ACTOR, reason=REASON)
    assert result.confirmed == accounts
    return len(queries)


# Measured: savepoint/transaction bookkeeping aside, the advisory locks, the gates FOR UPDATE, the halt UPDATE and
# its audit INSERT, the halting gates reread, one query per halt blocker with a set form (open permits), the
# confirm UPDATE and its audit INSERT.
HALT_CHUNK_STATEMENTS = 10


def test_halt_chunk_statement_count_does_not_grow_with_the_chunk(db):
    """halt_chunk runs the same number of statements for 3 and for 30 accounts (R27, R31)."""
    assert _chunk_statements("s3-", 3) == _chunk_statements("s30-", 30) <= HALT_CHUNK_STATEMENTS


def test_the_set_based_confirm_refuses_a_declaration_it_does_not_evaluate(monkeypatch):
    """If confirm_halted's declaration gained a condition (or lost halt_clear), the set-based confirm would not
    evaluate it: `confirm_edge` then refuses, so the statement cannot drift from the django-fsm table. (R31)"""
    (declared,) = AccountServingGate.confirm_halted._django_fsm.transitions.values()
    assert gate_sets.confirm_edge() == (declared.source, declared.target)
    monkeypatch.setattr(declared, "conditions", [*declared.conditions, lambda gate: gate.fence > 0])
    with pytest.raises(TransitionRefused, match="halt_clear"):
        gate_sets.confirm_edge()
    monkeypatch.setattr(declared, "conditions", [])
    with pytest.raises(TransitionRefused, match="halt_clear"):
        gate_sets.confirm_edge()
