"""Fault: PostgreSQL restarts (`pg_ctl restart -m fast`) while a client process admits deliveries in a loop.

A PRIVATE PostgreSQL is started through scripts/services.py on a spare loopback port (the machine's server is
never touched) and migrated by `migrate` in child processes. A load child posts signed deliveries
through the WSGI application (a real request cycle: the connection is kept between requests and health-checked
at the first query of each, as in production, D-198) and retries each key until it is answered 2xx. Meanwhile the test restarts the server. The client sees only
retryable server errors during the restart (503 DATABASE_UNAVAILABLE with Retry-After; see
test_database_outage_answers_a_retryable_503, a product finding), never a 4xx or a partial admission; afterwards
every key has exactly one Receipt (a retry of a key whose commit landed before the connection died resolves as
`duplicate`), check_invariants passes, and the sweep materializes every receipt once."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter, defaultdict

import psycopg
import pytest

from tests.faults.servers import ROOT, Child, PostgresServer, check_invariants, child_environment
from tests.support import scaled, wait_for

KEYS = 150

SETUP = """
import django
django.setup()
from connector.demo import build_world
world = build_world("pg-")
print(world.accounts[0].account_key)
"""

LOAD = r"""
import io, json, os, sys, time
import django
django.setup()
from django.core.wsgi import get_wsgi_application
from connector import tasks
from connector.models import CredentialGeneration
from connector.secrets import secret_backend
from connector.services.signatures import sign
from tests.support import deadline as retry_deadline

tasks.materialization_wake = lambda account_id, slot=0: False  # the broker is not under test here
account, keys = os.environ["LOAD_ACCOUNT"], int(os.environ["LOAD_KEYS"])
generation = CredentialGeneration.objects.get(generation_id=f"{account}.webhook-signing.g1")
secret = secret_backend().read(generation.secret_version_ref)
app = get_wsgi_application()
path = f"/api/v2/accounts/{account}/channels/records.webhook/receipts"

def post(key, body):
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "80",
               "HTTP_HOST": "127.0.0.1", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body),
               "wsgi.errors": sys.stderr, "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
               "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_IDEMPOTENCY_KEY": key,
               "HTTP_CONNECTOR_SIGNATURE": sign(secret, int(time.time()), body)}
    status = []
    data = b"".join(app(environ, lambda s, h, exc_info=None: status.append(s)))
    return int(status[0].split()[0]), json.loads(data)

for i in range(keys):
    body = json.dumps({"events": [{"id": f"pg-ev-{i}", "type": "record.updated", "record_id": f"pg-r-{i}",
                                   "sequence": 1, "occurred_at": "2026-01-01T00:00:00Z",
                                   "data": {"name": f"Load {i}", "email": f"l{i}@example.com"}}]}).encode()
    retrying, attempt = retry_deadline(30), 0
    while True:
        attempt += 1
        began = time.monotonic()
        try:
            status, data = post(f"pg-{i}", body)
            code = data.get("code") or data.get("admission")
        except Exception as exc:  # an exception escaping the WSGI app (would be a 500 from the server)
            status, code = None, type(exc).__name__
        print(json.dumps({"key": f"pg-{i}", "attempt": attempt, "status": status, "code": code,
                          "ms": round((time.monotonic() - began) * 1000, 1), "at": time.time()}), flush=True)
        if status in (200, 201) or retrying.passed():
            break
        time.sleep(0.05)
