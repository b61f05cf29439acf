"""Latency, egress and deferral metrics counted where the work happens (issue 21, connector/stage_metrics.py):
observed once, after the commit of the transaction that did the work (a rolled-back transaction counts nothing),
with the timestamps PostgreSQL stored, and with label values from closed sets only. Real transactions (a
transactional test), so `on_commit` runs exactly as in a worker."""
from __future__ import annotations

import time

import pytest
from celery.app.task import Task
from django.db import transaction
from django.test import Client
from prometheus_client.registry import CollectorRegistry

from connector import stage_metrics
from connector.faults import fault_point as real_fault_point
from connector.models import ApplicationResult, Receipt
from connector.services import execution
from connector.services.materialize import receipt_materialize
from connector.services.signatures import sign
from effects import egress
from effects import egress_batch
from effects.errors import DestinationDeferred
from effects.models import DestinationLimiter, OutboundCommand, RemoteEffect
from effects.services import dispatch, worker
from tests.connector.test_api_admission import admit, body, event, signing_secret
from tests.effects.helpers import CALLOUT, author, claim
from tests.effects.receiver import Receiver
from tests.support import scaled, whole_seconds

RESULT = "connector_result_latency_seconds"
EFFECT = "connector_effect_latency_seconds"
EGRESS = "connector_egress_duration_seconds"
LIMITED = "connector_rate_limit_deferrals_total"
RECEIVER = "connector_receiver_deferrals_total"


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for collector in stage_metrics.COLLECTORS:
        registry.register(collector)
    return registry


def value(name: str, **labels: str) -> float:
    return _registry().get_sample_value(name, labels) or 0.0


class Snapshot:
    """Values at one moment; `delta(name, **labels)` is what was observed since."""

    def __init__(self) -> None:
        self.samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                        for family in _registry().collect() for s in family.samples}

    def delta(self, name: str, **labels: str) -> float:
        return value(name, **labels) - self.samples.get((name, tuple(sorted(labels.items()))), 0.0)


def assert_labels_closed() -> None:
    """Every series of every stage metric carries label values of the closed sets only."""
    allowed = {"source": set(stage_metrics.SOURCES), "outcome": {*stage_metrics.OUTCOMES, stage_metrics.UNKNOWN},
               "status": set(stage_metrics.STATUSES), "cause": {*stage_metrics.CAUSES, stage_metrics.UNKNOWN},
               "destination": {CALLOUT, stage_metrics.OTHER},
               "reason": {*stage_metrics.NO_EFFECT_REASONS, stage_metrics.UNKNOWN},
               "step": {*stage_metrics.SETTLE_STEPS, stage_metrics.UNKNOWN}}
    for family in _registry().collect():
        for sample in family.samples:
            for label, given in sample.labels.items():
                if label != "le":
                    assert given in allowed[label], (sample.name, label, given)


def _raising_at(point: str):
    def fault(name: str) -> None:
        if name == point:
            raise RuntimeError(f"injected failure at {name}")
        real_fault_point(name)
    return fault


@pytest.fixture
def quiet(monkeypatch):
    """Wake-ups are dropped instead of reaching the broker: every step is run here."""
    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: None)


@pytest.fixture
def receiver(settings):
    r = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": r.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(1)}
    yield r
    r.stop()


def test_result_latency_is_observed_once_after_the_commit_and_never_on_a_rollback(transactional_db, quiet,
                                                                                  monkeypatch):
    """One delivery is admitted, materialized and claimed. Recording its result fails inside the recording
    transaction (after the observation was registered): it rolls back and nothing is counted. Run again, the
    result is recorded and exactly one observation is counted under (event, the result's outcome), of exactly the
    seconds between the Receipt's `created_at` and the ApplicationResult's `committed_at` as PostgreSQL stored them;
    recording the same result again (idempotent) counts nothing more. Proves: issue 21 (stage latency admission ->
    ApplicationResult)."""
    from connector.demo import build_world

    world = build_world("sm-")
    account = world.accounts[0].account_key
    payload = body(event(id="e-sm-1", record_id="r-sm-1"))
    response = admit(Client(), payload, "k-sm-1", account=account,
                     signature=sign(signing_secret(account), int(time.time()), payload))
    assert response.status_code == 201, response.content
    receipt = Receipt.objects.get(pk=response.json()["receipt"])
    out = receipt_materialize(receipt_pk=receipt.pk)
    for lane_pk in out.lanes:
        execution.lane_advance(lane_pk=lane_pk)
    token = execution.execution_claim(holder="sm-holder", lease_seconds=60)
    before = Snapshot()

    monkeypatch.setattr(execution, "fault_point", _raising_at("result.before_commit"))
    with pytest.raises(RuntimeError, match="injected failure"):
        execution.execution_run(token=token)
    assert before.delta(RESULT + "_count", source="event", outcome="applied") == 0
    assert all(before.delta(RESULT + "_count", source="event", outcome=o) == 0 for o in stage_metrics.OUTCOMES)

    monkeypatch.setattr(execution, "fault_point", real_fault_point)
    done = execution.execution_run(token=token)
    assert done.state == "completed"
    result = ApplicationResult.objects.get(command_id=done.command_id)
    assert before.delta(RESULT + "_count", source="event", outcome=result.outcome) == 1
    assert before.delta(RESULT + "_sum", source="event", outcome=result.outcome) == pytest.approx(
        (result.committed_at - receipt.created_at).total_seconds(), abs=1e-6)
    execution.execution_record_result(execution_pk=done.pk, command_id=done.command_id,
                                      execution_ref_digest=bytes(done.execution_ref_digest))
    assert before.delta(RESULT + "_count", source="event", outcome=result.outcome) == 1
    assert_labels_closed()


