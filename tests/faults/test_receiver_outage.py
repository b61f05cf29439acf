"""Fault: the receiver refuses connections (issue 37, the table's first row; item 1).

A real egress process (a child running what the beat's sweeper and the egress worker run: `worker.effects_sweep`
finds due effects in PostgreSQL, `tasks.effect_dispatch`'s body dispatches them; no broker) pushes effects of a
callout whose frozen retry schedule is short, so the test is seconds long. The loopback receiver is down
(connection refused) for about 10 s and then listens again on the same port: every effect finalizes without a
person, each applied exactly once at the receiver, each after attempts that never reached it spaced by its
schedule. A schedule spent while the receiver stays down ends the effect terminal `no_effect` with
RECEIVER_UNREACHABLE, on the operators' board with its remedy and in /metrics."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
from django.test import Client

from connector.demo import CALLOUT_DEFINITION
from effects.choices import EffectState
from effects.models import RemoteEffect, RemoteEffectAttempt
from tests.crash.support import DB
from tests.effects.helpers import author
from tests.effects.receiver import Receiver
from tests.faults.servers import ROOT, Child, child_environment, free_port, run_database_env

EGRESS = """
import os, time
import django
django.setup()
from effects import tasks
from effects.services import worker
deadline = time.monotonic() + float(os.environ["EGRESS_SECONDS"])
while time.monotonic() < deadline:
    if worker.effects_sweep()["claimable"]:  # the sweeper's decision, from PostgreSQL
        tasks.effect_dispatch()  # the egress task's body
    time.sleep(0.1)
