"""Every (source, target) pair of the outbound state machines: exactly the seed's transitions are allowed, by
django-fsm in Python and by the transition triggers in PostgreSQL (a raw UPDATE, no service). The tables below
are typed from the seed's "State machines" section, independently of effects.choices (which the migration's
triggers are generated from). ProcessGeneration is the product's holder-isolation proof (running -> terminated).
"""
from __future__ import annotations

import inspect
import itertools

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone
from django_fsm import TransitionNotAllowed

from effects.models import (
    DispatchPermit,
    OutboundCommand,
    ProcessGeneration,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteLink,
)
from effects.services import dispatch
from tests.effects.helpers import ACTOR, acquire, author, force, refused_by, send
from tests import dbroles

EFFECT_STATES = ["prepared", "dispatching", "remote_confirmed", "uncertain", "no_effect", "quarantined",
                 "finalized"]
SEED_EFFECT = {
    ("prepared", "dispatching"), ("prepared", "quarantined"),
    ("dispatching", "remote_confirmed"), ("dispatching", "uncertain"), ("dispatching", "no_effect"),
    ("dispatching", "prepared"),
    ("uncertain", "remote_confirmed"), ("uncertain", "no_effect"), ("uncertain", "quarantined"),
    ("uncertain", "prepared"),
    ("remote_confirmed", "finalized"),
}
PERMIT_STATES = ["granted", "sending", "returned", "abandoned"]
SEED_PERMIT = {("granted", "sending"), ("granted", "abandoned"), ("sending", "returned"), ("sending", "abandoned")}
LINK_STATES = ["active", "retired"]
SEED_LINK = {("active", "retired")}
HOLDER_STATES = ["running", "terminated"]
SEED_HOLDER = {("running", "terminated")}

MACHINES = [
    (RemoteEffect, EFFECT_STATES, SEED_EFFECT),
    (DispatchPermit, PERMIT_STATES, SEED_PERMIT),
    (RemoteLink, LINK_STATES, SEED_LINK),
    (ProcessGeneration, HOLDER_STATES, SEED_HOLDER),
]
def _ids(value):
    return getattr(value, "__name__", None)


def _declared(model) -> set[tuple[str, str]]:
    return {(t.source, t.target) for t in model._meta.get_field("state").get_all_transitions(model)}


def _call(instance, name: str) -> None:
    """Invoke one transition method with placeholder keyword arguments (timestamps for `at`, text otherwise)."""
    method = getattr(instance, name)
    kwargs = {p.name: (timezone.now() if p.name == "at" else "x")
              for p in inspect.signature(method).parameters.values() if p.kind == p.KEYWORD_ONLY}
    method(**kwargs)


@pytest.mark.parametrize("model,states,seed", MACHINES, ids=_ids)
def test_declared_transitions_are_exactly_the_seeds(model, states, seed):
    """The django-fsm graph of the state field equals the seed's table: nothing missing, nothing extra, no
    wildcard source; the field's closed vocabulary is exactly the seed's states and the field is protected.
    Proves: CV2-10-017, CV2-10-018, CV2-10-019, CV2-10-020, CV2-10-021, CV2-10-022, CV2-10-023, CV2-10-024, CV2-10-025, CV2-10-026, CV2-10-027, CV2-10-032, CV2-10-033, CV2-10-034, CV2-10-035, CV2-10-044"""
    field = model._meta.get_field("state")
    assert _declared(model) == seed
    assert {value for value, _ in field.choices} == set(states)
    assert field.protected is True


@pytest.mark.parametrize("model,states,seed", MACHINES, ids=_ids)
def test_every_unlisted_pair_is_refused_by_django_fsm(model, states, seed):
    """For every ordered pair of distinct states, some transition method moves source to target exactly when
    the pair is in the seed's table; every other method refuses the source (TransitionNotAllowed).
    Proves: CV2-10-017, CV2-10-018, CV2-10-019, CV2-10-020, CV2-10-021, CV2-10-022, CV2-10-023, CV2-10-024, CV2-10-025, CV2-10-026, CV2-10-027, CV2-10-032, CV2-10-033, CV2-10-034, CV2-10-035, CV2-10-044"""
    methods = {t.name for t in model._meta.get_field("state").get_all_transitions(model)}
    for source, target in itertools.product(states, states):
        if source == target:
            continue
        reached = set()
        for name in methods:
            instance = model(state=source)
            try:
                _call(instance, name)
            except TransitionNotAllowed:
                continue
            reached.add(instance.state)
        assert (target in reached) == ((source, target) in seed), (model.__name__, source, target, reached)


