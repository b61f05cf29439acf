"""A limited destination in the batched egress step (issue 20, goal 4, D-371..D-373): its effects claimed as one
batch with the limiter `FOR UPDATE` admitting at most min(tokens, K - in flight), each sent behind its own marker
that reads the limiter `FOR SHARE` and refuses while the receiver deferred the destination, a refused permit
withdrawn with the proof that no byte was sent. Exactly-once is measured at the real test receiver; the workers
are threads on their own PostgreSQL connections."""
from __future__ import annotations

import math
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from effects import egress_batch
from effects.models import DestinationLimiter, DispatchPermit, RemoteEffect, RemoteEffectAttempt
from effects.services import dispatch, dispatch_batch, dispatch_withdraw, worker
from effects.services.dispatch import _destination_defer
from effects import locks
from tests.concurrency import backend_pid_waiting, start, wait_until
from tests.effects.helpers import author
from tests.support import scaled


@pytest.fixture
def limited(transactional_db, monkeypatch):
    """A push world whose callout declares a limit (both accounts are limited destinations)."""
    from connector import demo

    def build(prefix: str = "lb-", **rate):
        monkeypatch.setattr(demo, "CALLOUT_DEFINITION", {**demo.CALLOUT_DEFINITION, "rate_limit": rate})
        return demo.build_world(prefix, push=True)
    return build


def _author(account, n: int, prefix: str = "l") -> list:
    return [author(account, root=f"{prefix}-{i}", record_id=f"{prefix}{i}") for i in range(n)]


def _once(receiver, commands) -> None:
    keys = {c.provider_idempotency_key for c in commands}
    assert set(RemoteEffect.objects.filter(command__in=commands).values_list("state", flat=True)) == {"finalized"}
    assert [r["key"] for r in receiver.requests if r["key"] in keys and r["mode"] == "ok"].__len__() == len(keys)
    assert {k: receiver.applied[k] for k in keys} == dict.fromkeys(keys, 1)


def test_a_limited_batch_admits_at_most_half_the_free_slots_and_never_more_than_k(limited, receiver):
    """Six effects of a destination declared at 4 in flight, 8 per second, burst 8: each limited batch claim
    admits, under the limiter's lock, at most half the free slots (rounded up, D-374): 2 of 4 free, then 1 of 2,
    then 1 of 1; with 4 permits open the next claim is refused though tokens remain (K reached, nothing granted);
    the limiter's accounting counts each grant (4 of the 8 tokens taken). Each effect is then sent and finalized once. Proves: CV2-10-037"""
    acme = limited(requests_per_second=8, max_in_flight=4, burst=8).accounts[0]
    commands = _author(acme, 6)
    holder = dispatch.holder_register(holder_id="h-adm")
    claims = [dispatch_batch.effects_claim_batch(holder=holder, n=10, limited=True) for _ in range(4)]
    assert [len(c) for c in claims] == [2, 1, 1, 0]
    assert {p.limiter_pk for c in claims for p in c} == {commands[0].limiter_id}
    limiter = DestinationLimiter.objects.get(pk=commands[0].limiter_id)
    assert (limiter.granted_total, limiter.refused_total) == (4, 1) and 4 <= limiter.tokens < 5
    assert DispatchPermit.objects.filter(limiter=limiter, state="granted").count() == 4
    for c in claims[:3]:
        egress_batch.send_batch(permits=c, holder_id="h-adm")
    deadline = time.monotonic() + scaled(10)
    while RemoteEffect.objects.filter(command__in=commands, state="prepared").exists():
        assert time.monotonic() < deadline
        egress_batch.send_batch(permits=dispatch_batch.effects_claim_batch(holder=holder, n=10, limited=True),
                                holder_id="h-adm")
        time.sleep(0.05)
    _once(receiver, commands)


def test_no_permit_is_granted_while_the_receiver_deferred_the_destination(limited, receiver):
    """A destination whose receiver deferred it: the limited batch claim grants nothing (it writes only the
    limiter's refusal, the effects stay `prepared` with no Attempt), and the batched step still serves the other
    destination at once. Proves: CV2-10-037"""
    world = limited(requests_per_second=50, max_in_flight=4)
    acme, other = world.accounts
    deferred = _author(acme, 2)
    with transaction.atomic():
        _destination_defer(limiter=locks.limiter_for_update(deferred[0].limiter_id), seconds=30, status=429)
    holder = dispatch.holder_register(holder_id="h-def")
    assert dispatch_batch.effects_claim_batch(holder=holder, n=10, limited=True, account_id=acme.pk) == []
    assert not DispatchPermit.objects.filter(limiter_id=deferred[0].limiter_id).exists()
    assert not RemoteEffectAttempt.objects.filter(effect__command__in=deferred).exists()
    free = _author(other, 2, prefix="f")
    done = worker.effect_dispatch_batch(n=10, holder_name="h-def")
    assert sorted(e.pk for e in done) == sorted(c.effect.pk for c in free)
    assert {e.state for e in RemoteEffect.objects.filter(command__in=deferred)} == {"prepared"}
    _once(receiver, free)


