"""Fault table row "no fault at all: a new record changed twice within a second" (issue 37 item 7), against the
processes `make run` starts (web, the stage workers, beat and the demo CRM receiver): positions of one new record
sent back to back. The pushes of one owner slot are sent one at a time in the order they were authored (D-441), so
the CRM ends at the greatest position, and a create authored before the slot's link existed, answered with the
identity already linked to the same slot, finalizes as that link: nothing waits for an operator."""
from __future__ import annotations

import httpx
import pytest

from connector.models import Execution, OrderingLane
from effects.models import RemoteEffect, RemoteLink
from tests.faults.pushes import post, wait_for

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "journal"])


def test_a_new_record_changed_within_a_second_finalizes_every_push(product):
    """Positions 5, 3, 7, 6 of two new records, then 9, 8, 10, 11 of each, all sent back to back (the first four
    are the issue's row): every push finalizes, each CRM record ends at its greatest position, one active
    RemoteLink per record, every change reached the CRM in position order, nothing waits for an operator.

    Proves: issue 37 item 7"""
    from connector.demo import build_world

    world = build_world("po-", push=True)
    account = world.accounts[0].account_key
    records = ("cust-7", "cust-8")
    for sequence in (5, 3, 7, 6, 9, 8, 10, 11):
        for record in records:
            post(product, account, f"po-{record}-{sequence}", record, sequence)

    def settled():
        # Every position decided on both records' lanes and no Execution left to run (an effect exists only once
        # its Execution ran: an early look can see the push of 10 settled while 11 has not run yet), then every
        # push out of prepared/dispatching.
        lanes = list(OrderingLane.objects.filter(partition__in=records).values_list("high_water", flat=True))
        if len(lanes) != len(records) or any(water is None or int(water) < 11 for water in lanes):
            return None
        if Execution.objects.filter(lane__partition__in=records,
                                    state__in=("ready", "waiting_dependency")).exists():
            return None
        rows = list(RemoteEffect.objects.values_list("state", "quarantine_reason"))
        return rows if rows and all(state not in ("prepared", "dispatching") for state, _ in rows) else None

    wait_for(settled, 120, "every position executed and every push settled")
    wait_for(lambda: not RemoteEffect.objects.exclude(state="finalized").exists()
             or RemoteEffect.objects.exclude(quarantine_reason="").exists(), 30, "finalization")
    effects = list(RemoteEffect.objects.order_by("pk").values_list("pk", "state", "quarantine_reason",
                                                                   "command__owner_slot", "command__method"))
    assert {(state, reason) for _, state, reason, *_ in effects} == {("finalized", "")}, effects
    crm = httpx.get(f"{product['crm']}/_demo/state", timeout=10).json()
    by_key = {r["external_key"]: r for r in crm["records"]}
    assert sorted(by_key) == sorted(records), crm["records"]
    links = dict(RemoteLink.objects.filter(state="active").values_list("owner_slot", "remote_identity"))
    assert links == {key: by_key[key]["id"] for key in records}
    for key in records:
        assert by_key[key]["fields"]["display_name"] == "v11", (key, crm)
        # the CRM saw this record's changes in the order they were pushed: positions never go back
        names = [int(r["fields"]["display_name"][1:]) for r in crm["requests"]
                 if r["kind"] in ("created", "updated") and r["id"] == by_key[key]["id"]]
        assert names == sorted(names), (key, names)
