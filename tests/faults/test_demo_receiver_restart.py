"""Fault table row "`make run` twice on one database" (issue 37 item 8): the demo CRM receiver `make run` starts
(scripts/run.py's own `receiver` command) is stopped and started again; it remembers its records, its id sequence
and its answered Idempotency-Keys, so the product's RemoteLinks (kept by PostgreSQL) still name the right records
and a new record's push finalizes instead of waiting as REMOTE_LINK_CONFLICT."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.faults.pushes import post, wait_for
from tests.faults.servers import Child, child_environment, free_port, make_run_commands, wait_port


class Crm:
    """The demo receiver child exactly as `make run` starts it, its journal in the test's directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        argv = make_run_commands(0, receiver_port=self.port, beat_schedule=tmp_path / "beat")["receiver"]
        env = child_environment(secret_dir=str(tmp_path), DEMO_RECEIVER_JOURNAL=str(tmp_path / "demo-crm.jsonl"))
        self.child = Child("receiver", argv, env, tmp_path)
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> "Crm":
        self.child.start()
        wait_port(self.port, 30, self.child.proc)
        return self

    def call(self, method: str, path: str, key: str, fields: dict) -> tuple[int, str]:
        response = httpx.request(method, self.url + path, content=json.dumps(fields).encode(),
                                 headers={"Idempotency-Key": key, "Content-Type": "application/json"}, timeout=10)
        return response.status_code, response.json()["id"]

    def state(self) -> dict:
        return httpx.get(f"{self.url}/_demo/state", timeout=10).json()


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
def test_the_demo_crm_remembers_its_records_and_ids_across_a_restart(tmp_path, stop):
    """Records created and updated before a restart (a stop as run.py's Ctrl-C does it, or a kill) are there after
    it; new records continue the id sequence; a repeat of a key answered before the restart gets its first answer
    and changes nothing.

    Proves: issue 37 item 8"""
    crm = Crm(tmp_path).start()
    try:
        assert crm.call("POST", "/v1/records/cust-1", "k1", {"display_name": "one"}) == (201, "crm-1")
        assert crm.call("POST", "/v1/records/cust-2", "k2", {"display_name": "two"}) == (201, "crm-2")
        assert crm.call("PATCH", "/v1/records/by-id/crm-1", "k3", {"display_name": "one v2"}) == (200, "crm-1")
        before = crm.state()
        if stop == "SIGKILL":
            os.killpg(crm.child.proc.pid, signal.SIGKILL)
            crm.child.proc.wait(timeout=10)
        else:
            crm.child.stop()
        crm.start()
        after = crm.state()
        assert after == before
        assert crm.call("POST", "/v1/records/cust-3", "k4", {"display_name": "three"}) == (201, "crm-3")
        assert crm.call("POST", "/v1/records/cust-1", "k5", {"display_name": "one v3"}) == (200, "crm-1")
        assert crm.call("PATCH", "/v1/records/by-id/crm-1", "k3", {"display_name": "stale repeat"}) == (200, "crm-1")
        records = {r["id"]: (r["external_key"], r["version"], r["fields"]["display_name"])
                   for r in crm.state()["records"]}
        assert records == {"crm-1": ("cust-1", 3, "one v3"), "crm-2": ("cust-2", 1, "two"),
                           "crm-3": ("cust-3", 1, "three")}
    finally:
        crm.child.stop()


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_a_push_after_the_receiver_restarted_finalizes(product):
    """`make run`'s processes; a new record is pushed and linked; the demo receiver is stopped and started again
    (PostgreSQL keeps the RemoteLink); another new record's push finalizes with a new remote identity: nothing
    waits as REMOTE_LINK_CONFLICT, two active links name two CRM records.

    Proves: issue 37 item 8"""
    from connector.demo import build_world
    from effects.models import RemoteEffect, RemoteLink

    world = build_world("rr-", push=True)
    account = world.accounts[0].account_key
    post(product, account, "rr-1", "cust-a", 1)
    wait_for(lambda: RemoteEffect.objects.filter(state="finalized").count() == 1, 90, "the first push to finalize")
    receiver = next(child for child in product["children"] if child.name == "receiver")
    receiver.stop()
    receiver.start()
    wait_port(int(product["crm"].rsplit(":", 1)[1]), 30, receiver.proc)
    post(product, account, "rr-2", "cust-b", 1)
    wait_for(lambda: RemoteEffect.objects.exclude(state="prepared").exclude(state="dispatching").count() == 2, 90,
             "the second push to settle")
    effect = RemoteEffect.objects.order_by("pk").last()
    assert (effect.state, effect.quarantine_reason) == ("finalized", ""), (effect.state, effect.quarantine_reason)
    links = dict(RemoteLink.objects.filter(state="active").values_list("owner_slot", "remote_identity"))
    assert links == {"cust-a": "crm-1", "cust-b": "crm-2"}
    records = {r["id"]: r["external_key"] for r in httpx.get(f"{product['crm']}/_demo/state", timeout=10)
               .json()["records"]}
    assert records == {"crm-1": "cust-a", "crm-2": "cust-b"}