"""


def _world(monkeypatch, prefix: str, schedule: list[int]):
    from connector import demo

    monkeypatch.setattr(demo, "CALLOUT_DEFINITION", {**CALLOUT_DEFINITION, "retry": {"schedule_seconds": schedule}})
    return demo.build_world(prefix, push=True).accounts[0]


def _egress(settings, tmp_path, port: int, seconds: float) -> Child:
    env = child_environment(secret_dir=settings.CONNECTOR["SECRET_BACKEND_DIR"], REDIS_URL="redis://127.0.0.1:1/0",
                            CONNECTOR_EGRESS_BASE_URL=f"http://127.0.0.1:{port}", CONNECTOR_EGRESS_TIMEOUT_SECONDS="2",
                            EGRESS_SECONDS=str(seconds), **run_database_env())
    return Child("egress", [sys.executable, "-c", EGRESS], env, tmp_path).start()


def _wait(condition, timeout: float, child: Child, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert child.proc.poll() is None, f"the egress process exited:\n{child.output()}"
        assert time.monotonic() < deadline, f"{what} not within {timeout}s:\n{child.output()}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.django_db(**DB)
def test_receiver_refusing_connections_for_ten_seconds_then_every_effect_finalizes_once(
        settings, tmp_path, monkeypatch):
    """Twelve effects are pushed while the receiver refuses connections; it listens again after 10 s. No effect
    ends `no_effect`: each is retried on its frozen schedule (attempts never closer than the schedule minus its
    jitter), none is claimed before its `next_attempt_at`, and once the receiver is back every effect finalizes
    without a person, each key applied exactly once and every receiver request carrying a distinct key.
    Proves: issue 37 item 1"""
    schedule = [1, 1, 2, 2, 2, 2, 2, 2, 2, 2]  # 18 s in all: outlasts the 10 s outage
    account = _world(monkeypatch, "ro-", schedule)
    pks = [RemoteEffect.objects.get(command=author(account, root=f"o-{i}", record_id=f"r{i}")).pk for i in range(12)]
    port = free_port()  # nothing listens: connection refused
    child = _egress(settings, tmp_path, port, 90)
    receiver = None
    try:
        _wait(lambda: RemoteEffectAttempt.objects.filter(effect_id__in=pks, evidence__startswith="connect failed")
              .values("effect_id").distinct().count() == len(pks), 30, child, "a refused attempt of every effect")
        time.sleep(10)  # the outage
        receiver = Receiver(port).start()
        _wait(lambda: RemoteEffect.objects.filter(pk__in=pks, state=EffectState.FINALIZED).count() == len(pks),
              40, child, "every effect finalized")
    finally:
        child.stop()
        if receiver is not None:
            receiver.stop()
    assert not RemoteEffect.objects.filter(pk__in=pks, state=EffectState.NO_EFFECT).exists()
    keys = {e.command.provider_idempotency_key for e in RemoteEffect.objects.select_related("command").filter(pk__in=pks)}
    assert receiver.applied == {key: 1 for key in keys}
    assert len([r for r in receiver.requests if r["mode"] == "ok"]) == len(pks)
    for pk in pks:
        attempts = list(RemoteEffectAttempt.objects.filter(effect_id=pk).order_by("ordinal"))
        refused = [a for a in attempts if a.evidence.startswith("connect failed")]
        assert refused and all(a.outcome == "no_effect" and a.response_status is None for a in refused)
        assert attempts[-1].outcome == "remote_confirmed" and len(attempts) == len(refused) + 1
        for n, (before, after) in enumerate(zip(attempts, attempts[1:])):
            gap = (after.claimed_at - before.settled_at).total_seconds()
            assert gap >= schedule[n] * 0.8 - 0.05, (pk, n, gap)


@pytest.mark.django_db(**DB)
def test_a_spent_retry_schedule_is_terminal_no_effect_on_the_board_and_in_metrics(settings, tmp_path, monkeypatch):
    """The receiver never listens: after its schedule (1 s, 1 s) the effect's third unreached attempt ends it
    terminal `no_effect` with RECEIVER_UNREACHABLE: listed on the board and the approval queue with its remedy (a
    new remote call authorized on the effect page), counted in /metrics by reason, and never claimed again.
    Proves: issue 37 item 1"""
    from django.contrib.auth.models import User

    from effects.services import worker
    from governance import selectors
    from governance.reasons import reason

    account = _world(monkeypatch, "rh-", [1, 1])
    pk = RemoteEffect.objects.get(command=author(account, root="o-1", record_id="r1")).pk
    child = _egress(settings, tmp_path, free_port(), 30)
    try:
        _wait(lambda: RemoteEffect.objects.get(pk=pk).state == EffectState.NO_EFFECT, 25, child, "no_effect")
    finally:
        child.stop()
    effect = RemoteEffect.objects.get(pk=pk)
    assert effect.quarantine_reason == "RECEIVER_UNREACHABLE" and effect.next_attempt_at is None
    attempts = list(RemoteEffectAttempt.objects.filter(effect_id=pk).order_by("ordinal"))
    assert [a.outcome for a in attempts] == ["no_effect"] * 3
    assert all(a.evidence.startswith("connect failed") for a in attempts)
    assert worker.effects_sweep()["claimable"] == 0

    items = selectors.board()["RECEIVER_UNREACHABLE"]
    assert [(i.kind, i.pk) for i in items] == [("effect", pk)]
    assert [i.pk for i in selectors.queue() if i.code == "RECEIVER_UNREACHABLE"] == [pk]
    assert reason("RECEIVER_UNREACHABLE").remedy.kind == "remote_call"

    client = Client()
    client.force_login(User.objects.create_superuser("ops-rh", password="pw-ops"))
    page = client.get(f"/queue/effect/{pk}/").content.decode()
    assert "RECEIVER_UNREACHABLE" in page and "Authorize a new remote call" in page
    metrics = client.get("/metrics").content.decode()
    assert 'reason="RECEIVER_UNREACHABLE"' in metrics, metrics[-3000:]


def _advance_clock(pks: list[int], seconds: float) -> None:
    """The waiting effects' clock moves `seconds` ahead: each scheduled `next_attempt_at` comes that much nearer, as
    if the time had passed (the claim compares it with the database's now())."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("UPDATE effects_remoteeffect SET next_attempt_at = next_attempt_at - make_interval(secs => %s) "
                       "WHERE id = ANY(%s) AND next_attempt_at IS NOT NULL", [seconds, pks])