# -- the same tables in PostgreSQL ------------------------------------------------------------------------------

@pytest.fixture
def rows(push_world, receiver):
    """One committed row of each machine, made through the services: a finalized effect with its returned permit,
    settled attempt, running holder and active RemoteLink."""
    author(push_world.accounts[0])
    ready = acquire("h-sm")
    send(ready)
    effect = dispatch.effect_finalize(effect_pk=ready.claim.effect_pk, owner_slot="r1")
    assert effect.state == "finalized"
    return {RemoteEffect: effect.pk, DispatchPermit: ready.permit.pk, RemoteLink: RemoteLink.objects.get().pk,
            ProcessGeneration: ready.holder.pk}


@pytest.mark.django_db
@pytest.mark.parametrize("model,states,seed", MACHINES, ids=_ids)
def test_postgres_allows_exactly_the_seed_edges(rows, model, states, seed):
    """A raw UPDATE of the state column (no service, no django-fsm) succeeds exactly for the seed's edges; every
    other pair is refused by the table's `_transition` trigger. The source state is set up with triggers off.
    Proves: CV2-10-017, CV2-10-018, CV2-10-019, CV2-10-020, CV2-10-021, CV2-10-022, CV2-10-023, CV2-10-024, CV2-10-025, CV2-10-026, CV2-10-027, CV2-10-032, CV2-10-033, CV2-10-034, CV2-10-035, CV2-10-044"""
    table, pk = model._meta.db_table, rows[model]
    # A permit row satisfies the `sending => io_may_have_started` check in every state of the probe.
    extra = ", io_may_have_started = true" if model is DispatchPermit else ""
    for source, target in itertools.product(states, states):
        if source == target:
            continue
        force(f"UPDATE {table} SET state = %s{extra} WHERE id = %s", [source, pk])
        refused = refused_by(f"UPDATE {table} SET state = %s WHERE id = %s", [target, pk])
        if (source, target) in seed:
            assert refused is None, (table, source, target, refused)
        else:
            assert refused == f"{table}_transition", (table, source, target, refused)


@pytest.mark.django_db
@pytest.mark.parametrize("terminal", ["no_effect", "finalized"])
def test_terminal_effect_states_never_leave(rows, terminal):
    """`no_effect` and `finalized` are terminal: no transition method accepts them as a source, and PostgreSQL
    refuses an UPDATE from them to any other state. Proves: CV2-10-028"""
    methods = {t.name for t in RemoteEffect._meta.get_field("state").get_all_transitions(RemoteEffect)}
    for name in methods:
        with pytest.raises(TransitionNotAllowed):
            _call(RemoteEffect(state=terminal), name)
    pk = rows[RemoteEffect]
    force("UPDATE effects_remoteeffect SET state = %s WHERE id = %s", [terminal, pk])
    for target in EFFECT_STATES:
        if target != terminal:
            assert refused_by("UPDATE effects_remoteeffect SET state = %s WHERE id = %s",
                              [target, pk]) == "effects_remoteeffect_transition", target


# -- append-only command, outcome written once --------------------------------------------------------------

@pytest.mark.django_db
def test_outbound_command_is_append_only_in_postgres(push_world):
    """PostgreSQL refuses every UPDATE (any column, even a no-op) and every DELETE of an OutboundCommand, raw or
    through the ORM. Proves: CV2-10-001, CV2-10-004"""
    command = author(push_world.accounts[0])
    for sql in ("UPDATE effects_outboundcommand SET path = '/elsewhere' WHERE id = %s",
                "UPDATE effects_outboundcommand SET credential_generation_id = credential_generation_id WHERE id = %s",
                "UPDATE effects_outboundcommand SET request_body = '\\x00'::bytea WHERE id = %s",
                "DELETE FROM effects_outboundcommand WHERE id = %s"):
        assert refused_by(sql, [command.pk]) == "effects_outboundcommand_append_only", sql
    with dbroles.as_admin(), pytest.raises(IntegrityError), transaction.atomic():  # the trigger, for anyone
        OutboundCommand.objects.filter(pk=command.pk).update(max_attempts=99)
    stored = OutboundCommand.objects.get(pk=command.pk)
    assert (stored.path, stored.max_attempts, bytes(stored.request_body)) == (
        command.path, command.max_attempts, bytes(command.request_body))


