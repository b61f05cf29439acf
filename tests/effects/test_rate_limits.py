"""Per-destination rate and concurrency limits across workers (issue 20, D-222..D-224): declared in the callout's
frozen dispatch policy, enforced under the destination limiter's row lock before a DispatchPermit is granted,
shared by every egress worker (threads on their own PostgreSQL connections here), and a receiver's `429` /
`Retry-After` defers only its own destination. Exactly-once is measured at the real test receiver."""
from __future__ import annotations

import math
import time
from datetime import timedelta
from email.utils import format_datetime

import httpx
import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from connector.canonical.profiles import profile_for
from connector.receipts import canonical_json
from effects import egress
from effects.errors import DestinationDeferred, RateLimitInvalid
from effects.models import DestinationLimiter, DispatchPermit, OutboundCommand, RemoteEffect, RemoteEffectAttempt
from effects.services import dispatch, worker
from effects.services.outbound import declared_rate_limit
from tests.concurrency import raised, run_concurrently, start
from tests import dbroles
from tests.effects.helpers import ACTOR, author, claim, refused_by
from tests.support import scaled


def _limited_world(monkeypatch, prefix: str, **rate):
    from connector import demo

    monkeypatch.setattr(demo, "CALLOUT_DEFINITION", {**demo.CALLOUT_DEFINITION, "rate_limit": rate})
    return demo.build_world(prefix, push=True)


def _author_many(account, n: int, start_at: int = 0) -> list[OutboundCommand]:
    return [author(account, root=f"order-{i}", record_id=f"r{i}") for i in range(start_at, start_at + n)]


def _drain(holder: str, deadline: float, account_id: int | None = None) -> None:
    """One egress worker: dispatch until nothing of its scope is left prepared or the deadline passes."""
    while time.monotonic() < deadline:
        if worker.effect_dispatch_once(holder_name=holder, account_id=account_id) is None:
            scope = RemoteEffect.objects.filter(state="prepared")
            if account_id is not None:
                scope = scope.filter(account_id=account_id)
            if not scope.exists():
                return
            time.sleep(0.005)


def _finalized_exactly_once(receiver, commands) -> None:
    keys = {c.provider_idempotency_key for c in commands}
    assert set(RemoteEffect.objects.filter(command__in=commands).values_list("state", flat=True)) == {"finalized"}
    assert {k: receiver.applied[k] for k in keys} == dict.fromkeys(keys, 1)
    applied = [r for r in receiver.requests if r["key"] in keys and r["mode"] == "ok"]
    assert len(applied) == len(keys), "a logical effect was sent twice"


# -- declaration ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("declared", [
    "50/s", {"requests_per_second": 0, "max_in_flight": 4}, {"requests_per_second": 50},
    {"requests_per_second": 50, "max_in_flight": 4.0}, {"requests_per_second": True, "max_in_flight": 4},
    {"requests_per_second": 50, "max_in_flight": 4, "per": "minute"},
    {"requests_per_second": 5, "max_in_flight": 4, "burst": 6}, {"requests_per_second": 100_001, "max_in_flight": 1},
])
def test_a_malformed_rate_limit_is_refused_with_its_code(declared):
    """A rate limit is two positive integers (and an optional burst not above the rate); anything else is
    RATE_LIMIT_INVALID. Proves: CV2-10-037"""
    with pytest.raises(RateLimitInvalid) as refused:
        declared_rate_limit({"rate_limit": declared})
    assert refused.value.code == "RATE_LIMIT_INVALID"
    assert declared_rate_limit({}) is None
    assert declared_rate_limit({"rate_limit": {"requests_per_second": 50, "max_in_flight": 4}}) == {
        "requests_per_second": 50, "max_in_flight": 4, "burst": 4}


def test_authoring_with_a_malformed_rate_limit_writes_nothing(db, monkeypatch):
    """The callout's malformed `rate_limit` refuses the command before any row is written (no command, effect or
    limiter). Proves: CV2-10-037"""
    world = _limited_world(monkeypatch, "bad-", requests_per_second=0, max_in_flight=4)
    with pytest.raises(RateLimitInvalid):
        author(world.accounts[0])
    assert not OutboundCommand.objects.exists() and not DestinationLimiter.objects.exists()


