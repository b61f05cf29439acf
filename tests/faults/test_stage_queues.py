"""Stages do not starve each other: a burst of materializations never waits in front of the executions it
produces.

The Celery worker children are started exactly as `scripts/run.py` (make run) defines them, against this run's
test databases and a private Redis. A burst of deliveries is admitted through `receipt_admit`, then the normal
post-commit enqueue (`connector.api.views._materialization_enqueue`) runs for every receipt at once, as a burst
of concurrent clients does (since D-269 it wakes the account's batch materializer once for the whole burst). With one queue for every stage (the old routing), every
execution task queued behind every materialization task, so no ApplicationResult existed before the last
receipt was materialized; with one queue and worker group per stage the first result arrives while
materialization is still draining the burst. The full 2,000-delivery measurement over HTTP is
`manage.py bench burst` (docs/benchmarks.md)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from django.db.models import Max, Min

from connector.actors import Actor
from connector.api.views import _materialization_enqueue
from connector.demo import build_world
from connector.models import ApplicationResult, Event
from connector.services.admission import receipt_admit
from scripts.run import children as run_children
from tests.faults.servers import Child, RedisServer, child_environment, point_celery_at, run_database_env
from tests.support import deadline, scaled

BURST = 60
CHANNEL = "records.webhook"


@pytest.fixture
def broker(settings):
    """A private Redis that this process publishes to and the worker children consume (restored afterwards)."""
    from connector import tasks

    server = RedisServer()
    try:
        server.start()
    except BaseException:
        server.cleanup()
        raise
    app = tasks.receipt_materialize.app

    def point_at(url: str) -> None:
        point_celery_at(app, url)

    saved = app.conf.broker_url
    settings.CELERY_BROKER_URL = server.url
    point_at(server.url)
    try:
        yield server
    finally:
        point_at(saved)
        server.cleanup()


@pytest.fixture
def workers(settings, broker, tmp_path):
    """The worker children of scripts/run.py, started and ready; stopped before the database is flushed."""
    # Materialization reads (and, since D-294, materializes together) 2 due receipts at a time, so the burst spans
    # many materialization transactions, as a burst larger than the default batch of 50 does.
    env = child_environment(secret_dir=settings.CONNECTOR["SECRET_BACKEND_DIR"], REDIS_URL=broker.url,
                            CONNECTOR_MATERIALIZE_BATCH="2", **run_database_env())
    started = [Child(name, argv, env, tmp_path).start() for name, argv in run_children(0)
               if name.startswith("worker")]
    try:
        ready = deadline(90)
        for child in started:
            while "ready." not in child.output():
                assert child.proc.poll() is None, f"{child.name} exited:\n{child.output()}"
                ready.check(f"{child.name} ready:\n{child.output()}")
                time.sleep(0.2)
        yield started
    finally:
        _stop_all(started)


def _stop_all(started: list[Child], grace: float = 3.0) -> None:
    """SIGTERM every worker group at once, SIGKILL what is left after `grace` seconds: the test needs them gone
    (their connections closed) before the database flush, not a warm shutdown of a long claim loop."""
    for child in started:
        if child.proc.poll() is None:
            try:
                os.killpg(child.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    until = time.monotonic() + grace
    for child in started:
        try:
            child.proc.wait(timeout=max(0.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for child in started:
        if child.proc.poll() is None:
            try:
                os.killpg(child.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.proc.wait(timeout=scaled(10))


def _body(n: int) -> bytes:
    return json.dumps({"events": [{"id": f"sq-ev-{n}", "type": "record.updated", "record_id": f"sq-r-{n}",
                                   "sequence": 1, "occurred_at": "2026-01-01T00:00:00Z",
                                   "data": {"name": f"Burst {n}", "email": f"b{n}@example.com"}}]}).encode()


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_first_application_result_does_not_wait_for_the_whole_materialization_burst(workers):
    """60 admitted deliveries are enqueued at once for the workers of make run. The first ApplicationResult
    commits before the last receipt of the burst is materialized; on the old single-queue routing it came only
    after every materialization (and every lane advance) of the burst.
    Proves: CV2-14-003 (a starvation bound for every operation class)"""
    world = build_world("sq-")
    account = world.accounts[0].account_key
    actor = Actor.system("burst")
    receipts = [receipt_admit(account_key=account, channel=CHANNEL, transport_key=f"sq-{n}", body=_body(n),
                              actor=actor).receipt for n in range(BURST)]
    began = time.time()
    for receipt in receipts:
        _materialization_enqueue(receipt.pk, receipt.account_id)  # what the admission view runs on commit
    limit = deadline(180)
    while Event.objects.count() < BURST or not ApplicationResult.objects.exists():
        limit.check(f"{Event.objects.count()}/{BURST} materialized, {ApplicationResult.objects.count()} results:\n"
                    + "\n".join(c.output()[-1500:] for c in workers))
        time.sleep(0.2)
    results = ApplicationResult.objects.aggregate(first=Min("committed_at"))
    materialized = Event.objects.aggregate(first=Min("created_at"), last=Max("created_at"))
    first_after = results["first"].timestamp() - began
    last_materialized_after = materialized["last"].timestamp() - began
    print(f"\nburst of {BURST}: first ApplicationResult {first_after:.2f} s after the enqueue, last materialization "
          f"{last_materialized_after:.2f} s")
    assert results["first"] < materialized["last"], (
        f"the first ApplicationResult ({first_after:.2f} s) waited for the last materialization "
        f"({last_materialized_after:.2f} s): executions queued behind materializations")


def test_each_stage_queue_is_consumed_by_its_own_worker_child(settings):
    """Routing and process layout agree: materialization, the execution stage and egress each have their own
    queue, each consumed by exactly one worker child of scripts/run.py that consumes no other stage's queue (lane
    advances are the execution stage's, on a queue of their own), and every queue a connector or effects task is
    routed to has a consumer. Proves: CV2-14-003"""
    routes = settings.CELERY_TASK_ROUTES
    assert routes["connector.tasks.materialize_due"] == routes["connector.tasks.receipt_materialize"]
    stage = {task: routes[task]["queue"] for task in ("connector.tasks.receipt_materialize",
                                                      "connector.tasks.execution_claim_and_run",
                                                      "effects.tasks.effect_dispatch")}
    assert len(set(stage.values())) == 3, stage
    consumers = {name: set(argv[argv.index("-Q") + 1].split(",")) for name, argv in run_children(0)
                 if name.startswith("worker")}
    lanes = routes["connector.tasks.lane_advance"]["queue"]
    assert lanes not in (stage["connector.tasks.receipt_materialize"], stage["effects.tasks.effect_dispatch"])
    assert [n for n, q in consumers.items() if lanes in q] == [
        n for n, q in consumers.items() if stage["connector.tasks.execution_claim_and_run"] in q], (
        "lane advances belong to the execution stage's workers")
    for task, queue in stage.items():
        owners = [name for name, queues in consumers.items() if queue in queues]
        assert len(owners) == 1, f"{task} ({queue}) is consumed by {owners}"
        assert not (consumers[owners[0]] - {queue}) & set(stage.values()), (
            f"{owners[0]} also consumes another stage's queue: {consumers[owners[0]]}")
    routed = {r["queue"] for name, r in routes.items() if not name.startswith("v1.")}
    assert routed <= set().union(*consumers.values()), routed - set().union(*consumers.values())