def _limited_world(monkeypatch, prefix: str, **rate):
    from connector import demo

    monkeypatch.setattr(demo, "CALLOUT_DEFINITION", {**demo.CALLOUT_DEFINITION, "rate_limit": rate})
    return demo.build_world(prefix, push=True)


def test_egress_deferrals_and_finalization_are_counted_after_their_commits(transactional_db, quiet, receiver,
                                                                           monkeypatch):
    """A destination declared with 1 permit in flight and two effects: the second acquisition is refused by the
    limiter (DESTINATION_DEFERRED) and counted once under cause `in_flight`, as the limiter row's refused_total
    says; the first request is answered 429 (Retry-After 0): one egress observation under status `429` and one
    receiver deferral, as deferrals_total says. A finalization that fails inside its transaction counts nothing;
    the retried one counts once, of exactly the command's `created_at` to the effect's finalized `changed_at`.
    After both effects land: two `2xx` egress observations and two effect latencies. Every label is from the
    closed sets. Proves: issue 21 (egress latency and status per destination, rate-limit deferrals, stage latency
    command -> finalized effect), CV2-10-037."""
    world = _limited_world(monkeypatch, "sl-", requests_per_second=1000, max_in_flight=1)
    account = world.accounts[0]
    commands = [author(account, root="o-1", record_id="r1"), author(account, root="o-2", record_id="r2")]
    before = Snapshot()

    holder, first = claim("h-sm-1", account)
    _, second = claim("h-sm-2", account)
    permit = dispatch.permit_acquire(claim=first)
    with pytest.raises(DestinationDeferred):
        dispatch.permit_acquire(claim=second)
    limiter = DestinationLimiter.objects.get(pk=commands[0].limiter_id)
    assert limiter.refused_total == 1
    assert before.delta(LIMITED, destination=CALLOUT, cause="in_flight") == 1
    assert before.delta(LIMITED, destination=CALLOUT, cause="rate") == 0

    receiver.modes, receiver.retry_after = ["throttle"], "0"
    effect = egress_batch.send(permit_pk=permit.pk, holder_id=holder.holder_id, holder_fence=permit.holder_fence,
                         credential_gate_fence=permit.credential_gate_fence)
    assert effect.state == "prepared"
    assert DestinationLimiter.objects.get(pk=limiter.pk).deferrals_total == 1
    assert before.delta(RECEIVER, destination=CALLOUT, status="429") == 1
    assert before.delta(EGRESS + "_count", destination=CALLOUT, status="429") == 1
    assert before.delta(EGRESS + "_count", destination=CALLOUT, status="2xx") == 0

    holder, again = claim("h-sm-3", account)
    permit = dispatch.permit_acquire(claim=again)
    from effects.services import dispatch_batch

    with monkeypatch.context() as held:  # the finalization in the settlement fails: left remote_confirmed
        held.setattr(dispatch_batch, "_finalize_in_savepoint", lambda **kwargs: None)
        confirmed = egress_batch.send(permit_pk=permit.pk, holder_id=holder.holder_id,
                                      holder_fence=permit.holder_fence,
                                      credential_gate_fence=permit.credential_gate_fence)
    assert confirmed.state == "remote_confirmed"
    assert before.delta(EGRESS + "_count", destination=CALLOUT, status="2xx") == 1

    real_audit = dispatch.audit_record

    def failing_audit(**kwargs):
        if kwargs.get("action") == "effect_finalize":
            raise RuntimeError("injected failure before the finalization commits")
        return real_audit(**kwargs)

    monkeypatch.setattr(dispatch, "audit_record", failing_audit)
    with pytest.raises(RuntimeError, match="injected failure"):
        dispatch.effect_finalize(effect_pk=confirmed.pk)
    assert RemoteEffect.objects.get(pk=confirmed.pk).state == "remote_confirmed"
    assert before.delta(EFFECT + "_count", destination=CALLOUT) == 0
    monkeypatch.setattr(dispatch, "audit_record", real_audit)
    assert dispatch.effect_finalize(effect_pk=confirmed.pk).state == "finalized"
    assert before.delta(EFFECT + "_count", destination=CALLOUT) == 1

    deadline = time.monotonic() + scaled(20)
    while RemoteEffect.objects.exclude(state="finalized").exists():
        assert time.monotonic() < deadline, list(RemoteEffect.objects.values_list("pk", "state"))
        if worker.effect_dispatch_once(holder_name="h-sm-4", account_id=account.pk) is None:
            time.sleep(0.01)
    assert before.delta(EGRESS + "_count", destination=CALLOUT, status="2xx") == 2
    assert before.delta(EFFECT + "_count", destination=CALLOUT) == 2
    expected = sum((e.changed_at - e.command.created_at).total_seconds()
                   for e in RemoteEffect.objects.filter(command__in=commands).select_related("command"))
    assert before.delta(EFFECT + "_sum", destination=CALLOUT) == pytest.approx(expected, abs=1e-6)
    assert before.delta(LIMITED, destination=CALLOUT, cause="in_flight") + before.delta(
        LIMITED, destination=CALLOUT, cause="rate") + before.delta(
        LIMITED, destination=CALLOUT, cause="receiver_deferral") == DestinationLimiter.objects.get(
        pk=limiter.pk).refused_total
    assert OutboundCommand.objects.filter(callout=CALLOUT).count() == 2
    assert_labels_closed()


