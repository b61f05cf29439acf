"""Fault: a worker paused past its lease (a GC pause, a frozen VM, SIGSTOP).

A real child process claims the ready Execution with a short lease (2 s stretched by the suite's time factor, so
that it still holds when the test checks it on a loaded machine) and is then frozen (SIGSTOP) before calling
Runtime. Half a second past the lease another claimant takes the same Execution identity (same pk, command ID and
ExecutionRef) as a new Attempt with a higher lease fence and completes it. When the paused worker is resumed it runs its stale
claim to the end: Runtime answers the same command with the stored ApplicationResult, nothing is applied twice,
the Execution stays completed once; check_invariants passes."""
from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time

import pytest

from connector.demo import build_world
from connector.models import ApplicationResult, CrmRecord, Execution, ExecutionAttempt
from connector.selectors.invariants import invariant_check
from connector.services.execution import execution_claim, execution_run
from tests.crash.support import DB, ready_execution
from tests.faults.servers import ROOT, child_environment, run_database_env
from tests.support import scaled, wait_for

PAUSED_WORKER = """
import json, os, signal
import django
django.setup()
from connector.services.execution import execution_claim, execution_run
token = execution_claim(holder="paused-worker", lease_seconds=int(os.environ["LEASE_SECONDS"]),
                        account_id=int(os.environ["ACCOUNT_ID"]))
print("CLAIMED " + json.dumps({"execution": token.execution_pk, "fence": token.lease_fence}), flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # frozen here, between the committed claim and the Runtime call
execution = execution_run(token=token)
print("FINISHED " + json.dumps({"execution": execution.pk, "state": execution.state}), flush=True)
"""


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.django_db(**DB)
def test_worker_paused_past_its_lease_loses_the_claim_not_the_work(settings):
    world = build_world("pz-")
    account = world.accounts[0]
    execution = ready_execution(account.account_key)
    lease = math.ceil(scaled(2))
    env = child_environment(secret_dir=settings.CONNECTOR["SECRET_BACKEND_DIR"], ACCOUNT_ID=str(account.pk),
                            LEASE_SECONDS=str(lease), REDIS_URL="redis://127.0.0.1:1/0", **run_database_env())
    child = subprocess.Popen([sys.executable, "-c", PAUSED_WORKER], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        claimed = json.loads(child.stdout.readline().removeprefix("CLAIMED "))
        wait_for(lambda: _state(child.pid) == "T", 10, "the worker paused", interval=0.01)
        assert claimed["execution"] == execution.pk
        assert execution_claim(holder="second-worker", account_id=account.pk) is None  # the lease still holds

        time.sleep(lease + 0.5)  # paused past its lease
        token = execution_claim(holder="second-worker", lease_seconds=60, account_id=account.pk)
        assert token is not None and token.execution_pk == execution.pk
        assert token.lease_fence == claimed["fence"] + 1
        reclaimed = Execution.objects.get(pk=execution.pk)
        assert (reclaimed.command_id, bytes(reclaimed.execution_ref_digest)) == (
            execution.command_id, bytes(execution.execution_ref_digest))
        assert list(ExecutionAttempt.objects.filter(execution=execution).values_list("ordinal", "holder")) == [
            (1, "paused-worker"), (2, "second-worker")]
        assert Execution.objects.filter(projection=execution.projection).count() == 1
        done = execution_run(token=token)
        assert done.state == "completed"
        result = ApplicationResult.objects.get(command_id=execution.command_id)

        child.send_signal(signal.SIGCONT)  # the paused worker wakes up with its stale claim and runs it
        out, err = child.communicate(timeout=scaled(30))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    finished = json.loads(out.strip().splitlines()[-1].removeprefix("FINISHED "))
    assert finished == {"execution": execution.pk, "state": "completed"}
    assert ApplicationResult.objects.filter(command_id=execution.command_id).count() == 1
    assert ApplicationResult.objects.get(command_id=execution.command_id).pk == result.pk
    assert CrmRecord.objects.get(account=account, record_key="rec-1").version == 1
    assert Execution.objects.get(pk=execution.pk).attempt_count == 2
    assert invariant_check().ok
