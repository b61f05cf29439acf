"""Replay admission and materialization racing a gate transition, as real concurrent transactions on separate
connections: the write either commits under the current `v2_serving` fence before the transition, or waits for
it and changes nothing (CV2-09-026)."""
from __future__ import annotations

import hashlib
import threading

import pytest
from django.db import transaction

from connector.errors import GateNotServing
from connector.models import AccountServingGate, Event, Receipt, ReceiptComponent, ReplayRequest
from connector.services import gates as gate_services
from connector.services import materialize
from connector.services.replay import replay_request_admit
from tests.concurrency import start, wait_until
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import (
    ACTOR,
    build_inbound_world,
    deliver,
    drain,
    waiting_in_this_database,
    webhook_body,
    webhook_event,
)
from tests.support import scaled

WEBHOOK = "records.webhook"


@pytest.fixture
def world(transactional_db):
    world = build_inbound_world("rr-", [PACK_A])
    deliver(world, WEBHOOK, webhook_body(webhook_event("evt-1", "rec-1", 1)))
    drain()
    return world


def _replay(world, request_id: str):
    event = Event.objects.get(source_event_key="evt-1", replay_request__isnull=True)
    component = ReceiptComponent.objects.get(event=event, disposition="event")
    return replay_request_admit(
        account_key=world.account.account_key, request_id=request_id, target_epoch_id=world.epoch.epoch_id,
        target_epoch_digest=bytes(world.epoch.digest), predecessor_event_id=event.pk,
        predecessor_payload_digest=hashlib.sha256(bytes(component.payload)).digest(), reason="race",
        principal="ops", mode="suppress_external_effects", actor=ACTOR)


def _fence(world) -> int:
    return AccountServingGate.objects.get(account=world.account).fence


def _held_halt(world, holding: threading.Event, release: threading.Event):
    def run():
        with transaction.atomic():
            gate = gate_services.gate_transition(account_id=world.account.pk, action="halt_v2", expected_fence=None,
                                                 actor=ACTOR, reason="race")
            holding.set()
            assert release.wait(scaled(20))
            return gate.fence
    return run


def test_replay_admission_waiting_on_a_committing_halt_writes_nothing(world):
    """The halt holds the gate row; a replay admission started meanwhile waits on it, then sees `halting_v2`:
    GateNotServing, no ReplayRequest and no replay Receipt. Proves: CV2-09-026"""
    receipts, holding, release = Receipt.objects.count(), threading.Event(), threading.Event()
    halter = start(_held_halt(world, holding, release), "halter")
    assert holding.wait(scaled(20))
    replayer = start(lambda: _replay(world, "replay-waits"), "replayer")
    assert wait_until(lambda: waiting_in_this_database() >= 1), "the replay must wait on the gate row"
    assert replayer.is_alive()
    release.set()
    halter.join(scaled(20))
    replayer.join(scaled(20))
    assert halter.error is None
    assert isinstance(replayer.error, GateNotServing), replayer.error
    assert not ReplayRequest.objects.exists() and Receipt.objects.count() == receipts


def test_replay_admission_holding_the_gate_commits_under_the_old_fence_first(world):
    """A replay admission holding the gate FOR SHARE makes the halt wait; the replay commits bound to the
    `v2_serving` fence it locked, and only then does the halt commit its next fence. Proves: CV2-09-026"""
    before = _fence(world)
    in_write, release = threading.Event(), threading.Event()

    def slow_replay():
        with transaction.atomic():
            admitted = _replay(world, "replay-first")
            in_write.set()
            assert release.wait(scaled(20))
            return admitted.request.pk

    replayer = start(slow_replay, "replayer")
    assert in_write.wait(scaled(20))
    halter = start(lambda: gate_services.gate_transition(account_id=world.account.pk, action="halt_v2",
                                                         expected_fence=before, actor=ACTOR, reason="race"), "halter")
    assert wait_until(lambda: waiting_in_this_database() >= 1), "the halt must wait for the replay"
    assert halter.is_alive()
    release.set()
    replayer.join(scaled(20))
    halter.join(scaled(20))
    assert replayer.error is None and halter.error is None
    request = ReplayRequest.objects.get(pk=replayer.result)
    assert request.gate_fence == before and halter.result.fence == before + 1


def test_replay_materialization_waiting_on_a_committing_halt_creates_no_descendant(world):
    """A replay admitted while serving is materialized while a halt holds the gate: materialization waits, then
    sees `halting_v2` and creates no replay Event, Projection or Execution. Proves: CV2-09-026"""
    admitted = _replay(world, "replay-inert")
    holding, release = threading.Event(), threading.Event()
    halter = start(_held_halt(world, holding, release), "halter")
    assert holding.wait(scaled(20))
    materializer = start(lambda: materialize.receipt_materialize(receipt_pk=admitted.receipt.pk), "materializer")
    assert wait_until(lambda: waiting_in_this_database() >= 1), "materialization must wait on the gate row"
    release.set()
    halter.join(scaled(20))
    materializer.join(scaled(20))
    assert isinstance(materializer.error, GateNotServing), materializer.error
    assert not Event.objects.filter(replay_request=admitted.request).exists()
