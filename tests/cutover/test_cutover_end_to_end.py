"""End to end: a live V1 service under synthetic load is cut over to V2 through every phase — barriers, drain,
stop, shutdown certificate, restore point with its rehearsal, validation, dual-approved activation — and V2 then
serves the same accounts: a V1 transport duplicate resolves to its tombstone, ordering continues after the V1
high-water, and no accepted input is lost."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from django.db import connections

from connector.actors import Actor
from connector.choices import EpochState, GateMode
from connector.models import Execution, OrderingLane, Receipt, ReceiptAdmissionKey, SupersededDecision
from connector.services import admission, materialize
from cutover.choices import DecisionState
from cutover.models import AttemptOutcome, ServiceCutoverAttempt
from cutover.ports import v1_owner
from cutover.services import decision as decisions
from cutover.services import first_activation as fa
from cutover.services import v1_shutdown as sd
from cutover.services.restore import cutover_begin_validation
from cutover.services.restore_point import restore_point_capture, restore_point_rehearse
from tests.connector.inbound_helpers import drain as v2_drain
from tests.crash.conftest import ROOT
from tests.cutover.approval_helpers import approve
from tests.cutover.v1_world import ACTOR, BUDGETS, approve_activation, build_v1_world
from tests.support import scaled, wait_for, whole_seconds
from v1 import runtime
from v1.errors import V1BarrierClosed
from v1.models import EffectState, V1OutboundEffect, V1WorkItem, WorkState

CHANNEL = "records.webhook"
RECORDS = ("r-1", "r-2", "r-3")


def event_body(key: str, record: str, sequence: int) -> bytes:
    import json

    return json.dumps({"events": [{"id": f"ev-{key}", "type": "record.updated", "record_id": record,
                                   "sequence": sequence, "occurred_at": "2026-01-01T00:00:00Z",
                                   "data": {"name": f"N {key}", "email": f"{key}@example.com"}}]},
                      sort_keys=True).encode()


@pytest.fixture
def provider(settings, tmp_path):
    from tests.effects.receiver import Receiver

    v1_owner.cache_clear()
    settings.CUTOVER_RESTORE_POINT_DIR = str(tmp_path / "restore-points")
    receiver = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR,
                          "EGRESS_BASE_URL": receiver.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(2)}
    yield receiver
    receiver.stop()
    connections.close_all()


class Load:
    """A source delivering to V1 until the ingress barrier refuses; refused deliveries are kept for redelivery
    (the source retries: nothing it sent is lost)."""

    def __init__(self, world):
        self.world, self.accepted, self.refused = world, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self):
        i = 0
        try:
            while not self.stop.is_set() and i < 400:
                i += 1
                account = self.world.accounts[i % 2]
                record = RECORDS[i % 3]
                key, payload = f"v1-{i}", event_body(f"v1-{i}", record, i)
                try:
                    runtime.accept(account_key=account.account_key, source_key=CHANNEL, transport_key=key,
                                   payload=payload, partition=record, position=i)
                    self.accepted.append((account.account_key, key, payload))
                except V1BarrierClosed:
                    self.refused.append((account.account_key, key, payload, record, i))
                    if len(self.refused) >= 5:
                        return
                time.sleep(0.02)  # ~50 deliveries/s: the V1 worker drains them within the deadline on a loaded machine
        finally:
            connections.close_all()


@pytest.mark.django_db(databases=["default", "journal"], transaction=True)
def test_a_live_v1_service_cuts_over_to_v2_without_losing_or_repeating_anything(provider, child_env, tmp_path):
    """Proves: CV2-12-001, CV2-12-003, CV2-12-004, CV2-12-026, CV2-12-032, CV2-12-037, CV2-12-044, CV2-12-051,
    CV2-12-055, CV2-12-068, CV2-12-070, CV2-05-007 (V1 duplicate resolved by its tombstone), CV2-02-007 (every
    accepted input applied once at the provider, none lost across the cutover, none repeated by V1 or V2)"""
    world = build_v1_world("e-")
    worker_log = (tmp_path / "v1-worker.log").open("w")  # a file, not a pipe nobody reads (a full pipe blocks it)
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "v1_worker", "--generation", world.generation_id, "--idle", "0.02"],
        env={**child_env, "CONNECTOR_EGRESS_BASE_URL": provider.url,
             "CONNECTOR_EGRESS_TIMEOUT_SECONDS": str(whole_seconds(5))},
        cwd=ROOT, stdout=worker_log, stderr=subprocess.STDOUT)
    load = Load(world)
    try:
        load.thread.start()
        time.sleep(1.0)  # V1 serves live traffic
        sd.cutover_open(attempt_key="e2e", configuration_generation_id=world.configuration.generation_id,
                        candidate_epoch_id=world.epoch.epoch_id, actor=ACTOR)
        sd.cutover_certify(attempt_key="e2e", budgets=BUDGETS, actor=ACTOR)
        approve("readiness_certificate", "e2e")
        sd.maintenance_close(attempt_key="e2e", actor=ACTOR)
        load.thread.join(scaled(30))
        assert load.refused, "the source kept sending after the barriers closed"

        blocked = ["nothing yet"]

        def stopped() -> bool:  # the live V1 worker finishes every accepted item under its own authority
            try:
                sd.v1_stop(attempt_key="e2e", actor=ACTOR)
            except sd.DrainBlocked as exc:
                blocked[0] = str(exc)
                return False
            return True

        try:
            wait_for(stopped, 60, "V1 drained and stopped", interval=0.2, proc=worker)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {len(load.accepted)} accepted; last refusal: {blocked[0]}; worker said: "
                                 f"{(tmp_path / 'v1-worker.log').read_text()[-2000:]}") from exc
        assert worker.wait(scaled(30)) == 0, "the terminated generation's worker did not exit"
    finally:
        load.stop.set()
        if worker.poll() is None:
            worker.kill()
        worker_log.close()
    assert len(load.accepted) >= 10
    assert set(V1WorkItem.objects.values_list("state", flat=True)) == {WorkState.DONE}
    assert set(V1OutboundEffect.objects.values_list("state", flat=True)) == {EffectState.FINALIZED}
    assert provider.applied_total() == len(load.accepted)  # one provider effect per accepted input, never two

    sd.v1_export(attempt_key="e2e", actor=ACTOR)
    sd.v1_certify_drained(attempt_key="e2e", actor=ACTOR)
    restore_point_capture(attempt_key="e2e", actor="backup-owner")
    restore_point_rehearse(attempt_key="e2e", actor="backup-owner")
    approve("restore_point", "e2e")
    cutover_begin_validation(attempt_key="e2e", actor=ACTOR)
    baselines = {(lane.account.account_key, lane.partition): int(lane.baseline)
                 for lane in OrderingLane.objects.select_related("account")}
    assert baselines, "lanes start from the drained V1 high-waters"
    fa.first_activation_acquire(attempt_key="e2e", actor=ACTOR)
    fa.first_activation_hold(attempt_key="e2e", actor=ACTOR)
    approve_activation(world.epoch.epoch_id)
    epoch = fa.first_activation_commit(attempt_key="e2e", actor=ACTOR)
    assert epoch.state == EpochState.ACTIVE and world.modes() == {GateMode.V2_SERVING}
    assert decisions.decision_read("e2e").state == DecisionState.V2_COMMITTED
    assert ServiceCutoverAttempt.objects.get().outcome == AttemptOutcome.V2_COMMITTED

    v2 = Actor.system("source-redelivery")
    for account_key, key, payload in load.accepted[:5]:  # a V1 transport duplicate: its tombstone answers
        outcome = admission.receipt_admit(account_key=account_key, channel=CHANNEL, transport_key=key,
                                          body=payload, actor=v2)
        assert outcome.outcome == "v1_accepted" and outcome.receipt is None
    for account_key, key, payload, record, position in load.refused:  # retried by the source: V2 accepts them
        outcome = admission.receipt_admit(account_key=account_key, channel=CHANNEL, transport_key=key,
                                          body=payload, actor=v2)
        assert outcome.outcome == "created"
        materialize.receipt_materialize(receipt_pk=outcome.receipt.pk)
    (stale_account, stale_record), stale_baseline = next(iter(baselines.items()))
    stale = admission.receipt_admit(account_key=stale_account, channel=CHANNEL, transport_key="late-replay-1",
                                    body=event_body("late-1", stale_record, 1), actor=v2)
    materialize.receipt_materialize(receipt_pk=stale.receipt.pk)
    v2_drain()
    assert stale_baseline >= 1
    assert SupersededDecision.objects.filter(lane__partition=stale_record, lane__account__account_key=stale_account,
                                             position=1).exists(), "a position at or below the V1 high-water"
    assert Receipt.objects.count() == len(load.refused) + 1
    assert ReceiptAdmissionKey.objects.filter(tombstone__isnull=False).count() == len(load.accepted)
    executions = list(Execution.objects.select_related("lane__account"))
    assert executions and all(e.state == "completed" for e in executions)
    for e in executions:  # V2 continued after the V1 high-water of the same account and partition
        key = (e.lane.account.account_key, e.lane.partition)
        assert key in baselines
    assert provider.applied_total() == len(load.accepted)  # V1 never ran again