def test_an_observation_inside_a_rolled_back_transaction_counts_nothing(transactional_db):
    """The shared rule of every stage metric: registered inside a transaction, counted only when it commits;
    outside one, at once. Proves: issue 21 (observe after commit)."""
    before = Snapshot()
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            stage_metrics.egress_observe(callout=CALLOUT, status_label="5xx", seconds=0.5)
            stage_metrics.rate_limit_deferred(callout=CALLOUT, cause="rate")
            raise RuntimeError("rolled back")
    assert before.delta(EGRESS + "_count", destination=CALLOUT, status="5xx") == 0
    assert before.delta(LIMITED, destination=CALLOUT, cause="rate") == 0
    with transaction.atomic():
        stage_metrics.egress_observe(callout=CALLOUT, status_label="5xx", seconds=0.5)
        assert before.delta(EGRESS + "_count", destination=CALLOUT, status="5xx") == 0  # not before the commit
    assert before.delta(EGRESS + "_count", destination=CALLOUT, status="5xx") == 1
    assert before.delta(EGRESS + "_sum", destination=CALLOUT, status="5xx") == pytest.approx(0.5)


def test_labels_stay_in_their_closed_sets(transactional_db, settings, monkeypatch):
    """A destination label is the callout's identifier or `_other` (a URL, a path with ids, an over-long or
    non-string name, or one past the per-process cap); statuses map to classes, 429 and `other`; an unknown
    status, cause or outcome never becomes a label of its own. Proves: issue 21 (bounded label sets)."""
    monkeypatch.setattr(stage_metrics, "_destinations", set())
    settings.CONNECTOR = {**settings.CONNECTOR, "METRICS_MAX_DESTINATIONS": 2}
    assert stage_metrics.destination("records.callout") == "records.callout"
    for hostile in ("https://crm.example/v1/records/123", "/v1/records/by-id/9f8e", "x" * 65, "", None,
                    "records callout", "ümlaut"):
        assert stage_metrics.destination(hostile) == stage_metrics.OTHER, hostile
    assert stage_metrics.destination("billing.callout") == "billing.callout"
    assert stage_metrics.destination("third.callout") == stage_metrics.OTHER  # past the cap of 2
    assert stage_metrics.destination("records.callout") == "records.callout"  # already known: kept
    assert [stage_metrics.status(c) for c in (200, 201, 302, 404, 429, 500, 503, 99, 600, None)] == [
        "2xx", "2xx", "3xx", "4xx", "429", "5xx", "5xx", "other", "other", "other"]
    before = Snapshot()
    stage_metrics.egress_observe(callout="records.callout", status_label="418 teapot", seconds=0.1)
    stage_metrics.rate_limit_deferred(callout="records.callout", cause="because")
    assert before.delta(EGRESS + "_count", destination="records.callout", status="other") == 1
    assert before.delta(LIMITED, destination="records.callout", cause=stage_metrics.UNKNOWN) == 1


def test_the_web_metrics_include_this_process_counts_without_a_multiprocess_directory(transactional_db,
                                                                                     monkeypatch):
    """Without PROMETHEUS_MULTIPROC_DIR (one process, development) /metrics answers this process's own counted
    metrics beside the PostgreSQL readings: an egress observation made here is on the page with its labels.
    Proves: issue 21 (the web /metrics includes the stage histograms)."""
    from prometheus_client.parser import text_string_to_metric_families

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)

    def page() -> dict:
        response = Client().get("/metrics")
        assert response.status_code == 200, response.content
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}

    key = (EGRESS + "_count", (("destination", CALLOUT), ("status", "timeout")))
    before = page()
    stage_metrics.egress_observe(callout=CALLOUT, status_label="timeout", seconds=5.0)
    after = page()
    assert after[key] - before.get(key, 0.0) == 1
    assert ("connector_backlog_items", (("stage", "materialization_due"),)) in after  # the readings are there too
