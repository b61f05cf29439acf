"""The frozen retry schedule of attempts that never reached the receiver (issue 37 item 1, D-420..D-422) and the
settlement retried until it lands or the holder generation is given up (item 3, D-424..D-425), in process against
the loopback receiver. tests/faults/test_receiver_outage.py and test_postgres_stop_egress.py prove the same with
real processes and real faults."""
from __future__ import annotations

import random
from datetime import timedelta

import httpx
import pytest
from django.db import OperationalError
from django.utils import timezone

from connector import demo
from effects import egress
from effects import egress_batch
from effects.errors import RetryPolicyInvalid
from effects.models import DispatchPermit, ProcessGeneration, RemoteEffect, RemoteEffectAttempt
from effects.services import dispatch, retry, worker
from effects.services.retry import declared_schedule, jittered
from tests.effects.helpers import acquire, author, send


@pytest.fixture
def retry_world(db, monkeypatch):
    monkeypatch.setattr(demo, "CALLOUT_DEFINITION", {**demo.CALLOUT_DEFINITION,
                                                     "retry": {"schedule_seconds": [30, 60]}})
    return demo.build_world("rs-", push=True)


def test_a_callout_declares_its_schedule_explicitly_or_exponentially_and_a_malformed_one_is_refused():
    """`schedule_seconds` is frozen as given; `exponential` expands to delays capped at its maximum while their sum
    stays within the horizon; anything else is RETRY_POLICY_INVALID; no declaration freezes the default (Svix's).
    Proves: issue 37 item 1"""
    assert declared_schedule({}) is None
    assert retry.frozen_schedule({}) == ([5, 300, 1800, 7200, 18000, 36000, 36000], False)
    assert declared_schedule({"retry": {"schedule_seconds": [1, 2]}}) == [1, 2]
    assert declared_schedule({"retry": {"exponential": {"first_seconds": 5, "factor": 2, "max_delay_seconds": 40},
                                        "horizon_seconds": 200}}) == [5, 10, 20, 40, 40, 40, 40]
    for bad in ({"schedule_seconds": []}, {"schedule_seconds": [0]}, {"schedule_seconds": ["5"]}, [5],
                {"schedule_seconds": [5], "extra": 1}, {"exponential": {"first_seconds": 5}, "horizon_seconds": 9},
                {"exponential": {"first_seconds": 5, "factor": 1, "max_delay_seconds": 9}, "horizon_seconds": 9}):
        with pytest.raises(RetryPolicyInvalid) as refused:
            declared_schedule({"retry": bad})
        assert refused.value.code == "RETRY_POLICY_INVALID"
    rng = random.Random(7)
    assert all(24 <= jittered(30, rng=rng) <= 36 for _ in range(200)) and jittered(0.1) == 1.0


@pytest.mark.parametrize("failure", [httpx.ConnectError("refused"), httpx.ConnectTimeout("connect timed out"),
                                     httpx.PoolTimeout("no free connection")])
def test_an_attempt_that_never_reached_the_receiver_is_retried_on_the_frozen_schedule(retry_world, receiver,
                                                                                      monkeypatch, failure):
    """Refused, a connect timeout or a pool timeout: no request byte left, so the attempt is `no_effect` without an
    answer and the effect returns to `prepared` with `next_attempt_at` about the schedule's first delay ahead; no
    claim takes it before. Once the schedule is spent the next such attempt ends it `no_effect` with
    RECEIVER_UNREACHABLE. Proves: issue 37 item 1"""
    command = author(retry_world.accounts[0])
    assert command.retry_schedule == [30, 60]

    def unreachable(*args, **kwargs):
        raise failure
    monkeypatch.setattr(egress._client(), "request", unreachable)
    effect = send(acquire("h1"))
    assert effect.state == "prepared" and effect.quarantine_reason == ""
    assert 24 <= (effect.next_attempt_at - timezone.now()).total_seconds() <= 36
    attempt = RemoteEffectAttempt.objects.get(effect=effect)
    assert attempt.outcome == "no_effect" and attempt.response_status is None
    assert attempt.evidence.startswith("connect failed: " + type(failure).__name__)
    assert dispatch.effect_claim(holder=dispatch.holder_register(holder_id="h1")) is None
    assert worker.effects_sweep()["claimable"] == 0
    from observability import readings  # the overview: waiting for its time, not a stuck prepared effect (D-426)
    counts = {b.stage: b.count for b in readings.backlogs()}
    assert (counts["effect_prepared"], counts["effect_retry_scheduled"], counts["effect_retry_due"]) == (0, 1, 0)
    from django.contrib.auth.models import User
    from django.test import Client

    page = Client()
    page.force_login(User.objects.create_superuser("ops-rs", password="pw-ops"))
    shown = page.get(f"/queue/effect/{effect.pk}/").content.decode()  # the schedule and the next attempt's time
    assert "1 of 3" in shown and "30 s, 60 s" in shown
    assert f"not before {timezone.localtime(effect.next_attempt_at):%Y-%m-%d %H:%M:%S}" in shown
    for step, wait in enumerate((40, 130)):
        with pytest.MonkeyPatch.context() as later:
            now = timezone.now()
            later.setattr(timezone, "now", lambda now=now, wait=wait: now + timedelta(seconds=wait))
            assert worker.effects_sweep()["claimable"] == 1
            effect = send(acquire("h1"))
    assert effect.state == "no_effect" and effect.quarantine_reason == "RECEIVER_UNREACHABLE"
    assert effect.next_attempt_at is None and receiver.requests == []
    assert retry.unreached_count(effect) == 3