def test_a_429_stops_the_rest_of_the_batch_and_its_permits_are_withdrawn(limited, receiver):
    """A limited batch of three: the receiver answers the first `429 Retry-After: R` (2 s stretched by the suite's
    time factor, so that the check made inside the deferral is inside it on a loaded machine too). That answer is settled
    (recording the deferral) before the next marker, which refuses; the two permits still `granted` are
    withdrawn with the proof that no byte was sent (permit `abandoned`, Attempt `no_effect` not counted, effect
    `prepared` with no lease): the receiver gets no further request, and after the deferral each effect lands
    once. Proves: CV2-10-037, CV2-10-040"""
    acme = limited(requests_per_second=50, max_in_flight=6).accounts[0]
    commands = _author(acme, 3)
    retry_after = math.ceil(scaled(2))
    receiver.modes, receiver.retry_after = ["throttle"], str(retry_after)
    done = worker.effect_dispatch_batch(n=10, holder_name="h-429")
    assert [r["mode"] for r in receiver.requests] == ["throttle"]
    assert {e.state for e in done} == {"prepared"} and len(done) == 3
    withdrawn = DispatchPermit.objects.filter(effect__command__in=commands[1:])
    assert {(p.state, p.io_may_have_started) for p in withdrawn} == {("abandoned", False)}
    assert all("no byte was sent" in p.abandonment_proof for p in withdrawn)
    assert not RemoteEffect.objects.filter(command__in=commands).exclude(lease_expires_at=None).exists()
    assert worker.effect_dispatch_batch(n=10, holder_name="h-429") == []  # deferred: nothing granted
    deadline = time.monotonic() + retry_after + scaled(8)
    while RemoteEffect.objects.filter(command__in=commands, state="prepared").exists():
        assert time.monotonic() < deadline
        worker.effect_dispatch_batch(n=10, holder_name="h-429")
        time.sleep(0.02)
    after = [r for r in receiver.requests if r["mode"] == "ok"]
    assert after[0]["at"] - receiver.requests[0]["answered_at"] >= retry_after
    _once(receiver, commands)
    assert RemoteEffect.objects.filter(command__in=commands, attempt_count__gte=2).count() == 3


def test_a_marker_waits_for_a_deferral_being_recorded_and_then_refuses(limited, receiver):
    """D-371, two connections: a settlement holds the limiter `FOR UPDATE` while it records a receiver's deferral;
    a granted permit's marker (limiter `FOR SHARE`) waits for it, then reads the committed deferral and refuses:
    the permit stays `granted`, nothing is sent. Proves: CV2-10-037"""
    acme = limited(requests_per_second=50, max_in_flight=4).accounts[0]
    commands = _author(acme, 1)
    permits = dispatch_batch.effects_claim_batch(holder=dispatch.holder_register(holder_id="h-m"), n=10, limited=True)
    held, release = threading.Event(), threading.Event()

    def defer():
        with transaction.atomic():
            _destination_defer(limiter=locks.limiter_for_update(commands[0].limiter_id), seconds=30, status=429)
            held.set()
            release.wait(scaled(10))

    settler = start(defer, "settler")
    assert held.wait(scaled(10))
    marker = start(lambda: egress_batch.win_sending_batch(permits=permits, holder_id="h-m"), "marker")
    assert wait_until(lambda: len(backend_pid_waiting()) == 1), "the marker must wait for the deferral's lock"
    release.set()
    settler.join(scaled(10)), marker.join(scaled(10))
    assert (settler.error, marker.error, marker.result) == (None, None, [])
    assert DispatchPermit.objects.get(pk=permits[0].permit_pk).state == "granted"
    assert receiver.requests == []
    assert dispatch_withdraw.permits_withdraw(permits=permits, holder_id="h-m") == [permits[0].effect_pk]


