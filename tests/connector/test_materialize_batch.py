"""Set-based materialization of a batch receipt (issue 18, goal 2; D-217): the same children, dispositions and
guarantees as one insert per component, and two materializers of overlapping receipts never deadlock."""
from __future__ import annotations

import json

import pytest

from connector.actors import Actor
from connector.demo import DEMO_CHANNEL, build_world
from connector.models import Event, OrderingLane, Projection, ReceiptComponent
from connector.services.admission import receipt_admit
from connector.services.materialize import receipt_materialize
from tests.concurrency import raised, run_concurrently

ACTOR = Actor.system("materialize-batch-test")


def _event(key: str, record: str, sequence: int = 1, name: str = "A") -> dict:
    return {"id": key, "type": "record.updated", "record_id": record, "sequence": sequence,
            "occurred_at": "2025-01-01T00:00:00Z", "data": {"name": name, "email": f"{record}@example.com"}}


def _admit(account: str, transport_key: str, events: list[dict]):
    return receipt_admit(account_key=account, channel=DEMO_CHANNEL, transport_key=transport_key,
                         body=json.dumps({"events": events}, sort_keys=True).encode(), actor=ACTOR).receipt


@pytest.mark.django_db(transaction=True)
def test_duplicates_and_conflicts_inside_one_batch_keep_their_dispositions():
    """In one receipt, a repeated key with identical bytes is a duplicate of the first component's Event, a repeated
    key with other bytes is quarantined (EVENT_KEY_CONFLICT), a key already live from an earlier receipt is a
    duplicate of that Event; only new Events get a Projection, on one lane per record; a second call adds
    nothing. Proves: CV2-05-011, CV2-05-017, CV2-05-018 (decision 14)"""
    account = build_world("mb-").accounts[0].account_key
    first = _admit(account, "k-1", [_event("ev-old", "rec-old")])
    receipt_materialize(receipt_pk=first.pk)
    old = Event.objects.get(source_event_key="ev-old")
    receipt = _admit(account, "k-2", [_event("ev-a", "rec-a"), _event("ev-b", "rec-b"), _event("ev-a", "rec-a"),
                                      _event("ev-b", "rec-b", name="B"), _event("ev-old", "rec-old")])
    out = receipt_materialize(receipt_pk=receipt.pk)
    a, b = Event.objects.get(source_event_key="ev-a"), Event.objects.get(source_event_key="ev-b")
    assert out.components == 5 and sorted(out.events) == sorted([a.pk, b.pk])
    rows = list(ReceiptComponent.objects.filter(receipt=receipt).order_by("ordinal")
                .values_list("ordinal", "disposition", "event_id", "reason_code"))
    assert rows == [(0, "event", a.pk, ""), (1, "event", b.pk, ""), (2, "duplicate_event", a.pk, ""),
                    (3, "quarantined", None, "EVENT_KEY_CONFLICT"), (4, "duplicate_event", old.pk, "")]
    assert a.receipt_id == b.receipt_id == receipt.pk
    assert set(Projection.objects.filter(event__receipt=receipt).values_list("event_id", flat=True)) == {a.pk, b.pk}
    lanes = {p.event_id: p.lane for p in Projection.objects.filter(event__receipt=receipt).select_related("lane")}
    assert {lanes[a.pk].partition, lanes[b.pk].partition} == {"rec-a", "rec-b"}
    assert out.lanes == {lanes[a.pk].pk, lanes[b.pk].pk}
    assert receipt_materialize(receipt_pk=receipt.pk).components == 0
    assert ReceiptComponent.objects.filter(receipt=receipt).count() == 5


@pytest.mark.django_db(transaction=True)
def test_overlapping_batches_materialized_at_once_never_deadlock():
    """Two receipts carrying the same 60 keys (on the same 60 records) in opposite orders are materialized at the
    same moment by two sessions, five times over: no error, no deadlock; each key has exactly one live Event, owned
    by one receipt, whose component is `event`, and the other receipt's component of that key is its
    duplicate; each record has exactly one lane. Events are proposed in key order and lanes opened in partition
    order (D-217), so neither session waits for the other in a cycle.
    Proves: CV2-05-011, CV2-06-001 (one lane per partition), STYLE R22"""
    account = build_world("mr-").accounts[0].account_key
    for round_ in range(5):
        events = [_event(f"ev-{round_}-{i:02d}", f"rec-{round_}-{i:02d}") for i in range(60)]
        one = _admit(account, f"k-{round_}-a", events)
        two = _admit(account, f"k-{round_}-b", list(reversed(events)))
        results = run_concurrently([lambda pk=pk: receipt_materialize(receipt_pk=pk) for pk in (one.pk, two.pk)])
        assert raised(results) == [], [repr(e) for e in raised(results)]
        live = Event.objects.filter(source_event_key__startswith=f"ev-{round_}-")
        assert live.count() == 60
        for receipt in (one, two):
            for ordinal, disposition, event_id in ReceiptComponent.objects.filter(receipt=receipt).values_list(
                    "ordinal", "disposition", "event_id"):
                owner = Event.objects.get(pk=event_id).receipt_id
                assert disposition == ("event" if owner == receipt.pk else "duplicate_event"), (ordinal, disposition)
        assert ReceiptComponent.objects.filter(receipt__in=[one, two], disposition="event").count() == 60
        assert OrderingLane.objects.filter(partition__startswith=f"rec-{round_}-").count() == 60
        assert Projection.objects.filter(event__in=live).count() == 60


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("sequences", [[7, 7, 7, 7], [1, 2, 3, 4], [5]], ids=["shared", "varying", "single"])
def test_every_row_gets_its_own_values_whether_a_column_is_shared_or_varies(sequences):
    """The set-based inserts bind a column whose value is the same in every row once, as a scalar, and the others
    as arrays (D-263): a receipt whose events share their position, one whose positions all differ, and a
    one-event receipt (no array at all) store each event's own key, record, position and payload on its own
    Event, Projection and lane. Proves: CV2-05-011 (children derived from the receipt), CV2-06-001"""
    account = build_world("ms-").accounts[0].account_key
    tag = "-".join(map(str, sequences))
    events = [_event(f"ev-{tag}-{i}", f"rec-{tag}-{i}", sequence=s, name=f"N{i}") for i, s in enumerate(sequences)]
    receipt = _admit(account, f"k-{tag}", events)
    out = receipt_materialize(receipt_pk=receipt.pk)
    assert out.components == len(events) and len(out.events) == len(events)
    stored = {e.source_event_key: e for e in Event.objects.filter(receipt=receipt)}
    for i, sent in enumerate(events):
        event = stored[sent["id"]]
        assert (event.partition, int(event.position), event.occurred_at) == (sent["record_id"], sent["sequence"],
                                                                              sent["occurred_at"])
        assert json.loads(bytes(event.payload))["name"] == f"N{i}"
        projection = Projection.objects.select_related("lane").get(event=event)
        assert (projection.lane.partition, int(projection.position)) == (sent["record_id"], sent["sequence"])
        assert json.loads(bytes(projection.input))["data"]["name"] == f"N{i}"
    components = list(ReceiptComponent.objects.filter(receipt=receipt).order_by("ordinal")
                      .values_list("ordinal", "event__source_event_key", "disposition"))
    assert components == [(i, e["id"], "event") for i, e in enumerate(events)]