def test_the_declared_limit_is_frozen_on_the_command_and_in_its_route_policy_digest(db, monkeypatch):
    """The limit is part of the frozen route policy: the command carries R, K and the burst, references its
    destination's one limiter, and its route policy digest covers the limit (a changed limit is a new binding).
    A callout without a limit keeps the digest of `{max_attempts, timeout_ms}` and no limiter. Proves: CV2-10-037"""
    world = _limited_world(monkeypatch, "fz-", requests_per_second=50, max_in_flight=4)
    acme, other = world.accounts
    first, second, third = author(acme, root="a"), author(acme, root="b"), author(other, root="a")
    assert (first.rate_requests_per_second, first.rate_max_in_flight, first.rate_burst) == (50, 4, 4)
    assert first.limiter_id == second.limiter_id != third.limiter_id
    assert DestinationLimiter.objects.count() == 2
    profile = profile_for(first.profile_id)
    policy = {"max_attempts": 3, "timeout_ms": 5000}
    limited = {**policy, "rate_limit": {"requests_per_second": 50, "max_in_flight": 4, "burst": 4}}
    assert bytes(first.route_policy_digest) == profile.digest("route-policy", canonical_json(limited))
    assert bytes(first.route_policy_digest) != profile.digest("route-policy", canonical_json(policy))


def test_an_undeclared_destination_takes_no_limiter(push_world, receiver):
    """Without a declared limit no limiter row exists or is read or locked: claim, permit and send run as
    before. Proves: CV2-10-037"""
    command = author(push_world.accounts[0])
    assert command.limiter_id is None and command.rate_requests_per_second is None
    with CaptureQueriesContext(connection) as queries:
        effect = worker.effect_dispatch_once(holder_name="h-free")
    assert effect.state == "finalized"
    touching = [q["sql"] for q in queries.captured_queries if "destinationlimiter" in q["sql"]]
    # Only the limited batch's candidate query names the table (it finds no limited destination); nothing locks or
    # writes it.
    assert len(touching) == 1 and "FOR UPDATE" not in touching[0] and "FOR SHARE" not in touching[0]
    assert not any(sql.lstrip().startswith(("UPDATE", "INSERT")) for sql in touching)
    assert DispatchPermit.objects.get().limiter_id is None and not DestinationLimiter.objects.exists()


def test_limiter_constraints_hold_around_the_services(db, monkeypatch):
    """PostgreSQL refuses a negative bucket, a deferral past `not_before`, a second limiter for one destination
    and a command whose limit is partial. Proves: CV2-10-037"""
    world = _limited_world(monkeypatch, "ck-", requests_per_second=5, max_in_flight=1)
    command = author(world.accounts[0])
    limiter = DestinationLimiter.objects.get()
    assert refused_by("UPDATE effects_destinationlimiter SET tokens = -1 WHERE id = %s", [limiter.pk]) \
        == "effects_limiter_tokens_not_negative"
    assert refused_by("UPDATE effects_destinationlimiter SET deferred_until = now() + interval '5 s', "
                      "not_before = now() WHERE id = %s", [limiter.pk]) == "effects_limiter_deferral_within_not_before"
    with pytest.raises(IntegrityError), transaction.atomic():
        DestinationLimiter.objects.create(account_id=limiter.account_id, callout=limiter.callout)
    for column, value in (("limiter_id", None), ("rate_max_in_flight", 0)):
        # The command is append-only (its trigger refuses any UPDATE first); with triggers off for this one
        # statement, the CHECK is what refuses a partial or zero limit.
        with dbroles.as_admin("default"), pytest.raises(IntegrityError) as refused, transaction.atomic(), \
                connection.cursor() as cursor:
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute(f"UPDATE effects_outboundcommand SET {column} = %s WHERE id = %s", [value, command.pk])
        assert refused.value.__cause__.diag.constraint_name == "effects_command_rate_limit_whole"


# -- concurrency limit ------------------------------------------------------------------------------------------

@pytest.fixture
def tx_limited(transactional_db, monkeypatch):
    def build(prefix: str = "rl-", **rate):
        return _limited_world(monkeypatch, prefix, **rate)
    return build


