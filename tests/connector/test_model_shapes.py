"""Shapes the seed forbids or requires of inbound facts, checked on the models and, for uniqueness, on real
PostgreSQL around the services."""
from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.db import IntegrityError, transaction

from connector.models import Event, ReceiptComponent
from tests.conformance.packs import PACK_B
from tests.connector.inbound_helpers import build_inbound_world, deliver, feed_body, feed_line

WORKER_STATE = re.compile(r"lease|retry|retries|attempt|status|state|holder|owner|claim|fence|heartbeat")


def test_event_carries_no_worker_or_execution_state():
    """Event is an immutable inbound fact: no lease, retry counter, execution status, replay state or execution
    owner column (its replay link is the generation identity, not a state). Proves: CV2-05-013"""
    columns = [f.name for f in Event._meta.concrete_fields]
    assert "replay_request" in columns and "source_event_key" in columns
    assert [c for c in columns if WORKER_STATE.search(c)] == []


def test_no_scheduler_lease_owns_execution():
    """No model of any app is a scheduler lease or carries one: an Execution's ownership is its own lease and
    fenced claim, nothing else. Proves: CV2-07-019"""
    names = [f"{m._meta.label}.{f.name}" for m in apps.get_models() for f in [None, *m._meta.get_fields()]
             if re.search(r"scheduler", (m.__name__ if f is None else f.name), re.I)]
    assert names == []


@pytest.mark.django_db
def test_one_receipt_component_per_receipt_and_ordinal():
    """A second component with a taken (receipt, ordinal) is refused by PostgreSQL even around the services.
    Proves: CV2-15-003"""
    world = build_inbound_world("shape-", [PACK_B])
    deliver(world, "ledger.sequenced", feed_body(feed_line("L-1", 1, "mem-1")))
    component = ReceiptComponent.objects.get()
    with pytest.raises(IntegrityError, match="connector_component_unique_ordinal"), transaction.atomic():
        ReceiptComponent.objects.create(receipt=component.receipt, ordinal=component.ordinal, payload=b"x",
                                        payload_digest=b"\0" * 32, disposition=component.disposition,
                                        event=component.event)
