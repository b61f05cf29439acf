"""The inbound chain is browsable in the admin, read-only, from receipt to result."""
from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from connector.actors import Actor
from connector.models import (
    ApplicationResult,
    CrmRecord,
    Event,
    Execution,
    ExecutionAttempt,
    OrderingLane,
    Projection,
    Receipt,
    ReceiptAdmissionKey,
    ReceiptComponent,
)
from connector.services import admission, execution, materialize

MODELS = [Receipt, ReceiptAdmissionKey, Event, Projection, Execution, OrderingLane, ApplicationResult, CrmRecord]


@pytest.fixture
def chain(world):
    body = json.dumps({"events": [{"id": "e1", "type": "record.updated", "record_id": "r1", "sequence": 1,
                                   "occurred_at": "2026-12-01T00:00:00Z",
                                   "data": {"name": "Ann", "email": "ann@example.com"}}]}).encode()
    adm = admission.receipt_admit(account_key=world.accounts[0].account_key, channel="records.webhook",
                                  transport_key="adm-1", body=body, actor=Actor.system("t"))
    out = materialize.receipt_materialize(receipt_pk=adm.receipt.pk)
    for lane in out.lanes:
        execution.lane_advance(lane_pk=lane)
    execution.execution_run(token=execution.execution_claim(holder="w"))
    return adm.receipt


@pytest.mark.django_db
def test_every_inbound_fact_is_viewable_and_linked(client, chain):
    """Each changelist and change page renders; the receipt page links to its events and the execution page
    shows its Runtime result; nothing can be edited or added."""
    client.force_login(User.objects.create_superuser("op", password="x"))
    for model in MODELS:
        opts = model._meta
        assert client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")).status_code == 200
        obj = model.objects.first()
        page = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]))
        assert page.status_code == 200, model
        assert b'name="_save"' not in page.content
    receipt_page = client.get(reverse("admin:connector_receipt_change", args=[chain.pk])).content.decode()
    event = Event.objects.get()
    assert reverse("admin:connector_event_change", args=[event.pk]) in receipt_page
    exe = Execution.objects.get()
    exe_page = client.get(reverse("admin:connector_execution_change", args=[exe.pk])).content.decode()
    assert "applied" in exe_page.lower() and ExecutionAttempt.objects.filter(execution=exe).count() == 1
    assert ReceiptComponent.objects.count() == 1
    assert client.post(reverse("admin:connector_receipt_change", args=[chain.pk]), {}).status_code == 403
