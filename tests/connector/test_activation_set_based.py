"""Whole-service activation is set-based (issue 19, D-210): one UPDATE moves every gate and one INSERT writes their
audit rows. These tests pin that the statement applies exactly the django-fsm edge (and nothing else), that the
database triggers still judge every row, that the audit rows are the ones the per-gate path wrote, that the
statement count does not grow with the account set, and that an account set above the declared maximum is refused
before anything is written.

Proves: CV2-02-039, CV2-02-040, CV2-03-013, CV2-14-005, CV2-14-007 (set-based form)
"""
from __future__ import annotations

import copy

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from connector import locks
from connector.actors import Actor
from connector.choices import GATE_TRANSITIONS, EpochState, GateMode
from connector.demo import build_owners, walk_gates_to_validating
from connector.errors import ERROR_CATALOG, ActivationCardinalityExceeded, TransitionRefused
from connector.models import AccountServingGate, AuditRecord, ServingEpoch
from connector.services import gates as gate_services
from connector.services import serving

ACTOR = Actor.system("set-based-test")
# Gate modes by the transitions (through the services) that lead there from v1_serving.
V1_WALKS = {
    GateMode.V1_SERVING: (),
    GateMode.HALTING_V1: ("halt_v1",),
    GateMode.V1_STOPPED: ("halt_v1", "stop_v1"),
    GateMode.V1_DRAINED: ("halt_v1", "stop_v1", "certify_drained"),
    GateMode.V2_VALIDATING: ("halt_v1", "stop_v1", "certify_drained", "begin_validation"),
}
V2_WALKS = {GateMode.V2_SERVING: (), GateMode.HALTING_V2: ("halt_v2",),
            GateMode.V2_HALTED: ("halt_v2", "confirm_halted")}


class _Rollback(Exception):
    pass


def _verified(world, epoch_id: str) -> ServingEpoch:
    epoch = serving.epoch_prepare_from_owners(epoch_id=epoch_id, actor=ACTOR,
                                              configuration_generation_id=world.configuration.generation_id)
    return serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)


def _step(account_id: int, action: str) -> None:
    gate_services.gate_transition(account_id=account_id, action=action, expected_fence=None, actor=ACTOR,
                                  reason="set-based activation test")


@pytest.fixture
def every_mode(db):
    """One gate in each of the eight gate modes (reached through the services only), and a verified epoch."""
    modes = list(GateMode)
    world = build_owners("sb-", account_keys=tuple(f"mode-{i}" for i in range(len(modes))))
    by_mode = dict(zip(modes, (a.pk for a in world.accounts), strict=True))
    first = _verified(world, "sb-epoch-first")
    candidate = _verified(world, "sb-epoch-candidate")
    for mode, account_id in by_mode.items():
        for action in V1_WALKS.get(mode, V1_WALKS[GateMode.V2_VALIDATING]):
            _step(account_id, action)
    v2 = [by_mode[m] for m in V2_WALKS]
    with transaction.atomic():
        locked = locks.epoch_for_update(first.pk)
        serving.activate_first_locked(epoch=locked, account_ids=v2, actor=ACTOR, observed=bytes(locked.digest))
    for mode, walk in V2_WALKS.items():
        for action in walk:
            _step(by_mode[mode], action)
    assert {AccountServingGate.objects.get(account_id=a).mode: a for a in by_mode.values()} == by_mode
    return by_mode, candidate


def test_set_based_activation_moves_exactly_the_fsm_edge_from_every_mode(every_mode):
    """For every gate mode as source, the set-based first activation either moves the gate exactly as the
    django-fsm transition `activate_first` does (same mode, epoch, digest and fence; everything else untouched)
    or refuses and writes nothing, and it moves a gate exactly when django-fsm allows it. (R31, D-210)"""
    by_mode, candidate = every_mode
    source, target = gate_services.fsm_edge(AccountServingGate.activate_first)
    assert (source, target) in GATE_TRANSITIONS  # the database trigger's table has the same edge
    for mode, account_id in by_mode.items():
        before = AccountServingGate.objects.get(account_id=account_id)
        expected = copy.deepcopy(before)
        fsm_allows = mode in AccountServingGate.activate_first._django_fsm.transitions
        audits = AuditRecord.objects.count()
        try:
            with transaction.atomic():
                locked = locks.epoch_for_update(candidate.pk)
                if fsm_allows:
                    expected.activate_first(epoch=locked)
                    serving.activate_first_locked(epoch=locked, account_ids=[account_id], actor=ACTOR,
                                                  observed=bytes(locked.digest))
                    after = AccountServingGate.objects.get(account_id=account_id)
                    moved = {f.attname: getattr(after, f.attname) for f in AccountServingGate._meta.concrete_fields
                             if f.attname != "changed_at"}
                    wanted = {f.attname: getattr(expected, f.attname) for f in AccountServingGate._meta.concrete_fields
                              if f.attname != "changed_at"}
                    moved["epoch_digest"] = bytes(moved["epoch_digest"])
                    assert moved == wanted, mode
                    assert after.changed_at > before.changed_at
                    assert AuditRecord.objects.count() == audits + 2  # the epoch's and the gate's
                else:
                    with pytest.raises(TransitionRefused, match=f"every gate must be {source}; not ready: "
                                                                f"{account_id}={mode}"):
                        serving.activate_first_locked(epoch=locked, account_ids=[account_id], actor=ACTOR,
                                                      observed=bytes(locked.digest))
                raise _Rollback
        except _Rollback:
            pass
        assert fsm_allows == (mode == GateMode.V2_VALIDATING)
        assert AccountServingGate.objects.get(account_id=account_id).fence == before.fence
        assert ServingEpoch.objects.get(pk=candidate.pk).state == EpochState.VERIFIED


