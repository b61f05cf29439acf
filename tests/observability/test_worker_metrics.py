"""A worker process exports its own metrics (issue 21, D-231): a real Celery worker (prefork, two children) with
PROMETHEUS_MULTIPROC_DIR and CONNECTOR_WORKER_METRICS_PORT does known work, N deliveries through to finalized
effects against the real loopback receiver, and its own port, scraped over HTTP, shows exactly that work; the web
process of `make run` (gunicorn), sharing the directory, shows the same sums on /metrics."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from connector.actors import Actor
from connector.api.views import _materialization_enqueue
from connector.models import ApplicationResult, Receipt
from connector.services.admission import receipt_admit
from effects.models import DestinationLimiter, RemoteEffect
from effects.tasks import effect_dispatch
from scripts.run import QUEUES
from tests.effects.helpers import CALLOUT
from tests.effects.receiver import Receiver
from tests.faults.servers import child_environment, free_port, run_database_env
from tests.faults.test_stage_queues import _body, _stop_all, broker  # noqa: F401 - the private Redis fixture
from tests.faults.servers import Child
from tests.observability.conftest import start_web
from tests.support import deadline, holds_within, scaled, wait_for, whole_seconds

ROOT = Path(__file__).resolve().parents[2]
N = 6  # deliveries
THROTTLED = 2  # the receiver's first answers: 429 with Retry-After: 0
CHANNEL = "records.webhook"
STAGE_SERIES = [
    ("connector_result_latency_seconds_count", {"source": "event", "outcome": "applied"}),
    ("connector_effect_latency_seconds_count", {"destination": CALLOUT}),
    ("connector_egress_duration_seconds_count", {"destination": CALLOUT, "status": "2xx"}),
    ("connector_egress_duration_seconds_count", {"destination": CALLOUT, "status": "429"}),
    ("connector_receiver_deferrals_total", {"destination": CALLOUT, "status": "429"}),
]


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=scaled(10)) as response:
        assert response.status == 200
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def get(samples: dict, name: str, labels: dict) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def deferrals(samples: dict) -> float:
    return sum(v for (name, labels), v in samples.items()
               if name == "connector_rate_limit_deferrals_total" and dict(labels).get("destination") == CALLOUT)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_a_worker_serves_exact_counts_of_its_work_and_the_web_shows_the_same_sums(settings, broker, tmp_path,
                                                                                  monkeypatch):
    """N deliveries on a destination declared with a rate limit (1 in flight, two worker children contending) run
    through a real worker to finalized effects; the receiver answers the first two requests 429. Scraped over HTTP,
    the worker's own port shows: N admission -> result latencies (event, applied) whose sum is exactly the stored
    committed_at - created_at, N command -> finalized latencies, N egress `2xx` and 2 `429` for the destination, 2
    receiver deferrals, and limiter deferrals equal to the limiter row's refused_total. The web's /metrics, reading
    the same multiprocess directory, shows the same values. Proves: issue 21 (metrics exported by a worker process,
    stage latencies, egress status per destination, rate-limit deferrals), CV2-10-037."""
    from connector import demo

    monkeypatch.setattr(demo, "CALLOUT_DEFINITION", {**demo.CALLOUT_DEFINITION,
                                                     "rate_limit": {"requests_per_second": 1000, "max_in_flight": 1}})
    world = demo.build_world("wm-", push=True)
    receiver = Receiver().start()
    receiver.modes, receiver.retry_after = ["throttle"] * THROTTLED, "0"
    receiver.service_seconds = 0.05  # two worker children contend for the destination's one permit
    shared = tmp_path / "prometheus"
    shared.mkdir()
    port = free_port()
    env = child_environment(secret_dir=settings.CONNECTOR["SECRET_BACKEND_DIR"], REDIS_URL=broker.url,
                            PROMETHEUS_MULTIPROC_DIR=str(shared), CONNECTOR_WORKER_METRICS_PORT=str(port),
                            CONNECTOR_EGRESS_BASE_URL=receiver.url,
                            CONNECTOR_EGRESS_TIMEOUT_SECONDS=str(whole_seconds(5)),
                            CONNECTOR_WORKER_HEARTBEAT_FILE=str(tmp_path / "beat"), **run_database_env())
    worker = Child("worker-metrics", [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", QUEUES,
                                      "-l", "INFO", "--pool", "prefork", "--concurrency", "2", "-n",
                                      f"metrics-{os.getpid()}@%h", "--without-gossip", "--without-mingle"],
                   env, tmp_path).start()
    web = None
    try:
        web_port, web = start_web(tmp_path, PROMETHEUS_MULTIPROC_DIR=str(shared), WEB_CONCURRENCY="1")
        wait_for(lambda: "ready." in worker.output(), 60, "the worker ready", interval=0.2, proc=worker.proc)
        worker_url = f"http://127.0.0.1:{port}/metrics"
        assert all(get(scrape(worker_url), name, labels) == 0 for name, labels in STAGE_SERIES)

        actor = Actor.system("worker-metrics")
        account = world.accounts[0].account_key
        receipts = [receipt_admit(account_key=account, channel=CHANNEL, transport_key=f"wm-{n}", body=_body(n),
                                  actor=actor).receipt.pk for n in range(N)]
        for pk in receipts:
            _materialization_enqueue(pk)  # what the admission view runs on commit
        finalizing = deadline(60)
        while RemoteEffect.objects.filter(state="finalized").count() < N:
            finalizing.check(f"{RemoteEffect.objects.filter(state='finalized').count()}/{N} finalized:\n"
                             f"{worker.output()}")
            effect_dispatch.delay()  # what the effects sweeper does for effects a full destination passed over
            time.sleep(0.3)
        # The observation follows each commit by microseconds: wait for it, never past the exact count.
        holds_within(lambda: get(scrape(worker_url), *STAGE_SERIES[1]) >= N, 10, interval=0.1)

        at_worker = scrape(worker_url)
        assert [get(at_worker, *series) for series in STAGE_SERIES] == [N, N, N, THROTTLED, THROTTLED]
        # One result per receipt: the sum of the N latencies is the sum of the commit times minus the admissions'.
        committed = [r.committed_at.timestamp() for r in ApplicationResult.objects.all()]
        admitted = [r.created_at.timestamp() for r in Receipt.objects.all()]
        assert len(committed) == len(admitted) == N
        assert get(at_worker, "connector_result_latency_seconds_sum", {"source": "event", "outcome": "applied"}) \
            == pytest.approx(sum(committed) - sum(admitted), abs=1e-3)
        limiter = DestinationLimiter.objects.get()
        assert limiter.deferrals_total == THROTTLED
        assert deferrals(at_worker) == limiter.refused_total
        assert len(receiver.requests) == N + THROTTLED and len(receiver.applied) == N

        at_web = scrape(f"http://127.0.0.1:{web_port}/metrics")
        for name, labels in STAGE_SERIES:
            assert get(at_web, name, labels) == get(at_worker, name, labels), (name, labels)
        assert deferrals(at_web) == deferrals(at_worker)
        assert get(at_web, "connector_result_latency_seconds_sum", {"source": "event", "outcome": "applied"}) \
            == get(at_worker, "connector_result_latency_seconds_sum", {"source": "event", "outcome": "applied"})
        print(f"\nworker scrape: {N} deliveries, {deferrals(at_worker):.0f} limiter deferrals, "
              f"{len(list(shared.glob('*.db')))} multiprocess files")
    finally:
        _stop_all([worker])
        if web is not None:
            web.stop()
        receiver.stop()


def test_make_run_gives_every_child_one_emptied_multiprocess_directory(tmp_path, monkeypatch):
    """`make run` (scripts/run.py) starts every child (web, each worker group, beat, receiver) with the same
    PROMETHEUS_MULTIPROC_DIR, after removing the metric files an earlier run left there (they would be summed in
    for ever); other files in it are left alone. Proves: issue 21 (metrics of several processes, make run)."""
    from scripts import run

    shared = tmp_path / "prometheus"
    shared.mkdir()
    (shared / "histogram_4242.db").write_bytes(b"stale")
    (shared / "counter_4243.db").write_bytes(b"stale")
    (shared / "notes.txt").write_text("not a metric file")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(shared))
    started = []

    class Started:
        def __init__(self, argv, **kwargs):
            assert not list(shared.glob("*.db")), "a child started before the directory was emptied"
            started.append(kwargs["env"]["PROMETHEUS_MULTIPROC_DIR"])
            self.pid, self.stdout = 1, open(os.devnull, "rb")

    monkeypatch.setattr(run.subprocess, "Popen", Started)
    supervisor = run.Supervisor(0)
    supervisor.start()
    for pump in supervisor.pumps:
        pump.join(timeout=5)
    assert started == [str(shared)] * len(run.children(0))
    assert (shared / "notes.txt").exists()
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    assert run.metrics_dir({}) == run.ROOT / ".data" / "prometheus-multiproc"
