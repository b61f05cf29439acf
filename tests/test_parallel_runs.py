"""Two test suites at once on one machine (issue 37 item 9): each run has its own test databases and its own Redis
key space on the shared servers (D-451), concurrent role setup does not fail (D-452), and every deadline of the
suite is a condition awaited under a deadline stretched by the time factor (D-450)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
import redis
from django.conf import settings
from django.db import connections

from config.celery import app as celery_app
from connector import dbroles, tasks
from tests import isolation, support

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("import django; django.setup(); from django.conf import settings as s; "
         "print(s.DATABASES['default']['TEST']['NAME'], s.CONNECTOR_REDIS_KEY_PREFIX)")


def _other_run(**env: str) -> list[str]:
    """The test database name and Redis key prefix another pytest process of this checkout would use."""
    child = {k: v for k, v in os.environ.items() if k != "CONNECTOR_TEST_RUN"}
    child.update({"DJANGO_SETTINGS_MODULE": "config.django.test", "PYTHONPATH": str(ROOT), **env})
    out = subprocess.run([sys.executable, "-c", NAMES], cwd=ROOT, env=child, capture_output=True, text=True,
                         timeout=support.scaled(60), check=True)
    return out.stdout.split()


def test_each_run_has_its_own_test_databases_and_redis_keys():
    """This run's test databases end with its run id (checkout digest and pid), its Redis keys (Celery's through
    kombu's global_keyprefix, the wake-up debounce keys) begin with it; another process of the same checkout gets
    other names, and a run id set in the environment is taken as it is. Proves: issue 37 item 9"""
    run = settings.TEST_RUN
    assert os.environ["CONNECTOR_TEST_RUN"] == run  # exported: the web, workers and children share it
    for alias in ("default", "journal"):
        assert settings.DATABASES[alias]["TEST"]["NAME"].endswith("_" + run)
    prefix = settings.CONNECTOR_REDIS_KEY_PREFIX
    assert run in prefix and settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] == prefix
    assert celery_app.conf.broker_transport_options["global_keyprefix"] == prefix
    assert tasks._wake_key(7, 1).startswith(prefix)
    other_db, other_prefix = _other_run()
    assert other_db != settings.DATABASES["default"]["TEST"]["NAME"] and other_prefix != prefix
    fixed_db, fixed_prefix = _other_run(CONNECTOR_TEST_RUN="fixed_1")
    assert fixed_db.endswith("_fixed_1") and fixed_prefix == "connector-test-fixed_1:"


def test_two_runs_on_one_redis_neither_see_nor_block_each_others_keys(monkeypatch):
    """On the one Redis both runs use: a wake-up published by this run lands in this run's queue only, and the
    other run's debounce key for the same account pk does not swallow this run's wake-up. Proves: issue 37 item 9"""
    sent = []
    monkeypatch.setattr(tasks.materialize_due, "delay", lambda *args: sent.append(args))
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    mine = settings.CONNECTOR_REDIS_KEY_PREFIX
    other = "connector-test-otherrun_1:"
    pk = 987_654_321
    try:
        monkeypatch.setattr(settings, "CONNECTOR_REDIS_KEY_PREFIX", other)
        assert tasks.materialization_wake(pk) is True  # the other run woke its account `pk`
        monkeypatch.setattr(settings, "CONNECTOR_REDIS_KEY_PREFIX", mine)
        assert tasks.materialization_wake(pk) is True  # this run's account `pk` is woken all the same
        assert len(sent) == 2
    finally:
        client.delete(other + f"connector:wake:materialize:{pk}:0", mine + f"connector:wake:materialize:{pk}:0")

    queue = f"isolation-{os.getpid()}"
    with celery_app.connection_for_write() as conn:
        with conn.SimpleQueue(queue) as simple:
            simple.put({"run": "mine"})
            assert client.llen(mine + queue) == 1 and client.llen(queue) == 0
            assert simple.get(timeout=support.scaled(5)).payload == {"run": "mine"}
    client.delete(mine + queue)


def test_role_setup_from_several_runs_at_once_does_not_collide():
    """Four sessions set up the roles and a database's ownership at once, as two `make test` runs (two shards
    each) do at their start: none fails with "tuple concurrently updated". Proves: issue 37 item 9"""
    s = connections["default"].settings_dict
    params = {"host": s.get("HOST") or None, "port": s.get("PORT") or None, "user": s.get("USER") or None,
              "password": s.get("PASSWORD") or None}
    database = s["NAME"]
    errors: list[str] = []

    def setup() -> None:
        for _ in range(15):
            with psycopg.connect(**params, dbname="postgres", autocommit=True) as conn:
                try:
                    for statement in (*dbroles.roles_sql(), *dbroles.database_sql(database)):
                        conn.execute(statement)
                except psycopg.Error as exc:
                    errors.append(str(exc).splitlines()[0])

    threads = [threading.Thread(target=setup) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(support.scaled(120))
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_a_killed_runs_databases_are_recognised_and_live_ones_kept():
    """Only databases of this checkout whose pytest process is gone are dropped at the next run's start.
    Proves: issue 37 item 9"""
    checkout = settings.TEST_RUN.rsplit("_", 1)[0]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = [f"test_connector_{checkout}_{dead.pid}", f"test_connector_journal_shard1_{checkout}_{dead.pid}",
             f"test_connector_{checkout}_{os.getpid()}", f"test_connector_{checkout}_1",  # pid 1 lives
             f"test_connector_abcdef_{dead.pid}" if checkout != "abcdef" else "x", "connector"]
    assert isolation.abandoned(names, checkout) == names[:2]


def test_a_killed_runs_redis_keys_go_and_live_runs_keep_theirs():
    """At its start a run removes the Redis keys of this checkout's runs whose pytest process is gone; its own
    keys, a live run's and other checkouts' stay. Proves: issue 37 item 9"""
    checkout = settings.TEST_RUN.rsplit("_", 1)[0]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    keys = {"dead": f"connector-test-{checkout}_{dead.pid}:_kombu.binding.egress",
            "mine": settings.CONNECTOR_REDIS_KEY_PREFIX + "isolation-probe",
            "live": f"connector-test-{checkout}_1:isolation-probe",  # pid 1 lives
            "other": f"connector-test-{'abcdef' if checkout != 'abcdef' else '012345'}_{dead.pid}:isolation-probe"}
    try:
        for key in keys.values():
            client.set(key, b"1")
        assert isolation.drop_redis_keys(abandoned_only=True) >= 1
        assert {name: bool(client.exists(key)) for name, key in keys.items()} == {
            "dead": False, "mine": True, "live": True, "other": True}
    finally:
        client.delete(*keys.values())


def test_deadlines_stretch_with_the_factor_and_the_load(monkeypatch):
    """A deadline is its seconds times CONNECTOR_TEST_TIME_FACTOR times the load per core (at least 1, at most
    the cap, off with CONNECTOR_TEST_LOAD_SCALING=0); a condition that holds ends the wait at once, one that
    never holds fails naming what was awaited and the stretched deadline. Proves: issue 37 item 9"""
    cores = os.cpu_count() or 1
    monkeypatch.setenv(support.FACTOR_ENV, "3")
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 * cores, 0.0, 0.0))
    assert support.scaled(10) == pytest.approx(120)
    monkeypatch.setattr(os, "getloadavg", lambda: (100.0 * cores, 0.0, 0.0))
    assert support.scaled(10) == pytest.approx(30 * support.LOAD_FACTOR_CAP)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    assert support.scaled(10) == pytest.approx(30)
    monkeypatch.setenv(support.LOAD_SCALING_ENV, "0")
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 * cores, 0.0, 0.0))
    assert support.scaled(10) == pytest.approx(30)
    monkeypatch.setenv(support.FACTOR_ENV, "zero")
    with pytest.raises(ValueError, match=support.FACTOR_ENV):
        support.scaled(1)

    monkeypatch.setenv(support.FACTOR_ENV, "0.01")
    calls = []
    assert support.wait_for(lambda: calls.append(1) or len(calls) >= 3, 60, "three calls", interval=0) is True
    with pytest.raises(AssertionError, match=r"never: not within 0\.1 s \(10 s x time factor 0\.01\)"):
        support.wait_for(lambda: False, 10, "never")


def test_the_per_test_timeout_is_stretched_too(request):
    """pytest-timeout's limit for this test is the configured one stretched by the time factor when it started.
    Proves: issue 37 item 9"""
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args[0] >= float(request.config.getini("timeout"))