def test_refusals_keep_max_attempts_and_end_with_their_reason(retry_world, receiver):
    """A receiver's refusal (422) is retried at once within `max_attempts` and then ends `no_effect` with
    NO_EFFECT_ATTEMPTS_SPENT; the schedule of unreached attempts is not touched. Proves: issue 37 item 1"""
    author(retry_world.accounts[0])
    receiver.default_mode = "refuse"
    states = [send(acquire("h1")) for _ in range(3)]
    assert [(e.state, e.next_attempt_at) for e in states[:2]] == [("prepared", None)] * 2
    assert states[2].state == "no_effect" and states[2].quarantine_reason == "NO_EFFECT_ATTEMPTS_SPENT"


def test_a_settlement_the_database_refuses_is_tried_again_until_it_lands(retry_world, receiver, monkeypatch,
                                                                         settings):
    """The answer is held while PostgreSQL fails the settlement twice (OperationalError): it is written on the third
    try, once, and the receiver saw one request. Proves: issue 37 item 3"""
    settings.CONNECTOR = {**settings.CONNECTOR, "SETTLE_RETRY_FIRST_SECONDS": 0.01}
    author(retry_world.accounts[0])
    real, failures = egress_batch.permits_settle_confirmed, []

    def flaky(**kwargs):
        if len(failures) < 2:
            failures.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        return real(**kwargs)
    monkeypatch.setattr(egress_batch, "permits_settle_confirmed", flaky)
    ready = acquire("h1")
    effect = egress_batch.send(permit_pk=ready.permit.pk, holder_id="h1", holder_fence=ready.permit.holder_fence,
                         credential_gate_fence=ready.permit.credential_gate_fence)
    assert len(failures) == 2 and effect.state == "finalized"
    assert len(receiver.requests) == 1 and receiver.applied_total() == 1


def test_a_settlement_that_never_lands_gives_the_generation_up(retry_world, receiver, monkeypatch, settings):
    """The settlement keeps failing past SETTLE_GIVE_UP_SECONDS: the holder generation is terminated with that
    evidence, its `sending` permit abandoned with the proof (the effect `uncertain`, never sent again blindly), and
    the worker takes a new generation. Proves: issue 37 item 3"""
    settings.CONNECTOR = {**settings.CONNECTOR, "SETTLE_RETRY_FIRST_SECONDS": 0.01, "SETTLE_GIVE_UP_SECONDS": 0.1}
    author(retry_world.accounts[0])

    def down(**kwargs):
        raise OperationalError("could not connect to server")
    monkeypatch.setattr(egress_batch, "permits_settle_confirmed", down)
    monkeypatch.setattr(worker, "_HOLDER_ID", "h-gives-up")
    effect = worker.effect_dispatch_once()
    assert effect.state == "uncertain"
    permit = DispatchPermit.objects.get(effect=effect)
    assert permit.state == "abandoned" and "could not be written" in permit.abandonment_proof
    assert ProcessGeneration.objects.get(holder_id="h-gives-up").state == "terminated"
    assert worker.holder_id() != "h-gives-up"
    assert RemoteEffect.objects.get(pk=effect.pk).state == "uncertain" and len(receiver.requests) == 1
