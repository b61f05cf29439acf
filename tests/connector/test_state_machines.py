"""Every (source, target) pair of every state machine here: exactly the seed's transitions are allowed, by
django-fsm in Python and by the transition triggers in PostgreSQL. The tables below are typed from the seed's
"State machines" section, independently of connector.choices.

Proves: CV2-02-034, CV2-02-028, CV2-02-029, CV2-02-030, CV2-02-031, CV2-02-032, CV2-02-033,
CV2-03-001, CV2-03-002, CV2-03-003, CV2-03-004, CV2-03-005, CV2-03-006, CV2-03-009, CV2-03-010,
CV2-03-013 (the "only through" conditions of CV2-03-007/008/011/012 arrive with the cutover coordinators),
CV2-04-001, CV2-04-002, CV2-04-005, CV2-12-058, CV2-12-059, CV2-12-060, CV2-12-061
"""
from __future__ import annotations

import itertools

import pytest
from django.db import IntegrityError, connections, transaction
from django_fsm import TransitionNotAllowed

from connector.models import AccountServingGate, CredentialGenerationDispatchGate, ServingEpoch
from cutover.models import CutoverDecision
from tests import dbroles

SEED_GATE = {
    ("v1_serving", "halting_v1"), ("halting_v1", "v1_serving"), ("halting_v1", "v1_stopped"),
    ("v1_stopped", "v1_drained"), ("v1_drained", "v1_serving"), ("v1_drained", "v2_validating"),
    ("v2_validating", "v1_drained"), ("v2_validating", "v2_serving"), ("v2_serving", "halting_v2"),
    ("halting_v2", "v2_halted"), ("v2_halted", "v2_serving"),
}
GATE_STATES = ["v1_serving", "halting_v1", "v1_stopped", "v1_drained", "v2_validating", "v2_serving",
               "halting_v2", "v2_halted"]
SEED_EPOCH = {("prepared", "verified"), ("prepared", "rejected"), ("verified", "active"), ("verified", "rejected"),
              ("active", "draining"), ("draining", "retired")}
EPOCH_STATES = ["prepared", "verified", "rejected", "active", "draining", "retired"]
SEED_CREDENTIAL_GATE = {("enabled", "revoked"), ("revoked", "enabled")}
CREDENTIAL_GATE_STATES = ["enabled", "revoked"]
SEED_DECISION = {("rollback_open", "activating_v2"), ("activating_v2", "v2_committed"),
                 ("rollback_open", "restoring_v1"), ("restoring_v1", "v1_restored")}
DECISION_STATES = ["rollback_open", "activating_v2", "v2_committed", "restoring_v1", "v1_restored"]

MACHINES = [
    (AccountServingGate, "mode", GATE_STATES, SEED_GATE),
    (ServingEpoch, "state", EPOCH_STATES, SEED_EPOCH),
    (CredentialGenerationDispatchGate, "mode", CREDENTIAL_GATE_STATES, SEED_CREDENTIAL_GATE),
    (CutoverDecision, "state", DECISION_STATES, SEED_DECISION),
]


def _declared(model, field_name):
    field = model._meta.get_field(field_name)
    pairs = set()
    for t in field.get_all_transitions(model):
        pairs.add((t.source, t.target))
    return pairs


@pytest.mark.parametrize("model,field_name,states,seed", MACHINES, ids=lambda v: getattr(v, "__name__", None))
def test_declared_transitions_are_exactly_the_seeds(model, field_name, states, seed):
    """The django-fsm graph equals the seed's table: nothing missing, nothing extra, no wildcard sources."""
    declared = _declared(model, field_name)
    assert declared == seed
    assert {s for pair in declared for s in pair} <= set(states)
    field = model._meta.get_field(field_name)
    assert field.protected is True


@pytest.mark.django_db  # guards registered by later apps (open permits) read the database
@pytest.mark.parametrize("model,field_name,states,seed", MACHINES, ids=lambda v: getattr(v, "__name__", None))
def test_every_unlisted_pair_is_refused_by_django_fsm(model, field_name, states, seed):
    """For every (source, target) not in the seed, no transition method of the model moves source to target:
    each method either refuses the source (TransitionNotAllowed) or targets another state."""
    field = model._meta.get_field(field_name)
    methods = {t.name for t in field.get_all_transitions(model)}
    for source, target in itertools.product(states, states):
        if source == target:
            continue
        reached = set()
        for name in methods:
            instance = model(**{field_name: source})
            method = getattr(instance, name)
            kwargs = {}
            if name in {"activate_first", "activate_successor"}:
                kwargs["epoch"] = ServingEpoch(digest=b"\x00" * 32)
            if name == "reject":
                kwargs = {"code": "X", "detail": "x"}
            try:
                method(**kwargs)
            except TransitionNotAllowed:
                continue
            reached.add(getattr(instance, field_name))
        assert (target in reached) == ((source, target) in seed), (source, target, reached)


# -- the same table in PostgreSQL ----------------------------------------------------------------------------

def _force(using: str, sql: str, params) -> None:
    """Set up a row in an arbitrary state with triggers off for this statement (superuser session), the way
    a corrupt or legacy row could exist."""
    with connections[using].cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(sql, params)
        finally:
            cursor.execute("SET session_replication_role = origin")
            dbroles.admin_off(cursor)


def _try_update(using: str, sql: str, params) -> bool:
    try:
        with transaction.atomic(using=using):
            with connections[using].cursor() as cursor:
                cursor.execute(sql, params)
        return True
    except IntegrityError as exc:
        assert exc.__cause__.diag.constraint_name.endswith("_transition"), exc
        return False


