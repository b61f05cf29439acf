"""A worker process that died on this host is isolated by the effects sweep (issue 37, the worker-SIGKILL row):
its generation terminated with the evidence that the process no longer exists, its open permits abandoned with
that proof, so nothing stays `dispatching` waiting for a person to run `holders terminate`. A live process, a
generation of another host, or the switch turned off: nothing happens."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from connector.models import AuditRecord
from effects.models import DispatchPermit, ProcessGeneration, RemoteEffect
from effects.services import worker
from tests.effects.helpers import acquire, author, build_push_world


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


@pytest.mark.django_db
def test_the_sweep_isolates_a_holder_whose_process_died_here_and_leaves_the_living_alone(settings):
    """A generation named `<this host>:<a dead pid>:<tag>` holding a granted permit: the sweep terminates it with
    the evidence and abandons the permit (the effect back to `prepared`, never sent); a generation of this very
    process, and one of another host whose pid does not exist here, stay running with their permits.
    Proves: issue 37 item 2 (no person needed to isolate a killed worker)"""
    account = build_push_world().accounts[0]
    host = socket.gethostname()
    dead, alive = f"{host}:{_dead_pid()}:deadbeef", f"{host}:{__import__('os').getpid()}:a11ve000"
    elsewhere = f"another-host-{host}:{_dead_pid()}:e15e0000"
    for n, holder_id in enumerate((dead, alive, elsewhere)):
        author(account, root=f"order-{n}", record_id=f"r{n}", slot=f"push:records.push:{n}")
        acquire(holder_id, account)

    worker.effects_sweep()

    states = dict(ProcessGeneration.objects.values_list("holder_id", "state"))
    assert (states[dead], states[alive], states[elsewhere]) == ("terminated", "running", "running")
    assert "no longer exists" in ProcessGeneration.objects.get(holder_id=dead).termination_evidence
    permit = DispatchPermit.objects.get(holder__holder_id=dead)
    assert permit.state == "abandoned" and RemoteEffect.objects.get(pk=permit.effect_id).state == "prepared"
    assert set(DispatchPermit.objects.exclude(holder__holder_id=dead).values_list("state", flat=True)) == {"granted"}
    assert AuditRecord.objects.filter(action="holder_terminate", reason__contains="no longer exists").count() == 1

    settings.CONNECTOR = {**settings.CONNECTOR, "HOLDER_LIVENESS": 0}
    gone = f"{host}:{_dead_pid()}:0ff00000"
    author(account, root="order-off", record_id="roff", slot="push:records.push:off")
    acquire(gone, account)
    worker.effects_sweep()
    assert ProcessGeneration.objects.get(holder_id=gone).state == "running"