def test_concurrent_acquirers_never_exceed_max_in_flight(tx_limited):
    """Eight workers on their own connections claim and acquire at once for a destination declared with 2 in
    flight: exactly 2 permits are granted; every other worker is deferred or finds nothing, and each deferred
    effect is `prepared` again with its lease released and its attempt closed as never sent. Proves: CV2-10-037"""
    world = tx_limited(requests_per_second=1000, max_in_flight=2)
    acme = world.accounts[0]
    _author_many(acme, 8)
    holders = [dispatch.holder_register(holder_id=f"h-k{i}") for i in range(8)]

    def one(holder):
        c = dispatch.effect_claim(holder=holder, account_id=acme.pk)
        if c is None:
            return None
        try:
            return dispatch.permit_acquire(claim=c).pk
        except DestinationDeferred:
            return "deferred"

    results = run_concurrently([lambda holder=holder: one(holder) for holder in holders])
    assert raised(results) == []
    granted = [r for r in results if isinstance(r, int)]
    assert len(granted) == 2
    assert DispatchPermit.objects.filter(state="granted").count() == 2
    assert RemoteEffect.objects.filter(state="dispatching").count() == 2
    prepared = RemoteEffect.objects.filter(state="prepared")
    assert prepared.count() == 6 and not prepared.exclude(lease_expires_at=None).exists()
    deferred = RemoteEffectAttempt.objects.filter(evidence__startswith="deferred by the destination limiter")
    assert deferred.count() == sum(1 for r in results if r == "deferred")
    assert set(deferred.values_list("outcome", flat=True)) <= {"no_effect"}
    assert not DispatchPermit.objects.filter(attempt__in=deferred).exists()


def test_receiver_never_sees_more_than_max_in_flight_and_every_effect_lands_once(tx_limited, receiver):
    """Four egress workers drain twelve effects of a destination declared with 2 in flight against a receiver
    that takes 50 ms per answer: the receiver never has more than 2 requests of it in flight, and each effect is
    applied exactly once and finalized. Proves: CV2-10-037, CV2-10-038"""
    world = tx_limited(requests_per_second=1000, max_in_flight=2)
    commands = _author_many(world.accounts[0], 12)
    receiver.service_seconds = 0.05
    deadline = time.monotonic() + scaled(60)
    workers = [start(lambda i=i: _drain(f"h-d{i}", deadline), f"drain-{i}") for i in range(4)]
    for w in workers:
        w.join(scaled(90))
    assert [w.error for w in workers] == [None] * 4
    assert receiver.max_in_flight <= 2
    assert max(r["in_flight"] for r in receiver.requests) == 2, "the workers never used the declared concurrency"
    _finalized_exactly_once(receiver, commands)


# -- rate --------------------------------------------------------------------------------------------------------

def test_requests_per_second_hold_over_every_window_across_workers(tx_limited, receiver):
    """Four workers drain a destination declared at 2 requests per second with a burst of 1 (a rate this shared
    test machine sustains with room to spare): between any two requests the receiver saw there are never more
    than 1 + 2 x (elapsed seconds), plus one for the jitter between the grant and the arrival, and the
    destination is not starved (at least half the declared rate). Proves: CV2-10-037"""
    world = tx_limited(requests_per_second=2, max_in_flight=10, burst=1)
    commands = _author_many(world.accounts[0], 10)
    deadline = time.monotonic() + scaled(60)
    workers = [start(lambda i=i: _drain(f"h-r{i}", deadline), f"rate-{i}") for i in range(4)]
    for w in workers:
        w.join(scaled(90))
    assert [w.error for w in workers] == [None] * 4
    times = sorted(r["at"] for r in receiver.requests)
    assert len(times) == 10
    for i in range(len(times)):
        for j in range(i + 1, len(times)):
            assert j - i + 1 <= 1 + 2 * (times[j] - times[i]) + 1, (i, j, times[j] - times[i])
    assert 9 / (times[-1] - times[0]) >= 1.0
    refused = DestinationLimiter.objects.get().refused_total
    _finalized_exactly_once(receiver, commands)
    print(f"10 requests in {times[-1] - times[0]:.2f} s, {refused} refused acquisitions")


# -- isolation between destinations and Retry-After ---------------------------------------------------------

def test_a_full_destination_does_not_hold_up_another(tx_limited, receiver):
    """One account's destination has its one permit in flight; a worker that claims without an account filter
    passes over its effects and dispatches the other account's, whose acquisition never waits for the full
    destination's limiter. Proves: CV2-10-037"""
    world = tx_limited(requests_per_second=1000, max_in_flight=1)
    acme, other = world.accounts
    _author_many(acme, 3)
    stuck = dispatch.permit_acquire(claim=claim("h-stuck", acme)[1])
    assert stuck.state == "granted"
    mine = author(other, root="b-1", record_id="b1")
    holder, c = claim("h-free")
    assert c is not None and RemoteEffect.objects.get(pk=c.effect_pk).account_id == other.pk
    permit = dispatch.permit_acquire(claim=c)
    assert permit.limiter_id == mine.limiter_id != stuck.limiter_id
    assert claim("h-free-2")[1] is None, "the full destination's effects are not claimed"