@pytest.fixture
def settled_attempt(push_world):
    """An attempt whose outcome was written by the services: a granted permit abandoned after its holder was
    terminated (outcome `no_effect`)."""
    author(push_world.accounts[0])
    ready = acquire("h-once")
    dispatch.holder_terminate(holder_id="h-once", evidence="supervisor: process exited", actor=ACTOR)
    dispatch.permit_abandon(permit_pk=ready.permit.pk, actor=ACTOR)
    attempt = RemoteEffectAttempt.objects.get(pk=ready.claim.attempt_pk)
    assert attempt.outcome == "no_effect"
    return attempt


@pytest.mark.django_db
def test_attempt_outcome_is_written_at_most_once(settled_attempt):
    """Once an attempt's outcome is written, PostgreSQL refuses changing it to any other outcome or back to
    empty, and the attempt's request evidence (frozen references, request digest, idempotency key) never
    changes. Proves: CV2-10-016, CV2-10-028"""
    pk = settled_attempt.pk
    for outcome in ("", "uncertain", "remote_confirmed"):
        assert refused_by("UPDATE effects_remoteeffectattempt SET outcome = %s WHERE id = %s", [outcome, pk]) in (
            "effects_remoteeffectattempt_transition", "effects_remoteeffectattempt_settled_once"), outcome
    for column, value in (("request_digest", b"\x00" * 32), ("provider_idempotency_key", "other"),
                          ("ordinal", 9)):
        assert refused_by(f"UPDATE effects_remoteeffectattempt SET {column} = %s WHERE id = %s",
                          [value, pk]) == "effects_remoteeffectattempt_immutable_columns", column


@pytest.mark.django_db
def test_settled_attempt_evidence_is_never_rewritten(settled_attempt):
    """After the outcome is written, the rest of the outcome evidence (status, response digest, evidence text,
    settlement time) is immutable too: uncertainty or no-effect evidence is never rewritten.
    Proves: CV2-10-016, CV2-10-029"""
    pk = settled_attempt.pk
    for column, value in (("evidence", "rewritten later"), ("response_status", 201),
                          ("settled_at", timezone.now())):
        assert refused_by(f"UPDATE effects_remoteeffectattempt SET {column} = %s WHERE id = %s",
                          [value, pk]) is not None, column


def _permit_copy(p, **overrides) -> DispatchPermit:
    fields = {"attempt_id": p.attempt_id, "effect_id": p.effect_id, "gate_id": p.gate_id,
              "gate_fence": p.gate_fence, "credential_gate_id": p.credential_gate_id,
              "credential_gate_fence": p.credential_gate_fence, "holder_id": p.holder_id,
              "holder_fence": p.holder_fence}
    with transaction.atomic():
        return DispatchPermit.objects.create(**{**fields, **overrides})


@pytest.mark.django_db
def test_one_open_permit_per_effect_and_one_permit_per_attempt_in_postgres(push_world):
    """Around the services, PostgreSQL refuses a second open permit for an effect (even for another attempt) and
    a second permit for the same attempt (even after the first closed). Proves: CV2-15-021"""
    author(push_world.accounts[0])
    ready = acquire("h-db")
    p = ready.permit
    attempt = RemoteEffectAttempt.objects.get(pk=p.attempt_id)
    second = RemoteEffectAttempt.objects.create(
        effect_id=p.effect_id, ordinal=2, holder_id=p.holder_id, lease_fence=p.holder_fence + 1,
        epoch_id=attempt.epoch_id, credential_generation_id=attempt.credential_generation_id,
        request_digest=bytes(attempt.request_digest), lease_expires_at=attempt.lease_expires_at)
    with pytest.raises(IntegrityError) as info:
        _permit_copy(p, attempt_id=second.pk)
    assert info.value.__cause__.diag.constraint_name == "effects_permit_one_open_per_effect"
    dispatch.holder_terminate(holder_id="h-db", evidence="supervisor: process exited", actor=ACTOR)
    dispatch.permit_abandon(permit_pk=p.pk, actor=ACTOR)
    with pytest.raises(IntegrityError) as info:
        _permit_copy(p)
    assert info.value.__cause__.diag.constraint_name == "effects_dispatchpermit_attempt_id_key"
    assert list(DispatchPermit.objects.values_list("state", flat=True)) == ["abandoned"]
