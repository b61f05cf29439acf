"""Crash rows of the inbound chain, with real process kills (connector.faults):

- "Receipt committed before transport acknowledgement" -> retry resolves the original Receipt and epoch.
- "Receipt committed before all Components or Events exist" -> reconciliation materializes only missing children.
"""
from __future__ import annotations

import pytest

from connector.demo import build_world
from connector.models import (
    Event,
    Execution,
    MaterializationDue,
    Projection,
    Receipt,
    ReceiptAdmissionKey,
    ReceiptComponent,
)
from connector.services.admission import ReceiptDigestMismatch, receipt_admit
from connector.services.materialize import receipt_materialize
from connector.services.sweeper import inbound_sweep
from tests.crash.support import ACTOR, CHANNEL, DB, assert_killed, webhook_body

ADMIT_SCRIPT = """
from connector.actors import Actor
from connector.services.admission import receipt_admit
admission = receipt_admit(account_key=ARGS["account"], channel=ARGS["channel"], transport_key=ARGS["key"],
                          body=ARGS["body"].encode(), actor=Actor.system("crash-child"))
emit(outcome=admission.outcome, receipt=admission.receipt.pk)
"""

MATERIALIZE_SCRIPT = """
from connector.services.materialize import receipt_materialize
out = receipt_materialize(receipt_pk=ARGS["receipt"])
emit(components=out.components)
"""


def _counts(account) -> dict:
    return {"receipts": Receipt.objects.filter(account=account).count(),
            "keys": ReceiptAdmissionKey.objects.filter(account=account).count(),
            "components": ReceiptComponent.objects.filter(receipt__account=account).count(),
            "events": Event.objects.filter(account=account).count(),
            "projections": Projection.objects.filter(account=account).count(),
            "executions": Execution.objects.filter(account=account).count(),
            "due": MaterializationDue.objects.filter(receipt__account=account).count()}


@pytest.mark.django_db(**DB)
def test_receipt_committed_before_acknowledgement_retry_resolves_original(run_child):
    """Crash row "Receipt committed before transport acknowledgement": the admitting process is SIGKILLed after
    the Receipt and its key committed and before it answered. The transport retry of the same key with the
    same bytes resolves to the original Receipt and its epoch (outcome "duplicate"); nothing is duplicated,
    different bytes under that key fail closed, and the Receipt's children are then materialized once.
    Proves: CV2-05-016, CV2-05-006, CV2-05-004, CV2-05-019"""
    world = build_world("k-")
    account = world.accounts[0]
    body = webhook_body(("rec-a", 1), ("rec-b", 1))
    run = run_child(ADMIT_SCRIPT, "admission.after_receipt_commit", account=account.account_key, channel=CHANNEL,
                    key="delivery-1", body=body.decode())
    assert_killed(run)

    receipt = Receipt.objects.get(account=account)
    assert receipt.epoch_id == world.active_epoch.pk
    assert bytes(receipt.payload) == body
    assert _counts(account) == {"receipts": 1, "keys": 1, "components": 0, "events": 0, "projections": 0,
                                "executions": 0, "due": 1}

    retry = receipt_admit(account_key=account.account_key, channel=CHANNEL, transport_key="delivery-1",
                          body=body, actor=ACTOR)
    assert retry.outcome == "duplicate"
    assert retry.receipt.pk == receipt.pk
    assert retry.receipt.epoch_id == world.active_epoch.pk
    assert bytes(retry.receipt.epoch_digest) == bytes(world.active_epoch.digest)
    assert retry.key.receipt_id == receipt.pk
    with pytest.raises(ReceiptDigestMismatch):
        receipt_admit(account_key=account.account_key, channel=CHANNEL, transport_key="delivery-1",
                      body=webhook_body(("rec-a", 2)), actor=ACTOR)
    assert _counts(account)["receipts"] == 1 and _counts(account)["keys"] == 1

    # the orphaned Receipt's children are found through its MaterializationDue row, materialized once
    assert inbound_sweep(grace_seconds=0).materialized == 1
    assert inbound_sweep(grace_seconds=0).materialized == 0
    counts = _counts(account)
    assert (counts["components"], counts["events"], counts["due"]) == (2, 2, 0)
    assert set(Event.objects.filter(account=account).values_list("epoch_id", flat=True)) == {world.active_epoch.pk}


@pytest.mark.django_db(**DB)
def test_receipt_committed_before_children_reconciles_missing_only(run_child):
    """Crash row "Receipt committed before all Components or Events exist": the materializer is SIGKILLed
    inside its transaction after writing the first of three Components. The transaction rolls back: the
    Receipt stands with zero children and its MaterializationDue row. The sweeper derives the three
    Components and three live Events once, from the immutable Receipt, under the Receipt's own epoch; a second
    sweep and a direct re-materialization add nothing.
    Proves: CV2-05-017, CV2-05-018, CV2-05-019, CV2-05-015"""
    world = build_world("k-")
    account = world.accounts[0]
    body = webhook_body(("rec-a", 1), ("rec-b", 1), ("rec-c", 1))
    admission = receipt_admit(account_key=account.account_key, channel=CHANNEL, transport_key="batch-1",
                              body=body, actor=ACTOR)
    assert admission.outcome == "created" and admission.receipt.component_count == 3

    run = run_child(MATERIALIZE_SCRIPT, "materialize.after_components", receipt=admission.receipt.pk)
    assert_killed(run)
    assert _counts(account) == {"receipts": 1, "keys": 1, "components": 0, "events": 0, "projections": 0,
                                "executions": 0, "due": 1}

    report = inbound_sweep(grace_seconds=0)
    assert report.materialized == 1
    after = _counts(account)
    assert (after["components"], after["events"], after["projections"], after["due"]) == (3, 3, 3, 0)
    components = list(ReceiptComponent.objects.filter(receipt=admission.receipt).order_by("ordinal"))
    assert [c.ordinal for c in components] == [0, 1, 2]
    assert all(c.disposition == "event" and c.event_id for c in components)
    events = Event.objects.filter(account=account)
    assert sorted(events.values_list("source_event_key", flat=True)) == ["ev-rec-a-1", "ev-rec-b-1", "ev-rec-c-1"]
    assert set(events.values_list("epoch_id", flat=True)) == {world.active_epoch.pk}
    assert set(events.values_list("receipt_id", flat=True)) == {admission.receipt.pk}
    assert set(events.values_list("replay_request", flat=True)) == {None}  # the one live generation

    assert inbound_sweep(grace_seconds=0).materialized == 0
    assert receipt_materialize(receipt_pk=admission.receipt.pk).components == 0
    assert _counts(account) == after