def test_retry_after_defers_only_its_destination_and_the_effect_still_lands_once(tx_limited, receiver):
    """The receiver answers one account's request `429` with `Retry-After: R` (1 s stretched by the suite's time
    factor, so that the checks inside the deferral are made inside it on a loaded machine too): that attempt is
    proven no effect (it does not count against the policy), the effect is `prepared` again, and its destination
    gets no request for R s while the other account's destination is served at once; after the deferral the effect
    is sent once more, applied once and finalized. Proves: CV2-10-037, CV2-10-028"""
    world = tx_limited(requests_per_second=1000, max_in_flight=4)
    acme, other = world.accounts
    throttled = author(acme, root="t-1", record_id="t1")
    free = author(other, root="f-1", record_id="f1")
    retry_after = math.ceil(scaled(1))
    receiver.modes, receiver.retry_after = ["throttle"], str(retry_after)
    t0, before = time.monotonic(), timezone.now()
    effect = worker.effect_dispatch_once(holder_name="h-429", account_id=acme.pk)
    after = timezone.now()
    assert effect.state == "prepared" and effect.attempt_count == 1
    limiter = DestinationLimiter.objects.get(pk=throttled.limiter_id)
    assert limiter.deferrals_total == 1 and limiter.last_deferral_status == 429
    deferral, slack = timedelta(seconds=retry_after), timedelta(milliseconds=50)  # from the answer's arrival
    assert before + deferral - slack <= limiter.deferred_until <= after + deferral + slack
    assert DestinationLimiter.objects.get(pk=free.limiter_id).deferred_until is None
    assert worker.effect_dispatch_once(holder_name="h-429", account_id=acme.pk) is None
    assert worker.effect_dispatch_once(holder_name="h-429").state == "finalized"  # the other destination
    assert [r["mode"] for r in receiver.requests] == ["throttle", "ok"]
    while worker.effect_dispatch_once(holder_name="h-429", account_id=acme.pk) is None:
        assert time.monotonic() - t0 < retry_after + scaled(4)
        time.sleep(0.02)
    resent = [r for r in receiver.requests if r["key"] == throttled.provider_idempotency_key]
    assert [r["mode"] for r in resent] == ["throttle", "ok"]
    assert resent[1]["at"] - resent[0]["at"] >= retry_after - 0.05
    _finalized_exactly_once(receiver, [throttled, free])
    first = RemoteEffectAttempt.objects.get(effect__command=throttled, ordinal=1)
    assert (first.outcome, first.response_status) == ("no_effect", 429)


@pytest.mark.parametrize("header,status,expected", [
    ("2", 429, 2.0), (None, 429, 1.0), ("0", 503, 0.0), ("999999", 429, 300.0), ("soon", 429, 1.0),
    (None, 503, None), ("5", 201, 5.0),
])
def test_retry_after_is_read_as_seconds_or_a_date_and_capped(header, status, expected, settings):
    """`Retry-After` in delta-seconds or as an HTTP-date defers its destination, a bare 429 for 1 s, never more
    than RATE_LIMIT_MAX_DEFER_SECONDS (300). Proves: CV2-10-037"""
    headers = {"Retry-After": header} if header is not None else {}
    assert egress._defer_seconds(httpx.Response(status, headers=headers)) == expected
    dated = httpx.Response(429, headers={"Retry-After": format_datetime(timezone.now() + timedelta(seconds=30),
                                                                        usegmt=True)})
    assert 28 <= egress._defer_seconds(dated) <= 30


# -- statement counts ---------------------------------------------------------------------------------------------

def _claim_and_permit_counts(account) -> tuple[int, int, list[str]]:
    _author_many(account, 2)
    holder = dispatch.holder_register(holder_id="h-sc")
    with CaptureQueriesContext(connection) as claim_q:
        c = dispatch.effect_claim(holder=holder)
    with CaptureQueriesContext(connection) as permit_q:
        dispatch.permit_acquire(claim=c)
    return len(claim_q), len(permit_q), [q["sql"][:90] for q in (*claim_q.captured_queries,
                                                                  *permit_q.captured_queries)]