"""

# `manage.py migrate` with the test harness's cheaper historical models (tests/fast_migrate.py)
MIGRATE = """
import sys
import django
django.setup()
from django.core.management import call_command
from tests import fast_migrate
fast_migrate.install()
call_command("migrate", database=sys.argv[1], interactive=False, verbosity=0)
"""

SWEEP = """
import django
django.setup()
from connector.services.sweeper import inbound_sweep
print(inbound_sweep(grace_seconds=0, limit=1000).materialized)
"""


@pytest.fixture(scope="module")
def private_pg(tmp_path_factory):
    """A private, migrated PostgreSQL holding the demo world; yields (server, child environment, account key)."""
    began = time.monotonic()
    server = PostgresServer()
    try:
        server.start()
        secrets = tmp_path_factory.mktemp("pg-secrets")
        env = child_environment(secret_dir=str(secrets), DATABASE_URL=server.url,
                                JOURNAL_DATABASE_URL=server.journal_url, REDIS_URL="redis://127.0.0.1:1/0")
        migrations = [subprocess.Popen([sys.executable, "-c", MIGRATE, db],
                                       cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                      for db in ("default", "journal")]
        for migration in migrations:
            out, _ = migration.communicate(timeout=scaled(180))
            assert migration.returncode == 0, out.decode(errors="replace")[-3000:]
        setup = subprocess.run([sys.executable, "-c", SETUP], cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=scaled(120), check=False)
        assert setup.returncode == 0, setup.stderr[-3000:]
        account = setup.stdout.strip().splitlines()[-1]
        print(f"\nprivate PostgreSQL on port {server.port}: initdb + start + migrate + world "
              f"{time.monotonic() - began:.1f}s")
        yield server, env, account
    finally:
        server.cleanup()


@pytest.mark.slow
def test_postgres_restart_during_admission_load(private_pg, tmp_path):
    server, env, account = private_pg
    load = Child("load", [sys.executable, "-c", LOAD], dict(env, LOAD_ACCOUNT=account, LOAD_KEYS=str(KEYS)),
                 tmp_path).start()
    try:
        wait_for(lambda: load.logs[-1].read_text(errors="replace").count('"status": 201') >= 30, 60,
                 f"30 admissions answered 201 (load flowing):\n{load.output()}", proc=load.proc)
        restart_seconds = server.restart()
        assert load.wait(120) == 0, load.output()
    finally:
        load.stop()

    lines = load.logs[-1].read_text().splitlines()
    attempts = [json.loads(line) for line in lines if line.startswith('{"key": ')]  # not the JSON log records
    final = {a["key"]: a for a in attempts}  # the last attempt of each key
    assert sorted(final) == sorted(f"pg-{i}" for i in range(KEYS))
    assert all(a["status"] in (200, 201) for a in final.values()), [a for a in final.values()
                                                                     if a["status"] not in (200, 201)]
    failed = [a for a in attempts if a["status"] not in (200, 201)]
    assert failed, "no request hit the restart window"
    assert {(a["status"], a["code"]) for a in failed} <= {(503, "DATABASE_UNAVAILABLE"), (503, "GATE_NOT_SERVING"),
                                                          (503, "OWNER_UNAVAILABLE")}, Counter(
        (a["status"], a["code"]) for a in failed)
    retried = {a["key"] for a in failed}
    outcomes = Counter(final[k]["code"] for k in retried)  # "created", or "duplicate" if the lost answer committed

    with psycopg.connect(server.url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
        per_key = dict(conn.execute(
            "SELECT k.transport_key, count(r.id) FROM connector_receiptadmissionkey k "
            "LEFT JOIN connector_receipt r ON r.id = k.receipt_id GROUP BY k.transport_key").fetchall())
        receipts, due = conn.execute("SELECT (SELECT count(*) FROM connector_receipt), "
                                     "(SELECT count(*) FROM connector_materializationdue)").fetchone()
    assert per_key == {f"pg-{i}": 1 for i in range(KEYS)}
    assert receipts == KEYS and due == KEYS
    report = check_invariants(env)
    assert report["ok"], report

    sweep = subprocess.run([sys.executable, "-c", SWEEP], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=scaled(120), check=False)
    assert sweep.returncode == 0 and sweep.stdout.split()[-1] == str(KEYS), sweep.stderr[-3000:]
    with psycopg.connect(server.url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM connector_event").fetchone()[0] == KEYS
    assert check_invariants(env)["ok"]

    errors_by_key = defaultdict(int)
    for a in failed:
        errors_by_key[a["key"]] += 1
    print(f"restart took {restart_seconds:.2f}s; {len(failed)} failed attempts over {len(retried)} keys "
          f"(max {max(errors_by_key.values())} per key, {dict(Counter((a['status'], a['code']) for a in failed))}), "
          f"outage seen by the client {max(a['at'] for a in failed) - min(a['at'] for a in failed) + 0.05:.2f}s; "
          f"final outcomes of retried keys {dict(outcomes)}; {len(attempts)} attempts for {KEYS} keys")


def test_database_outage_answers_a_retryable_503(monkeypatch):
    from django.db import OperationalError
    from django.test import Client

    from connector.api import views
    from connector.api.exceptions import API_ERROR_CODES

    def unreachable(account_key):
        raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")

    monkeypatch.setattr(views, "admission_hint_get", unreachable)  # the admission view's first database read
    response = Client(raise_request_exception=False).post(
        "/api/v2/accounts/acme/channels/records.webhook/receipts", data=b"{}", content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k-1", HTTP_CONNECTOR_SIGNATURE="t=1,v1=00")
    body = response.json()
    assert body["code"] in API_ERROR_CODES and set(body) == {"code", "detail"}
    assert response.status_code == 503, (response.status_code, body)
    assert response.has_header("Retry-After")
