"""Issue 37's row "worker SIGKILL mid-burst" on the deployable processes (the process harness of
tests/crash/test_process_harness.py): a real Celery worker (`celery -A config worker -Q claims,sweeper,egress`)
against a private Redis runs the egress task over a burst of three effects and dies by SIGKILL after the receiver
applied all three, before their settlement committed. The supervisor isolates the dead generation with the real
command (`manage.py holders terminate HOLDER --evidence ... --abandon`): the three effects are `uncertain`. A
restarted worker is then sent `effects.tasks.uncertain_sweep` as beat would (`sweeper-uncertain`), and the
product does the rest through Redis and PostgreSQL: under the callout's frozen idempotency contract each effect is
repeated under its key and finalized, one application per key, no person; `manage.py check_invariants` passes."""
from __future__ import annotations

import time
from collections import Counter

import pytest

from connector.demo import build_world
from effects.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt
from tests.crash.support import DB
from tests.crash.test_process_harness import (  # noqa: F401 - fixtures
    KILLED,
    _send,
    _worker,
    children,
    env,
    receiver,
    redis_server,
)
from tests.effects.helpers import author
from tests.faults.servers import check_invariants, manage
from tests.support import wait_for

pytestmark = pytest.mark.django_db(**DB)
CONTRACT = {"key_header": "Idempotency-Key", "guarantee": "byte_identical_repeat_is_one_effect",
            "retention_seconds": 86400, "automatic_repeats": 3, "repeat_backoff_seconds": 1}


def test_a_killed_celery_worker_s_effects_are_repeated_by_the_uncertain_sweep_and_land_once(
        env, children, tmp_path, redis_server, receiver):
    """The egress task's worker is SIGKILLed at "dispatch.batch_settle_before_commit" (three requests applied, no
    settlement); `manage.py holders terminate --abandon` makes the three effects `uncertain`; a restarted worker
    receives `effects.tasks.uncertain_sweep` (beat's message) until the backoff has passed: the sweep prepares the
    three, wakes the egress through Redis, and the worker sends each request again under its key and finalizes
    it. Two requests per key, one application each; Attempt 1 of each stays `uncertain`; check_invariants passes.
    Proves: issue 37 item 2"""
    account = build_world("up-", push=True, idempotency_contract=CONTRACT).accounts[0]
    commands = [author(account, root=f"order-{i}", record_id=f"r{i}") for i in range(3)]
    keys = [c.provider_idempotency_key for c in commands]

    worker = _worker(env, tmp_path, "dispatch.batch_settle_before_commit")
    children.append(worker.start())
    _send(redis_server.url, "effects.tasks.effect_dispatch", "egress")
    assert worker.wait(60) == KILLED, worker.output()
    assert receiver.applied == {key: 1 for key in keys}
    holders = set(DispatchPermit.objects.filter(state="sending").values_list("holder__holder_id", flat=True))
    assert len(holders) == 1 and DispatchPermit.objects.filter(state="sending").count() == 3

    holder, = holders
    isolated = manage(env, "holders", "terminate", holder, "--abandon",
                      "--evidence", f"supervisor: worker pid exited by SIGKILL (returncode {worker.proc.returncode})")
    assert isolated.returncode == 0, isolated.stderr
    assert isolated.stdout.count("is uncertain") == 3, isolated.stdout
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {"uncertain"}

    restarted = _worker(env, tmp_path, None)
    children.append(restarted.start())

    sent = [0.0]

    def landed() -> bool:
        if set(RemoteEffect.objects.values_list("state", flat=True)) == {"finalized"}:
            return True
        if time.monotonic() - sent[0] >= 1.0:  # beat's job (every 5 s in make run), here every second
            _send(redis_server.url, "effects.tasks.uncertain_sweep", "sweeper")
            sent[0] = time.monotonic()
        return False

    wait_for(landed, 90, "the uncertain sweep and the egress to land the three effects")
    assert Counter(r["key"] for r in receiver.requests) == {key: 2 for key in keys}
    assert receiver.applied == {key: 1 for key in keys}
    for effect in RemoteEffect.objects.all():
        assert list(RemoteEffectAttempt.objects.filter(effect=effect).order_by("ordinal")
                    .values_list("outcome", flat=True)) == ["uncertain", "remote_confirmed"]
    report = check_invariants(env)
    assert report["ok"], report
    assert restarted.proc.poll() is None, restarted.output()
