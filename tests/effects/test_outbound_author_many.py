"""Outbound authoring, one path for any number of calls (issue 39, D-520): the commands `outbound_commands_author`
writes for several calls at once are byte for byte the ones it writes for each call alone, an existing key (also
one a concurrent author commits meanwhile) converges or fails closed, and a refusal writes nothing. On real
PostgreSQL."""
from __future__ import annotations

import pytest
from django.db import transaction

from connector.demo import build_world
from connector.services.guard import lock_serving
from effects.errors import OutboundConflict, OutboundRefused
from effects.models import OutboundCommand, RemoteEffect
from effects.services.outbound import outbound_command_author, outbound_commands_author
from tests.concurrency import run_concurrently

SKIP = {"id", "created_at", "updated_at"}


@pytest.fixture
def world(transactional_db):
    return build_world("ot-", push=True)


def _calls(ctx, account_key: str, keys: list[str], *, email: str = "x@example.com") -> list[dict]:
    return [dict(ctx=ctx, account_key=account_key, application_scope="runtime.records",
                 effect_root_id=f"cmd-test:{k}", effect_slot_id="push:crm-contact", effect_generation_id="g1",
                 push_contract="crm-contact", callout="crm-upsert", path_params={"record_key": k},
                 body={"record_key": k, "email": email}, suppress_external_effects=False, source_execution_id=None,
                 owner_slot=k) for k in keys]


def _rows(pks: list[int]) -> list[tuple]:
    commands = {c.pk: c for c in OutboundCommand.objects.filter(pk__in=pks)}
    out = []
    for pk in pks:
        c = commands[pk]
        fields = tuple((f.attname, bytes(v) if isinstance(v := getattr(c, f.attname), memoryview) else v)
                       for f in OutboundCommand._meta.concrete_fields if f.attname not in SKIP)
        effect = RemoteEffect.objects.get(command_id=pk)
        out.append((fields, bytes(effect.logical_effect_digest), effect.account_id, effect.state))
    return out


def _push_names(world):
    from connector.selectors.routes import route_for

    account = world.accounts[0]
    route = route_for(epoch_pk=world.active_epoch.pk, epoch_digest=bytes(world.active_epoch.digest),
                      account_id=account.pk, channel="records.webhook")
    return route.definition["push"]


def test_authoring_several_calls_at_once_writes_what_authoring_each_alone_writes(world):
    """The same three calls authored in one call and one call each (each inside a rolled-back savepoint of one
    transaction, so both meet the same database): every column of every command (binding digest, request bytes
    and digest, idempotency key, frozen references, fence, epoch) and its one RemoteEffect are identical.
    Proves: CV2-10-001, CV2-10-005, CV2-10-047, CV2-14-001"""
    push = _push_names(world)
    account = world.accounts[0]
    with transaction.atomic():
        ctx = lock_serving(account_id=account.pk)
        calls = [dict(c, push_contract=push["contract"], callout=push["callout"],
                      effect_slot_id=f"push:{push['contract']}") for c in _calls(ctx, account.account_key,
                                                                                 ["r1", "r2", "r3"])]
        sid = transaction.savepoint()
        together = _rows(outbound_commands_author(calls=calls))
        transaction.savepoint_rollback(sid)
        assert OutboundCommand.objects.count() == 0
        sid = transaction.savepoint()
        single = _rows([outbound_command_author(**c).pk for c in calls])
        transaction.savepoint_rollback(sid)
    assert together == single and len(together) == 3


def test_an_existing_key_converges_or_fails_closed_and_a_replay_context_writes_nothing(world):
    """A call whose logical effect exists with the same binding returns that command (no second row); a repeat
    within one call list returns the first; a different binding for an existing key raises OutboundConflict; a
    replay context raises OutboundRefused; neither refusal writes anything. Proves: CV2-10-001, CV2-10-013,
    CV2-10-015"""
    push = _push_names(world)
    account = world.accounts[0]

    def calls(ctx, keys, **kw):
        return [dict(c, push_contract=push["contract"], callout=push["callout"],
                     effect_slot_id=f"push:{push['contract']}") for c in _calls(ctx, account.account_key, keys, **kw)]

    with transaction.atomic():
        ctx = lock_serving(account_id=account.pk)
        first = outbound_command_author(**calls(ctx, ["r1"])[0]).pk
    with transaction.atomic():
        ctx = lock_serving(account_id=account.pk)
        pks = outbound_commands_author(calls=calls(ctx, ["r1", "r2", "r2"]))
    assert pks[0] == first and pks[1] == pks[2] and OutboundCommand.objects.count() == 2
    assert RemoteEffect.objects.count() == 2
    with pytest.raises(OutboundConflict), transaction.atomic():
        ctx = lock_serving(account_id=account.pk)
        outbound_commands_author(calls=calls(ctx, ["r3", "r1"], email="other@example.com"))
    with pytest.raises(OutboundRefused), transaction.atomic():
        ctx = lock_serving(account_id=account.pk)
        outbound_commands_author(calls=[dict(c, suppress_external_effects=True) for c in calls(ctx, ["r4"])])
    assert OutboundCommand.objects.count() == 2 and RemoteEffect.objects.count() == 2


def test_a_key_a_concurrent_author_commits_meanwhile_converges_or_fails_closed(world):
    """Two application transactions author the same logical effect at once (the second's insert waits on the
    first's uncommitted key): with the same binding both return the same command, one OutboundCommand and one
    RemoteEffect exist and neither transaction fails; with a different binding the second fails closed with
    OutboundConflict and writes nothing. Proves: CV2-10-001, CV2-10-013, CV2-10-015"""
    import threading

    push = _push_names(world)
    account = world.accounts[0]

    def calls(keys, email):
        ctx = lock_serving(account_id=account.pk)
        return [dict(c, push_contract=push["contract"], callout=push["callout"],
                     effect_slot_id=f"push:{push['contract']}") for c in _calls(ctx, account.account_key, keys,
                                                                                email=email)]

    def race(first_calls, second_calls) -> list:
        inserted = threading.Event()

        def first():
            with transaction.atomic():
                pks = outbound_commands_author(calls=first_calls())
                inserted.set()
                _hold_until_another_session_waits()
            return pks

        def second():
            assert inserted.wait(30)
            with transaction.atomic():
                return outbound_commands_author(calls=second_calls())

        return run_concurrently([first, second], expect=OutboundConflict)

    first, second = race(lambda: calls(["r1"], "x@example.com"), lambda: calls(["r1", "r2"], "x@example.com"))
    assert first[0] == second[0] and second[1] != second[0]
    assert OutboundCommand.objects.count() == 2 and RemoteEffect.objects.count() == 2
    _, refused = race(lambda: calls(["r3"], "y@example.com"), lambda: calls(["r3", "r4"], "z@example.com"))
    assert isinstance(refused, OutboundConflict)
    assert OutboundCommand.objects.count() == 3 and RemoteEffect.objects.count() == 3


def _hold_until_another_session_waits() -> None:
    """Keep this transaction open until another session waits on one of its locks (the concurrent insert of the
    same key), so the two really overlap."""
    from tests.concurrency import backend_pid_waiting, wait_until

    assert wait_until(lambda: bool(backend_pid_waiting()), timeout=30)