@pytest.mark.django_db(databases=["default", "journal"])
def test_postgres_refuses_every_unlisted_gate_and_epoch_transition(world):
    """A raw UPDATE (no service, no django-fsm) succeeds exactly for the seed's edges: the database enforces the
    transition table itself. Gate updates also advance the fence by one, as the fence trigger requires."""
    epoch = world.active_epoch
    gate = world.accounts[0].serving_gate
    v2 = {"v2_serving", "halting_v2", "v2_halted"}
    for source, target in itertools.product(GATE_STATES, GATE_STATES):
        if source == target:
            continue
        _force("default", "UPDATE connector_accountservinggate SET mode=%s, epoch_id=%s, epoch_digest=%s "
               "WHERE id=%s", [source, epoch.pk if source in v2 else None,
                               bytes(epoch.digest) if source in v2 else None, gate.pk])
        ok = _try_update("default", "UPDATE connector_accountservinggate SET mode=%s, fence=fence+1, epoch_id=%s, "
                         "epoch_digest=%s WHERE id=%s", [target, epoch.pk if target in v2 else None,
                                                         bytes(epoch.digest) if target in v2 else None, gate.pk])
        assert ok == ((source, target) in SEED_GATE), (source, target)
    row = world.verified_epoch
    for source, target in itertools.product(EPOCH_STATES, EPOCH_STATES):
        if source == target:
            continue
        _force("default", "UPDATE connector_servingepoch SET state=%s, rejection_code='' WHERE id=%s",
               [source, row.pk])
        code = "X" if target == "rejected" else ""
        ok = _try_update("default", "UPDATE connector_servingepoch SET state=%s, rejection_code=%s WHERE id=%s",
                         [target, code, row.pk])
        assert ok == ((source, target) in SEED_EPOCH), (source, target)


@pytest.mark.django_db(databases=["default", "journal"])
def test_postgres_refuses_every_unlisted_credential_gate_and_decision_transition(world):
    """Credential gate and CutoverDecision (journal database) transition tables, enforced by PostgreSQL."""
    gate = CredentialGenerationDispatchGate.objects.first()
    for source, target in itertools.product(CREDENTIAL_GATE_STATES, CREDENTIAL_GATE_STATES):
        if source == target:
            continue
        _force("default", "UPDATE connector_credentialgenerationdispatchgate SET mode=%s WHERE id=%s",
               [source, gate.pk])
        ok = _try_update("default", "UPDATE connector_credentialgenerationdispatchgate SET mode=%s, "
                         "fence=fence+1 WHERE id=%s", [target, gate.pk])
        assert ok == ((source, target) in SEED_CREDENTIAL_GATE)
    decision = CutoverDecision.objects.create(attempt_key="sm-test")
    for source, target in itertools.product(DECISION_STATES, DECISION_STATES):
        if source == target:
            continue
        _force("journal", "UPDATE cutover_cutoverdecision SET state=%s WHERE id=%s", [source, decision.pk])
        ok = _try_update("journal", "UPDATE cutover_cutoverdecision SET state=%s, fence=fence+1 WHERE id=%s",
                         [target, decision.pk])
        assert ok == ((source, target) in SEED_DECISION)


@pytest.mark.django_db(databases=["default", "journal"])
def test_postgres_requires_fence_to_advance_by_exactly_one(world):
    """A gate transition that does not advance the fence by exactly one, or a change outside a transition,
    is refused by the database. Proves: CV2-03-013, CV2-04-005"""
    gate = world.accounts[0].serving_gate
    for sql in ("UPDATE connector_accountservinggate SET mode='halting_v2' WHERE id=%s",
                "UPDATE connector_accountservinggate SET mode='halting_v2', fence=fence+2 WHERE id=%s",
                "UPDATE connector_accountservinggate SET fence=fence+1 WHERE id=%s"):
        with pytest.raises(IntegrityError) as info:
            with transaction.atomic():
                with connections["default"].cursor() as cursor:
                    cursor.execute(sql, [gate.pk])
        assert info.value.__cause__.diag.constraint_name == "connector_accountservinggate_fence_advance"


@pytest.mark.django_db(databases=["default", "journal"])
def test_no_v2_mode_ever_moves_to_a_v1_mode(world):
    """Once a gate is in a V2 mode it never returns to a V1 mode: no transition method of the gate reaches one
    from `v2_serving`, `halting_v2` or `v2_halted`, and PostgreSQL refuses the raw UPDATE of every such pair
    (V1 is recovered only by the full restore, which replaces the database, never by a gate transition).
    Proves: CV2-03-020"""
    v1_modes = {"v1_serving", "halting_v1", "v1_stopped", "v1_drained"}
    v2_modes = {"v2_serving", "halting_v2", "v2_halted"}
    epoch = world.active_epoch
    methods = {t.name for t in AccountServingGate._meta.get_field("mode").get_all_transitions(AccountServingGate)}
    for source in v2_modes:
        for name in methods:
            gate = AccountServingGate(mode=source)
            kwargs = {"epoch": ServingEpoch(digest=b"\x00" * 32)} if name in {"activate_first",
                                                                              "activate_successor"} else {}
            try:
                getattr(gate, name)(**kwargs)
            except TransitionNotAllowed:
                continue
            assert gate.mode in v2_modes, (source, name, gate.mode)
    gate = world.accounts[0].serving_gate
    for source, target in itertools.product(sorted(v2_modes), sorted(v1_modes)):
        _force("default", "UPDATE connector_accountservinggate SET mode=%s, epoch_id=%s, epoch_digest=%s "
               "WHERE id=%s", [source, epoch.pk, bytes(epoch.digest), gate.pk])
        assert not _try_update("default", "UPDATE connector_accountservinggate SET mode=%s, fence=fence+1, "
                               "epoch_id=NULL, epoch_digest=NULL WHERE id=%s", [target, gate.pk]), (source, target)