def _next_due(pks: list[int]) -> float | None:
    """Seconds until the earliest scheduled retry of a waiting effect, once none is due or being attempted now."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FILTER (WHERE state <> 'prepared' OR next_attempt_at IS NULL "
                       "OR next_attempt_at <= now()), "
                       "extract(epoch FROM min(next_attempt_at) - now()) FROM effects_remoteeffect WHERE id = ANY(%s)",
                       [pks])
        busy, due = cursor.fetchone()
    return None if busy else float(due)


@pytest.mark.django_db(**DB)
def test_receiver_refusing_connections_for_ten_minutes_then_every_effect_finalizes_once(
        settings, tmp_path, monkeypatch):
    """The product's default retry schedule (5 s, 5 min, 30 min, ... about 27.6 h in all, each delay jittered) and a
    receiver that refuses connections for ten minutes of the effects' clock. The clock is advanced (each waiting
    effect's `next_attempt_at` moved nearer by the same amount) instead of waited for; every attempt is the real
    egress process's. In ten minutes each effect makes the attempts its schedule places there (at about 0 s, 5 s
    and 5 min 5 s) and none ends `no_effect`; when the receiver listens again and the next scheduled retry comes
    (about 35 min), every effect finalizes without a person, each applied exactly once.
    Proves: issue 37 item 1"""
    from connector import demo

    from effects.choices import DEFAULT_RETRY_SCHEDULE

    account = demo.build_world("rt-", push=True).accounts[0]
    pks = [RemoteEffect.objects.get(command=author(account, root=f"t-{i}", record_id=f"t{i}")).pk for i in range(6)]
    assert all(e.command.retry_schedule == list(DEFAULT_RETRY_SCHEDULE)
               for e in RemoteEffect.objects.select_related("command").filter(pk__in=pks))
    port = free_port()
    child = _egress(settings, tmp_path, port, 600)
    receiver, outage, elapsed = None, 600.0, 0.0
    try:
        while True:
            _wait(lambda: _next_due(pks) is not None, 60, child, "every effect waiting for its next retry")
            step = _next_due(pks)
            if elapsed + step >= outage:
                break
            _advance_clock(pks, step + 0.01)
            elapsed += step
        unreached = {pk: RemoteEffectAttempt.objects.filter(effect_id=pk, evidence__startswith="connect failed").count()
                     for pk in pks}
        assert not RemoteEffect.objects.filter(pk__in=pks, state=EffectState.NO_EFFECT).exists()
        receiver = Receiver(port).start()  # the outage ends
        _wait(lambda: _next_due(pks) is not None, 60, child, "every effect waiting")
        _advance_clock(pks, 3 * 3600)  # past the next scheduled retry of every effect
        _wait(lambda: RemoteEffect.objects.filter(pk__in=pks, state=EffectState.FINALIZED).count() == len(pks),
              60, child, "every effect finalized")
    finally:
        child.stop()
        if receiver is not None:
            receiver.stop()
    # Attempts at about 0 s, 5 s (4-6) and 5 min 5 s (244-366 s) fall in the ten minutes; the next one (30 min
    # later, at least 1,440 s) does not.
    assert set(unreached.values()) == {3}, unreached
    keys = {e.command.provider_idempotency_key for e in RemoteEffect.objects.select_related("command").filter(pk__in=pks)}
    assert receiver.applied == {key: 1 for key in keys}
    for pk in pks:
        outcomes = list(RemoteEffectAttempt.objects.filter(effect_id=pk).order_by("ordinal")
                        .values_list("outcome", flat=True))
        assert outcomes == ["no_effect"] * 3 + ["remote_confirmed"], (pk, outcomes)
