"""Admission rate and latency by outcome on /metrics (issue 21): `connector_admission_duration_seconds{outcome}`,
counted per process or, with PROMETHEUS_MULTIPROC_DIR, summed over every process's files."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from connector.services.signatures import sign
from tests.connector.test_api_admission import admit, body, event, signing_secret
from tests.support import scaled

ROOT = Path(__file__).resolve().parents[2]
NAME = "connector_admission_duration_seconds"


def _counts(client: Client) -> dict[str, float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    counts = {}
    for family in text_string_to_metric_families(response.content.decode()):
        if family.name == NAME:
            for sample in family.samples:
                if sample.name == NAME + "_count":
                    counts[sample.labels["outcome"]] = sample.value
    return counts


@pytest.mark.django_db
def test_admissions_are_counted_and_timed_by_outcome(world):
    """A created, a duplicate and a refused admission (bad signature) each add one observation under their own
    outcome label (the answer's `admission` or error code), with their latency in the histogram's sum. Proves:
    issue 21 (admission rate and latency by outcome)."""
    client = Client()
    before = _counts(client)
    account = world.accounts[0].account_key
    payload = body(event(id="e-m-1", record_id="r-m-1"))
    signature = sign(signing_secret(account), int(time.time()), payload)
    assert admit(client, payload, "k-m-1", account=account, signature=signature).status_code == 201
    assert admit(client, payload, "k-m-1", account=account, signature=signature).status_code == 200
    refused = admit(client, payload, "k-m-2", account=account, signature="t=1,v1=00")
    assert refused.status_code >= 400, refused.content
    code = refused.json()["code"]
    after = _counts(client)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert {k: v for k, v in delta.items() if v} == {"created": 1, "duplicate": 1, code: 1}


CHILD = """
import sys
from observability.admission import observe
for outcome in sys.argv[1:]:
    observe(outcome, 0.004)
"""


@pytest.mark.django_db
def test_metrics_sum_every_process_in_multiprocess_mode(world, tmp_path, monkeypatch):
    """Two separate processes observe admissions into PROMETHEUS_MULTIPROC_DIR; /metrics answers their sum, so
    any web worker reports the same figures. Proves: issue 21 (metrics from several processes)."""
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    for outcomes in (["created", "created", "duplicate"], ["created", "SIGNATURE_INVALID"]):
        subprocess.run([sys.executable, "-c", CHILD, *outcomes], env=env, cwd=ROOT, check=True, timeout=scaled(60))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    assert _counts(Client()) == {"created": 3, "duplicate": 1, "SIGNATURE_INVALID": 1}
