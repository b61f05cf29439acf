"""The pushes of one owner slot are sent one at a time in the order they were authored (issue 37 item 7, D-441),
on real PostgreSQL with a real HTTP receiver (the demo CRM of `make run`, in this process): a push waits while an
earlier push of its slot is open (prepared, dispatching, uncertain or remote_confirmed), on every claim path; a
create authored before the slot's link existed is sent after the link exists, the CRM answers the identity already
linked to the same slot, and it finalizes as that link. A genuinely different identity still fails closed."""
from __future__ import annotations

import threading

import pytest

from connector.actors import Actor
from demo.crm import DemoCrm
from effects import egress_batch
from effects.models import OutboundCommand, RemoteEffect, RemoteLink
from effects.services import dispatch, dispatch_batch, worker
from tests.effects.test_remote_identity import push


@pytest.fixture
def crm(settings):
    """The demo CRM on a spare loopback port, the egress pointed at it."""
    crm = DemoCrm()
    server = crm.server(0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": f"http://127.0.0.1:{server.server_port}",
                          "EGRESS_TIMEOUT_SECONDS": 2}
    yield crm
    server.shutdown()
    server.server_close()


@pytest.fixture
def acme(push_world):
    return push_world.accounts[0]


def states() -> list[tuple[str, str]]:
    return list(RemoteEffect.objects.order_by("pk").values_list("state", "quarantine_reason"))


@pytest.mark.django_db
def test_a_create_and_its_update_authored_together_are_sent_one_at_a_time_and_both_finalize(acme, crm):
    """Record r1 changed twice before anything was sent: both commands are creates (no link yet). The batched
    claim and the one-by-one claim take only the first; the second is sent after the first finalized, the CRM
    answers the identity already linked to r1, and it finalizes as that link.

    Proves: issue 37 item 7"""
    push(acme, "r1", 1)
    push(acme, "r1", 2)
    push(acme, "r2", 1)  # another slot is never held by r1's
    commands = list(OutboundCommand.objects.order_by("pk").values_list("owner_slot", "method", "path"))
    assert commands == [("r1", "POST", "/v1/records/r1"), ("r1", "POST", "/v1/records/r1"),
                        ("r2", "POST", "/v1/records/r2")]
    first, second, other = RemoteEffect.objects.order_by("pk")
    assert [e.owner_slot for e in (first, second, other)] == ["r1", "r1", "r2"]

    holder = dispatch.holder_register(holder_id="h-order")
    permits = dispatch_batch.effects_claim_batch(holder=holder, n=10, account_id=acme.pk)
    assert sorted(p.effect_pk for p in permits) == [first.pk, other.pk]
    assert dispatch.effect_claim(holder=holder, account_id=acme.pk) is None  # r1's second waits behind its first
    assert worker.effects_sweep()["claimable"] == 0

    egress_batch.send_batch(permits=permits, holder_id=holder.holder_id)
    assert states()[0] == ("finalized", "") and states()[2] == ("finalized", "")
    assert worker.effects_sweep()["claimable"] == 1

    handled = worker.effect_dispatch_batch(n=10, holder_name="h-order", account_id=acme.pk)
    assert [e.pk for e in handled] == [second.pk]
    assert states() == [("finalized", "")] * 3
    record = {r["external_key"]: r for r in crm.state()["records"]}["r1"]
    assert (record["version"], record["fields"]["display_name"]) == (2, "v2")
    assert [(r["method"], r["kind"], r["id"]) for r in crm.state()["requests"] if r["path"].endswith("/r1")] == [
        ("POST", "created", record["id"]), ("POST", "updated", record["id"])]
    assert list(RemoteLink.objects.filter(state="active").order_by("owner_slot")
                .values_list("owner_slot", "remote_identity")) == [("r1", record["id"]), ("r2", "crm-2")]


@pytest.mark.django_db
def test_a_push_waits_behind_an_uncertain_one_and_a_different_identity_still_fails_closed(acme, receiver):
    """The first push of r1 ends uncertain (the receiver applied it and dropped the connection); the next push of
    r1 is not claimed while it is uncertain. An operator confirms it with evidence; it finalizes and links r1;
    then the next push (a create authored before the link) is sent, and the test receiver answers ANOTHER
    identity (it creates a new record per key): the effect waits as REMOTE_LINK_CONFLICT, nothing relinked.

    Proves: issue 37 item 7"""
    push(acme, "r1", 1)
    receiver.modes = ["apply_drop"]
    first = worker.effect_dispatch_once(holder_name="h-order", account_id=acme.pk)
    assert first.state == "uncertain"
    push(acme, "r1", 2)
    assert worker.effect_dispatch_once(holder_name="h-order", account_id=acme.pk) is None
    assert worker.effect_dispatch_batch(n=10, holder_name="h-order", account_id=acme.pk) == []
    assert len(receiver.requests) == 1

    first = RemoteEffect.objects.get(pk=first.pk)
    remote_id = f"remote-{receiver.requests[0]['key'][-12:]}"
    dispatch.effect_reconcile(effect_pk=first.pk, decision="remote_confirmed", evidence="provider lookup",
                              actor=Actor.system("test"), expected_changed_at=first.changed_at, remote_id=remote_id)
    worker.effects_sweep()  # finalizes the confirmed effect from its evidence, links r1
    assert RemoteLink.objects.get(state="active").remote_identity == remote_id
    second = worker.effect_dispatch_once(holder_name="h-order", account_id=acme.pk)
    assert (second.state, second.quarantine_reason) == ("remote_confirmed", "REMOTE_LINK_CONFLICT")
    assert list(RemoteLink.objects.values_list("owner_slot", "remote_identity", "state")) == [
        ("r1", remote_id, "active")]