def test_the_set_based_statement_itself_matches_only_the_fsm_source(every_mode):
    """The UPDATE's own WHERE clause moves only rows in the transition's source mode with the fence the caller read
    under its lock: given every gate, it returns exactly the v2_validating one. (R31, D-210)"""
    by_mode, candidate = every_mode
    source, target = gate_services.fsm_edge(AccountServingGate.activate_first)
    gates = list(AccountServingGate.objects.filter(account_id__in=by_mode.values()).order_by("account_id"))
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(gate_services.GATES_BIND_SQL, {
                "source": source, "target": target, "epoch_pk": candidate.pk,
                "epoch_digest": bytes(candidate.digest), "changed_at": "2026-12-04T00:00:00Z",
                "ids": [g.pk for g in gates], "fences": [g.fence for g in gates]})
            assert [row[0] for row in cursor.fetchall()] == [by_mode[GateMode.V2_VALIDATING]]
            raise _Rollback
    except _Rollback:
        pass
    validating = next(g for g in gates if g.mode == GateMode.V2_VALIDATING)
    with transaction.atomic(), connection.cursor() as cursor:  # a stale fence matches nothing
        cursor.execute(gate_services.GATES_BIND_SQL, {
            "source": source, "target": target, "epoch_pk": candidate.pk, "epoch_digest": bytes(candidate.digest),
            "changed_at": "2026-12-04T00:00:00Z", "ids": [validating.pk], "fences": [validating.fence - 1]})
        assert cursor.fetchall() == []