def test_four_workers_never_exceed_k_in_flight_of_the_limited_destination(limited, receiver, monkeypatch):
    """Four batched workers on their own connections drain a destination declared at 2 in flight (each claim
    admits half its free slots, so one permit: its permits spread over the workers; receiver 30 ms per answer) and a destination without a limit: the receiver never has more than 2 of the limited one in
    flight and saw 2 at some point; the unlimited one had more than 2 at once (it is held to no limit); every
    effect lands once. Proves: CV2-10-037, CV2-10-038"""
    from effects.services import outbound

    world = limited(requests_per_second=100, max_in_flight=2)
    acme, other = world.accounts
    a = _author(acme, 16, prefix="a")
    monkeypatch.setattr(outbound, "declared_rate_limit", lambda _definition: None)
    b = _author(other, 40, prefix="b")
    monkeypatch.undo()
    assert b[0].limiter_id is None and a[0].limiter_id is not None
    receiver.service_seconds = 0.03
    receiver.group_of = lambda path: path.rsplit("/", 1)[-1][0]
    deadline = time.monotonic() + scaled(60)

    def drain(name):
        while time.monotonic() < deadline and RemoteEffect.objects.filter(state="prepared").exists():
            if not worker.effect_dispatch_batch(n=4, holder_name=name):
                time.sleep(0.005)
    workers = [start(lambda i=i: drain(f"h-w{i}"), f"w{i}") for i in range(4)]
    for w in workers:
        w.join(scaled(90))
    assert [w.error for w in workers] == [None] * 4
    assert receiver.group_max_in_flight["a"] == 2, receiver.group_max_in_flight
    assert receiver.group_max_in_flight["b"] >= 2, receiver.group_max_in_flight
    _once(receiver, a + b)


def _limited_step_statements(account) -> tuple[list[int], list[str]]:
    holder = dispatch.holder_register(holder_id="h-st")
    with CaptureQueriesContext(connection) as claim_q:
        permits = dispatch_batch.effects_claim_batch(holder=holder, n=10, limited=True)
    with CaptureQueriesContext(connection) as send_q:
        egress_batch.send_batch(permits=permits, holder_id="h-st")
    return [len(permits), len(claim_q), len(send_q)], [q["sql"][:90] for q in (*claim_q.captured_queries,
                                                                                 *send_q.captured_queries)]


@pytest.mark.parametrize("n", [1, 3])
def test_limited_batch_statement_counts_are_pinned(limited, receiver, n):
    """A limited batch of n: the claim costs the unlimited batch claim's statements plus the limiter's lock, the
    in-flight count and its update (LIMITED_CLAIM for any n); the send costs the effects' read, per permit its
    marker transaction (BEGIN, credential gate, limiter FOR SHARE, permit, holder, UPDATE, COMMIT) and the
    confirmed settlement transaction (LIMITED_SEND_FIXED + n x LIMITED_MARKER). Proves: CV2-10-037"""
    acme = limited(requests_per_second=100, max_in_flight=8).accounts[0]
    _author(acme, n)
    (granted, claim_n, send_n), sql = _limited_step_statements(acme)
    assert (granted, claim_n, send_n) == (n, LIMITED_CLAIM, LIMITED_SEND_FIXED + n * LIMITED_MARKER), sql


LIMITED_CLAIM, LIMITED_SEND_FIXED, LIMITED_MARKER = 12, 11, 8


def test_a_batch_of_one_marker_refuses_while_deferred_and_the_send_withdraws_the_permit(limited, receiver):
    """D-402, a batch of one (the Citus configuration's step): a limited permit granted, then the receiver's
    deferral recorded before its marker: `egress_batch.send` refuses (`DestinationDeferred`, nothing sent, the
    permit left `granted`), and the worker's send path (`send_batch`) withdraws the permit with the proof that no
    byte was sent, so the effect is `prepared` again at once and its attempt is not counted.
    Proves: CV2-10-037, CV2-10-040"""
    from effects.errors import DestinationDeferred

    acme = limited(requests_per_second=50, max_in_flight=4).accounts[0]
    commands = _author(acme, 2)
    holder = dispatch.holder_register(holder_id="h-one")
    [granted] = dispatch_batch.effects_claim_batch(holder=holder, n=1, account_id=acme.pk, limited=True)
    permit = DispatchPermit.objects.get(pk=granted.permit_pk)
    assert permit.limiter_id == commands[0].limiter_id
    with transaction.atomic():
        _destination_defer(limiter=locks.limiter_for_update(permit.limiter_id), seconds=30, status=429)
    with pytest.raises(DestinationDeferred):
        egress_batch.send(permit_pk=permit.pk, holder_id="h-one", holder_fence=permit.holder_fence,
                          credential_gate_fence=permit.credential_gate_fence)
    assert receiver.requests == [] and DispatchPermit.objects.get(pk=permit.pk).state == "granted"

    effect = egress_batch.send_batch(permits=[granted], holder_id="h-one")[granted.effect_pk]
    assert receiver.requests == []
    assert (effect.state, effect.lease_expires_at) == ("prepared", None)
    closed = DispatchPermit.objects.get(pk=permit.pk)
    assert (closed.state, closed.io_may_have_started) == ("abandoned", False)
    assert "no byte was sent" in closed.abandonment_proof
