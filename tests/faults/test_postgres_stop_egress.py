"""Fault: PostgreSQL stops (`pg_ctl stop -m immediate`, a crash) while the egress process holds answers (issue 37,
the table's second row, half (b); item 3).

A PRIVATE PostgreSQL (scripts/services.py, a spare loopback port; the machine's server is never touched) holds the
demo push world and six authored effects. A real egress process runs what the beat's sweeper and the egress worker
run (`worker.effects_sweep` finds due effects, `tasks.effect_dispatch`'s body dispatches a batch; a step that fails
is logged and the next tick runs, as Celery would). The loopback receiver answers each request after 1 s. When its
first request arrives the test crash-stops PostgreSQL: the receiver applies and answers every request while the
database is down, so the process holds answers it cannot settle. After 10 s the server starts again. Within 60 s
every effect is finalized, uncertain with its abandonment evidence, or `prepared` on its retry schedule: none is
left `dispatching` and no permit stays open under a running holder; each key was applied at most once, and a key
applied is never left to be sent again blindly.

The egress process commits durably (`PGOPTIONS=-c synchronous_commit=on`): the private server's default
(`synchronous_commit = off`, scripts/services.py) loses the last commits in a crash, and a lost `sending` marker
makes an applied request look unsent; that is issue 37 item 4 (the (a) half of the row), not this test's subject."""
from __future__ import annotations

import subprocess
import sys
import time

import psycopg
import pytest

from tests.effects.receiver import Receiver
from tests.faults.servers import ROOT, Child, PostgresServer, child_environment
from tests.faults.test_postgres_restart import MIGRATE

EFFECTS = 6
BOUND_SECONDS = 60

SETUP = """
import django
django.setup()
from connector import demo
demo.CALLOUT_DEFINITION = {**demo.CALLOUT_DEFINITION, "retry": {"schedule_seconds": [1, 2, 2, 2, 2, 2, 2, 2]}}
from tests.effects.helpers import author
account = demo.build_world("pe-", push=True).accounts[0]
for i in range(%d):
    author(account, root=f"o-{i}", record_id=f"r{i}")
print(account.pk)
""" % EFFECTS

EGRESS = """
import logging, time
import django
django.setup()
from effects import tasks
from effects.services import worker
while True:
    try:
        if worker.effects_sweep()["claimable"]:
            tasks.effect_dispatch()
    except Exception as exc:  # as a Celery task failing: logged, the next beat tick runs again
        logging.getLogger("egress-loop").warning("step failed: %s: %s", type(exc).__name__, exc)
        from django.db import connection
        connection.close()
    time.sleep(0.2)
"""


def _rows(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
        return conn.execute(sql).fetchall()


@pytest.fixture
def private_pg(tmp_path):
    server = PostgresServer()
    try:
        server.start()
        env = child_environment(secret_dir=str(tmp_path / "secrets"), DATABASE_URL=server.url,
                                JOURNAL_DATABASE_URL=server.journal_url, REDIS_URL="redis://127.0.0.1:1/0")
        migrations = [subprocess.Popen([sys.executable, "-c", MIGRATE, db], cwd=ROOT, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                      for db in ("default", "journal")]
        for migration in migrations:
            out, _ = migration.communicate(timeout=240)
            assert migration.returncode == 0, out.decode(errors="replace")[-3000:]
        setup = subprocess.run([sys.executable, "-c", SETUP], cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=120, check=False)
        assert setup.returncode == 0, setup.stderr[-3000:]
        yield server, env
    finally:
        server.cleanup()


@pytest.mark.slow
def test_postgres_crash_while_egress_holds_answers_strands_nothing(private_pg, tmp_path):
    """Proves: issue 37 item 3"""
    server, env = private_pg
    receiver = Receiver().start()
    receiver.service_seconds = 1.0
    egress = Child("egress", [sys.executable, "-c", EGRESS],
                   dict(env, CONNECTOR_EGRESS_BASE_URL=receiver.url, CONNECTOR_EGRESS_TIMEOUT_SECONDS="5",
                        # The product's own durable commits (D-410): the test settings trade them away for the
                        # suite's speed, and a sending marker lost in the crash would prove "never sent" wrongly.
                        CONNECTOR_DB_SYNCHRONOUS_COMMIT="on"),
                   tmp_path).start()
    try:
        deadline = time.monotonic() + 60
        while not receiver.requests:
            assert egress.proc.poll() is None and time.monotonic() < deadline, egress.output()
            time.sleep(0.02)
        server.crash_stop()
        assert not [r for r in receiver.requests if r["answered_at"] is not None], "answered before the crash"
        time.sleep(10)
        server.start_again()
        back = time.monotonic()
        while True:
            states = dict(_rows(server.url, "SELECT state, count(*) FROM effects_remoteeffect GROUP BY state"))
            open_permits = _rows(server.url, "SELECT p.id FROM effects_dispatchpermit p JOIN "
                                             "effects_processgeneration h ON h.id = p.holder_id WHERE p.state IN "
                                             "('granted', 'sending') AND h.state = 'running'")
            if not states.get("dispatching") and not open_permits and sum(states.values()) == EFFECTS:
                break
            assert time.monotonic() - back < BOUND_SECONDS, (states, open_permits, egress.output())
            time.sleep(0.5)
        settled_in = time.monotonic() - back
    finally:
        egress.stop()
        receiver.stop()

    effects = _rows(server.url, "SELECT e.id, e.state, e.next_attempt_at, c.provider_idempotency_key FROM "
                                "effects_remoteeffect e JOIN effects_outboundcommand c ON c.id = e.command_id")
    applied = set(receiver.applied)
    assert set(receiver.applied.values()) <= {1}  # no key applied twice
    for pk, state, next_attempt_at, key in effects:
        assert state in ("finalized", "uncertain", "prepared", "remote_confirmed"), (pk, state)
        if state == "uncertain":  # with its reason: the abandonment evidence of the given-up generation
            proof, = _rows(server.url, f"SELECT abandonment_proof FROM effects_dispatchpermit WHERE effect_id = {pk} "
                                       "AND state = 'abandoned'")[-1]
            assert "gave up its generation" in proof, proof
        if state == "prepared":  # retrying (on its schedule, or its granted permit abandoned): never applied
            attempts = _rows(server.url, "SELECT a.ordinal, a.outcome, a.response_status, a.evidence, p.state, "
                                         f"p.abandonment_proof FROM effects_remoteeffectattempt a LEFT JOIN "
                                         f"effects_dispatchpermit p ON p.attempt_id = a.id WHERE a.effect_id = {pk}")
            assert key not in applied, (pk, key, next_attempt_at, attempts, egress.output()[-4000:])
    log = egress.output()
    assert "not written" in log, log  # the held answers' settlements were tried again until they landed
    print(f"\nafter PostgreSQL was back: settled in {settled_in:.1f}s; states "
          f"{dict(_rows(server.url, 'SELECT state, count(*) FROM effects_remoteeffect GROUP BY state'))}")
