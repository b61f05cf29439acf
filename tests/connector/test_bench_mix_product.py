"""`manage.py bench hot-account --product` (issue 20, goal 2; D-388..D-391): the product mode's accounting counts
completions from the effects PostgreSQL holds `finalized` inside the window, and finds a duplicate POST, an
admitted event without a finalized effect and a finalized effect that never reached the receiver; its role steps
(the product's batched materialize, claim + Runtime, lane advance and egress steps) take admitted events to
`finalized` with each key applied once at the receiver. Proves: CV2-14-002 (the bench's figures are measured, on
PostgreSQL)."""
from __future__ import annotations

import datetime as dt

import pytest
from django.conf import settings
from django.db import connections

from bench.hot_pool import _conninfo
from bench.mix_product import Wakes, claims_step, egress_step, materialize_step
from bench.mix_product_run import accounting, check_product, marks, tally
from connector.actors import Actor
from connector.demo import DEMO_CHANNEL, build_world, demo_event_body
from connector.services.admission import receipt_admit
from tests.effects.receiver import Receiver

pytestmark = pytest.mark.usefixtures("administrator")

DB = {"transaction": True, "databases": ["default", "journal"]}
T0 = 1_000_000.0


def _at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(T0 + seconds, tz=dt.timezone.utc)


def test_tally_counts_finalized_inside_the_window_and_finds_duplicates_and_lost():
    """Completions are the effects `finalized` with changed_at inside [start, deadline] (one before, one after and
    a prepared one do not count); exactly-once holds only when every admitted event has one finalized effect whose
    key arrived once: a second POST of a key, an admitted event without an effect and a finalized key that never
    arrived each break it, and `check_product` names the failure and a completions floor."""
    rows = [("k1", "finalized", _at(1)), ("k2", "finalized", _at(5)), ("k3", "finalized", _at(-1)),
            ("k4", "finalized", _at(11)), ("k5", "prepared", _at(2))]
    clean = tally(rows[:4], T0, T0 + 10, [{"key": k} for k in ("k1", "k2", "k3", "k4")], admitted=4)
    assert clean["completions"] == 2 and clean["per_second"] == 0.2, clean
    assert clean["exactly_once"] and clean["not_finalized"] == 0, clean

    duplicate = tally(rows[:4], T0, T0 + 10, [{"key": k} for k in ("k1", "k1", "k2", "k3", "k4")], admitted=4)
    assert duplicate["receiver"]["duplicate_keys"] == 1 and not duplicate["exactly_once"], duplicate
    unfinished = tally(rows, T0, T0 + 10, [{"key": k} for k in ("k1", "k2", "k3", "k4")], admitted=5)
    assert unfinished["not_finalized"] == 1 and unfinished["effect_states"] == {"finalized": 4, "prepared": 1}
    assert not unfinished["exactly_once"], unfinished
    never_sent = tally(rows[:4], T0, T0 + 10, [{"key": k} for k in ("k1", "k2", "k3")], admitted=4)
    assert never_sent["receiver"]["lost"] == 1 and not never_sent["exactly_once"], never_sent

    run = {**duplicate, "clients": 8, "classes": {}, "unaccounted_rejections": 0, "control": {"problems": []}}
    failures = check_product(run, {"clients": {"8": {"completions_per_s_floor": 100.0}}})
    assert any("not exactly once" in f for f in failures), failures
    assert any("< floor 100.0" in f for f in failures), failures
    assert check_product({**run, **clean}, {}) == []


@pytest.mark.django_db(**DB)
def test_role_steps_finalize_admitted_events_once(monkeypatch):
    """Three events admitted as the clients admit them; the materializer's, the claims stage's (with the
    lane_advance messages it publishes, run by the same process) and egress's steps run in turn: the accounting
    from PostgreSQL counts 3 completions, 3 keys each applied once at the receiver. A key POSTed again straight to
    the receiver then shows as a duplicate."""
    world = build_world("mixp-", push=True)
    account = world.accounts[0]
    receiver = Receiver().start()
    monkeypatch.setattr(settings, "CONNECTOR", {**settings.CONNECTOR, "EGRESS_BASE_URL": receiver.url})
    wakes = Wakes().install()
    try:
        conninfo = _conninfo(connections["default"].settings_dict)
        since = marks(conninfo)
        start = dt.datetime.now(dt.timezone.utc).timestamp() - 1
        actor = Actor.system("bench-hot-account")
        for i in range(3):
            receipt_admit(account_key=account.account_key, channel=DEMO_CHANNEL, transport_key=f"bench-t-{i}",
                          body=demo_event_body(f"t-{i}"), actor=actor)
        assert materialize_step(account.pk, (0, 1), set()) == 3
        assert claims_step(wakes) == 3 and not wakes.lanes
        handled, finalized = egress_step(since["effect"])
        assert (handled, finalized) == (3, 3)
        # the claims task advanced the three lanes together (D-398): no lane_advance message
        assert "connector.tasks.lane_advance" not in wakes.counts, wakes.counts
        out = accounting(conninfo, since, start, dt.datetime.now(dt.timezone.utc).timestamp() + 1,
                         receiver.requests, admitted=3)
        assert out["completions"] == 3 and out["exactly_once"], out
        assert out["receiver"]["keys_received"] == 3 and out["effect_states"] == {"finalized": 3}, out

        import httpx

        httpx.post(receiver.url + "/v1/records/again", content=b"{}",
                   headers={"Idempotency-Key": receiver.requests[0]["key"]})
        again = accounting(conninfo, since, start, dt.datetime.now(dt.timezone.utc).timestamp(),
                           receiver.requests, admitted=3)
        assert again["receiver"]["duplicate_keys"] == 1 and not again["exactly_once"], again
    finally:
        wakes.uninstall()
        receiver.stop()