def test_claim_and_permit_statement_counts_are_pinned(db, monkeypatch):
    """Claim + permit of a limited destination cost 8 + 15 statements: the unlimited path's 7 + 12 plus the
    limiter's unlocked look at claim (one statement) and, at acquisition, its lock, the in-flight count and its
    update. (Claim was 9 and 8 until the command and its credential generation were read in one statement, issue
    23, D-244.) Proves: CV2-10-037"""
    world = _limited_world(monkeypatch, "sc-", requests_per_second=1000, max_in_flight=4)
    claim_n, permit_n, sql = _claim_and_permit_counts(world.accounts[0])
    assert (claim_n, permit_n) == (LIMITED_CLAIM, LIMITED_PERMIT), sql


def test_unlimited_claim_and_permit_statement_counts_are_pinned(push_world):
    """Without a declared limit claim + permit cost what they cost before the limiter existed. Proves: CV2-10-037"""
    claim_n, permit_n, sql = _claim_and_permit_counts(push_world.accounts[0])
    assert (claim_n, permit_n) == (UNLIMITED_CLAIM, UNLIMITED_PERMIT), sql


LIMITED_CLAIM, LIMITED_PERMIT = 8, 15
UNLIMITED_CLAIM, UNLIMITED_PERMIT = 7, 12


def test_a_limiter_refusal_inside_the_claim_leaves_the_effect_prepared_with_nothing(db, monkeypatch):
    """The destination admits one permit in flight: the second claim of its batch (D-372) falls under the
    limiter's lock inside the one claim + permit transaction and is refused, writing only the limiter's refusal.
    The effect stays `prepared` with no Attempt, no lease and no permit; once the first permit is abandoned (its
    holder terminated) the destination grants again.
    Proves: CV2-10-037"""
    from effects.services import dispatch_batch

    world = _limited_world(monkeypatch, "lr-", requests_per_second=1000, max_in_flight=1)
    acme = world.accounts[0]
    first_cmd, second_cmd = _author_many(acme, 2)
    holder = dispatch.holder_register(holder_id="h-lr")
    [first] = dispatch_batch.effects_claim_batch(holder=holder, n=2, account_id=acme.pk, limited=True)
    assert first.effect_pk == RemoteEffect.objects.get(command=first_cmd).pk
    assert dispatch_batch.effects_claim_batch(holder=holder, n=2, account_id=acme.pk, limited=True) == []
    second = RemoteEffect.objects.get(command=second_cmd)
    assert (second.state, second.attempt_count, second.lease_holder, second.lease_expires_at) == (
        "prepared", 0, "", None)
    assert not RemoteEffectAttempt.objects.filter(effect=second).exists()
    assert not DispatchPermit.objects.filter(effect=second).exists()
    limiter = DestinationLimiter.objects.get(pk=second_cmd.limiter_id)
    assert limiter.granted_total == 1 and limiter.refused_total >= 1
    dispatch.holder_terminate(holder_id="h-lr", actor=ACTOR, evidence="test: the first holder stops")
    dispatch.permit_abandon(permit_pk=first.permit_pk, actor=ACTOR)
    [again] = dispatch_batch.effects_claim_batch(holder=dispatch.holder_register(holder_id="h-lr2"), n=1,
                                                 account_id=acme.pk, limited=True)
    assert again.effect_pk == first.effect_pk  # the abandoned one, prepared again
    assert DispatchPermit.objects.get(pk=again.permit_pk).state == "granted"
    assert RemoteEffect.objects.get(pk=second.pk).state == "prepared"  # still claimable, nothing lost


# -- operator view -------------------------------------------------------------------------------------------------

def test_the_operator_sees_each_destinations_limit_rate_and_deferrals(db, client, monkeypatch, receiver):
    """The admin's destination limiter pages show the declared limit, the recent rate, permits in flight and the
    receiver's deferrals, read-only. Proves: CV2-10-037"""
    from django.contrib.auth.models import User
    from django.urls import reverse

    world = _limited_world(monkeypatch, "op-", requests_per_second=50, max_in_flight=4)
    author(world.accounts[0])
    receiver.modes = ["throttle"]
    assert worker.effect_dispatch_once(holder_name="h-op").state == "prepared"
    client.force_login(User.objects.create_superuser("op", password="x"))
    listing = client.get(reverse("admin:effects_destinationlimiter_changelist"))
    assert listing.status_code == 200
    text = listing.content.decode()
    assert "50/s, 4 in flight, burst 4" in text and "0.1/s over 10 s" in text
    limiter = DestinationLimiter.objects.get()
    assert limiter.deferrals_total == 1 and limiter.granted_total == 1
    page = client.get(reverse("admin:effects_destinationlimiter_change", args=[limiter.pk]))
    assert page.status_code == 200 and b'name="_save"' not in page.content