def test_the_transition_trigger_still_judges_every_row_of_the_set_based_update(every_mode):
    """The database stays the authority: the same statement asked to move v1_serving gates to v2_serving (an edge
    that is not in the seed's table) is refused by the row trigger. (D-210)"""
    by_mode, candidate = every_mode
    gate = AccountServingGate.objects.get(account_id=by_mode[GateMode.V1_SERVING])
    with pytest.raises(IntegrityError, match="transition v1_serving -> v2_serving is not allowed"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(gate_services.GATES_BIND_SQL, {
                "source": GateMode.V1_SERVING, "target": GateMode.V2_SERVING, "epoch_pk": candidate.pk,
                "epoch_digest": bytes(candidate.digest), "changed_at": "2026-12-04T00:00:00Z",
                "ids": [gate.pk], "fences": [gate.fence]})


def test_only_single_unconditional_edges_run_set_based():
    """A transition with a guard (confirm_halted) cannot be applied by a statement that cannot evaluate it; the
    binding transitions are single unconditional edges of the trigger table. (R31)"""
    with pytest.raises(TransitionRefused):
        gate_services.fsm_edge(AccountServingGate.confirm_halted)
    for action in gate_services.BINDING_ACTIONS:
        assert gate_services.fsm_edge(getattr(AccountServingGate, action)) in GATE_TRANSITIONS


def _activation_world(prefix: str, accounts: int):
    world = build_owners(prefix, account_keys=tuple(f"acct-{i}" for i in range(accounts)))
    epoch = _verified(world, f"{prefix}epoch")
    walk_gates_to_validating(world, ACTOR)
    return world, epoch


def test_first_activation_writes_one_audit_row_per_gate_as_the_per_gate_path_did(db):
    """Every gate names the epoch with its fence advanced by one, and each has the audit row the per-gate path
    wrote: actor, `gate_activate_first`, v2_validating -> v2_serving, the new fence, the epoch digest as evidence,
    in account order. (R12, CV2-02-039)"""
    world, epoch = _activation_world("au-", 4)
    fences = {g.account_id: g.fence for g in AccountServingGate.objects.filter(
        account_id__in=[a.pk for a in world.accounts])}
    actor = Actor.system("auditor")
    active = serving.epoch_activate_first(epoch_pk=epoch.pk, actor=actor)
    gates = list(AccountServingGate.objects.filter(account_id__in=fences).order_by("account_id"))
    assert all(g.mode == GateMode.V2_SERVING and g.epoch_id == active.pk and bytes(g.epoch_digest) == bytes(
        active.digest) and g.fence == fences[g.account_id] + 1 for g in gates)
    rows = list(AuditRecord.objects.filter(action="gate_activate_first").order_by("pk"))
    assert [(r.actor, r.actor_user_id, r.entity_type, r.entity_id, r.from_state, r.to_state, r.fence,
             bytes(r.evidence_digest), r.reason) for r in rows] == [
        (str(actor), None, "connector.AccountServingGate", str(g.pk), GateMode.V2_VALIDATING, GateMode.V2_SERVING,
         g.fence, bytes(active.digest), "") for g in gates]
    (epoch_row,) = AuditRecord.objects.filter(action="epoch_activate_first")
    assert epoch_row.pk < rows[0].pk and (epoch_row.from_state, epoch_row.to_state) == ("verified", "active")


def _statements(accounts: int, prefix: str) -> int:
    world, epoch = _activation_world(prefix, accounts)
    with transaction.atomic():
        locked = locks.epoch_for_update(epoch.pk)
        with CaptureQueriesContext(connection) as queries:
            serving.activate_first_locked(epoch=locked, account_ids=[a.pk for a in world.accounts], actor=ACTOR,
                                          observed=bytes(locked.digest))
    assert AccountServingGate.objects.filter(account_id__in=[a.pk for a in world.accounts],
                                             mode=GateMode.V2_SERVING).count() == accounts
    return len(queries)


# Measured: the gate locks, the epoch UPDATE and its audit INSERT, the gates' UPDATE with their audit INSERT as one
# statement (D-279; 5 before).
ACTIVATION_STATEMENTS = 4


def test_activation_statement_count_does_not_grow_with_the_account_set(db):
    """activate_first_locked runs the same number of statements for 3 and for 30 accounts (R27, R31)."""
    assert _statements(3, "q3-") == _statements(30, "q30-") <= ACTIVATION_STATEMENTS


def test_a_gate_that_does_not_move_rolls_the_whole_set_based_statement_back(db):
    """The gates' UPDATE and their audit INSERT are one statement (D-279), and its row count is still checked: a
    gate whose fence differs from the one read under the lock matches nothing, the call raises TransitionRefused
    after the statement, and the caller's transaction rolls back the gates that did move and their audit rows.
    (CV2-02-039, CV2-14-007)"""
    world, epoch = _activation_world("rc-", 3)
    ids = [a.pk for a in world.accounts]
    before = {g.pk: (g.mode, g.fence) for g in AccountServingGate.objects.filter(account_id__in=ids)}
    with pytest.raises(TransitionRefused, match="1 gate\\(s\\) changed under their lock"), transaction.atomic():
        locked = locks.epoch_for_update(epoch.pk)
        gates = locks.gates_for_update(ids)
        gates[1] = gates[1]._replace(fence=gates[1].fence - 1)  # as if it had moved under the lock
        gate_services.gates_bind_epoch(gates=gates, action="activate_first", epoch=locked, actor=ACTOR,
                                       evidence_digest=bytes(locked.digest))
    assert {g.pk: (g.mode, g.fence) for g in AccountServingGate.objects.filter(account_id__in=ids)} == before
    assert not AuditRecord.objects.filter(action="gate_activate_first").exists()


def test_an_activation_above_the_declared_maximum_is_refused_before_anything_is_written(db, settings):
    """More accounts than CONNECTOR["ACTIVATION_MAX_ACCOUNTS"] refuses with ACTIVATION_CARDINALITY_EXCEEDED: the
    epoch stays verified, every gate v2_validating with its fence, and no activation audit row exists. (D-210)"""
    world, epoch = _activation_world("mx-", 3)
    settings.CONNECTOR = {**settings.CONNECTOR, "ACTIVATION_MAX_ACCOUNTS": 2}
    fences = {g.pk: g.fence for g in AccountServingGate.objects.filter(account_id__in=[a.pk for a in world.accounts])}
    with pytest.raises(ActivationCardinalityExceeded, match="names 3 accounts; the declared maximum is 2") as exc:
        serving.epoch_activate_first(epoch_pk=epoch.pk, actor=ACTOR)
    assert exc.value.code == "ACTIVATION_CARDINALITY_EXCEEDED" and exc.value.code in ERROR_CATALOG
    with pytest.raises(ActivationCardinalityExceeded), transaction.atomic():  # the locked body refuses too
        locked = locks.epoch_for_update(epoch.pk)
        serving.activate_first_locked(epoch=locked, account_ids=[a.pk for a in world.accounts], actor=ACTOR,
                                      observed=bytes(locked.digest))
    assert ServingEpoch.objects.get(pk=epoch.pk).state == EpochState.VERIFIED
    assert {g.pk: (g.mode, g.fence) for g in AccountServingGate.objects.filter(pk__in=fences)} == {
        pk: (GateMode.V2_VALIDATING, fence) for pk, fence in fences.items()}
    assert not AuditRecord.objects.filter(action__in=("epoch_activate_first", "gate_activate_first")).exists()
    settings.CONNECTOR = {**settings.CONNECTOR, "ACTIVATION_MAX_ACCOUNTS": 3}
    assert serving.epoch_activate_first(epoch_pk=epoch.pk, actor=ACTOR).state == EpochState.ACTIVE


def _row(gate: AccountServingGate) -> dict:
    values = {f.attname: getattr(gate, f.attname) for f in AccountServingGate._meta.concrete_fields
              if f.attname != "changed_at"}
    values["epoch_digest"] = None if values["epoch_digest"] is None else bytes(values["epoch_digest"])
    return values


def test_set_based_advance_agrees_with_the_per_gate_transition_table_on_every_pair(every_mode):
    """For every set-based gate transition (V1 shutdown's steps, D-208; the binding ones are pinned above) and every
    gate mode as source: `gates_advance` moves the gate exactly when its django-fsm declaration allows it, to
    exactly the row the instance transition produces (mode, fence + 1, nothing else), with one audit row, and
    leaves every other gate as it is. Every (source, target) pair a set-based statement can produce is an edge
    of the trigger's table, and for every pair of modes that is not an edge the statement is refused by the
    transition trigger. (STYLE R31; CV2-03-013)"""
    by_mode, _candidate = every_mode
    produced = set()
    for action in gate_services.ADVANCE_ACTIONS:
        source, target = gate_services.fsm_edge(getattr(AccountServingGate, action))
        for mode, account_id in by_mode.items():
            audits = AuditRecord.objects.count()
            try:
                with transaction.atomic():
                    (gate,) = locks.gates_for_update([account_id])
                    expected = AccountServingGate.objects.get(pk=gate.pk)  # the locked row, as an instance
                    fsm_allows = mode in getattr(AccountServingGate, action)._django_fsm.transitions
                    if fsm_allows:
                        getattr(expected, action)()
                    moved = gate_services.gates_advance(gates=[gate], action=action, actor=ACTOR,
                                                        evidence_digest=b"\x01" * 32, reason="pairs")
                    after = AccountServingGate.objects.get(account_id=account_id)
                    assert _row(after) == _row(expected), (action, mode)
                    assert bool(moved) == fsm_allows == (mode == source), (action, mode)
                    assert AuditRecord.objects.count() == audits + len(moved)
                    if moved:
                        assert after.fence == gate.fence + 1 and after.mode == target
                        produced.add((mode, after.mode))
                        (row,) = AuditRecord.objects.filter(action=f"gate_{action}", entity_id=str(gate.pk),
                                                            fence=after.fence)
                        assert (row.from_state, row.to_state, row.reason) == (source, target, "pairs")
                    raise _Rollback
            except _Rollback:
                pass
    produced |= {gate_services.fsm_edge(getattr(AccountServingGate, a)) for a in gate_services.BINDING_ACTIONS}
    assert produced <= set(GATE_TRANSITIONS)
    for mode, account_id in by_mode.items():
        gate = AccountServingGate.objects.get(account_id=account_id)
        for target in GateMode:
            if target == mode or (mode, target) in GATE_TRANSITIONS:
                continue
            with pytest.raises(IntegrityError, match=f"transition {mode} -> {target} is not allowed"):
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(gate_services.GATES_ADVANCE_SQL, {
                        "source": mode, "target": target, "changed_at": "2026-12-05T00:00:00Z",
                        "ids": [gate.pk], "fences": [gate.fence]})


def test_a_non_advance_transition_is_refused_by_the_set_based_advance(every_mode):
    """Only the declared unconditional advances run through `gates_advance`: a guarded transition
    (confirm_halted), a binding one and an unknown name are refused before any statement. (R31)"""
    by_mode, _candidate = every_mode
    with transaction.atomic():
        gates = locks.gates_for_update(list(by_mode.values()))
        for action in ("confirm_halted", "activate_first", "nonsense"):
            with pytest.raises(TransitionRefused):
                gate_services.gates_advance(gates=gates, action=action, actor=ACTOR, evidence_digest=None)
    assert {AccountServingGate.objects.get(account_id=a).mode: a for a in by_mode.values()} == by_mode
