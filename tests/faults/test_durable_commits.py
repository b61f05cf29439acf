"""Fault (issue 37, the durability half of "PostgreSQL `pg_ctl -m immediate stop`"): a 201 was answered for a
receipt that did not exist after the server came back, because the private server ran with fsync,
synchronous_commit and full_page_writes off and the product did not insist on durable commits.

Here a PRIVATE PostgreSQL is started the old way (all three off, tests/faults/servers.py PostgresServer with
`durable=False`) and real Django processes are pointed at it: under the product's settings their sessions commit
with synchronous_commit on whatever the server's default, and /readyz names the server's fsync and
full_page_writes; under production settings it answers 503. Only the test settings trade durability, explicitly.
scripts/services.py writes a durable configuration and turns an old non-durable one durable."""
from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time

import pytest

from scripts import services as svc
from tests.faults.servers import ROOT, PostgresServer, child_environment

PROBE = """
import json
import django
django.setup()
from django.db import connections
from django.test import Client
with connections["default"].cursor() as cursor:
    cursor.execute("SHOW synchronous_commit")
    session = cursor.fetchone()[0]
    cursor.execute("SELECT setting FROM pg_settings WHERE name = 'fsync'")
    fsync = cursor.fetchone()[0]
answer = Client().get("/readyz")
print(json.dumps({"session": session, "fsync": fsync, "status": answer.status_code,
                  "durable_commits": answer.json()["checks"]["durable_commits"]}))
"""


@pytest.fixture(scope="module")
def careless_server():
    """A private PostgreSQL configured as scripts/services.py used to configure make run's: fsync,
    full_page_writes and synchronous_commit off."""
    server = PostgresServer()
    try:
        yield server.start(durable=False)
    finally:
        server.cleanup()


def _probe(server: PostgresServer, settings_module: str, tmp_path, **extra: str) -> dict:
    env = child_environment(secret_dir=str(tmp_path), DATABASE_URL=server.url, JOURNAL_DATABASE_URL=server.journal_url,
                            DJANGO_SETTINGS_MODULE=settings_module, DJANGO_ALLOWED_HOSTS="testserver",
                            DJANGO_SECRET_KEY=secrets.token_urlsafe(64), CONNECTOR_METRICS_TOKEN="m" * 40,
                            DATABASE_ADMIN_URL="", DATABASE_ASSUME_ROLE="", **extra)
    if "CONNECTOR_DB_SYNCHRONOUS_COMMIT" not in extra:
        env.pop("CONNECTOR_DB_SYNCHRONOUS_COMMIT", None)
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_product_sessions_commit_durably_on_a_server_whose_default_is_not(careless_server, tmp_path):
    """The server's synchronous_commit default is off; a process under the product's settings (local, as make run
    runs it; production) commits with synchronous_commit on. /readyz names fsync off: production answers 503 with
    `durable_commits` failing, local reports the same finding and stays ready.
    Proves: issue 37 item 4"""
    with svc.pg_connect(careless_server.url) as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"
        assert conn.execute("SHOW fsync").fetchone()[0] == "off"

    production = _probe(careless_server, "config.django.production", tmp_path)
    assert production["session"] == "on", production
    assert production["status"] == 503, production
    assert production["durable_commits"]["status"] == "failing", production
    detail = production["durable_commits"]["detail"]
    assert "fsync off" in detail and "full_page_writes off" in detail, detail
    assert "synchronous_commit off" not in detail, detail  # the session's own setting is on

    local = _probe(careless_server, "config.django.local", tmp_path)
    assert local["session"] == "on", local
    assert local["durable_commits"]["status"] == "ok", local
    assert local["durable_commits"]["detail"].startswith("not durable: default fsync off"), local


def test_only_the_test_settings_trade_durability_and_production_refuses_to(careless_server, tmp_path):
    """config.django.test turns synchronous_commit off for its sessions (the suite's explicit trade); an explicit
    CONNECTOR_DB_SYNCHRONOUS_COMMIT overrides it; production refuses `off`.
    Proves: issue 37 item 4"""
    assert _probe(careless_server, "config.django.test", tmp_path)["session"] == "off"
    assert _probe(careless_server, "config.django.test", tmp_path, CONNECTOR_DB_SYNCHRONOUS_COMMIT="on")[
        "session"] == "on"
    env = child_environment(secret_dir=str(tmp_path), DATABASE_URL=careless_server.url,
                            DJANGO_SETTINGS_MODULE="config.django.production", DJANGO_ALLOWED_HOSTS="testserver",
                            DJANGO_SECRET_KEY=secrets.token_urlsafe(64), CONNECTOR_METRICS_TOKEN="m" * 40,
                            CONNECTOR_DB_SYNCHRONOUS_COMMIT="off")
    run = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode != 0 and "CONNECTOR_DB_SYNCHRONOUS_COMMIT=off is refused" in run.stderr, run.stderr


def test_services_writes_a_durable_private_server_and_turns_an_old_one_durable(tmp_path, monkeypatch):
    """scripts/services.py's private PostgreSQL (make run's) is configured with fsync, full_page_writes and
    synchronous_commit on; a cluster configured by an older checkout (all three off) is rewritten durable, and the
    rest of our section is kept.
    Proves: issue 37 item 4"""
    monkeypatch.setattr(svc, "PG_ROOT", tmp_path)
    server = svc.PrivatePostgres(5999)
    server.data.mkdir(parents=True)
    (server.data / "PG_VERSION").write_text("15\n")
    old = "\n".join(["#fsync = on  # the stock file's own commented default", "", svc.CONFIG_MARKER,
                     "listen_addresses = '127.0.0.1'", "port = 5999",
                     "# disposable development data: trade durability for speed",
                     "fsync = off", "synchronous_commit = off", "full_page_writes = off", ""])
    (server.data / "postgresql.conf").write_text(old)
    assert server.initialised and not server.durable
    assert server.make_durable() is True
    text = (server.data / "postgresql.conf").read_text()
    assert server.durable and server.make_durable() is False
    ours = text.partition(svc.CONFIG_MARKER)[2]
    for name in svc.DURABILITY_SETTINGS:
        assert f"\n{name} = on\n" in ours and f"{name} = off" not in ours, ours
    assert "port = 5999" in ours and text.startswith("#fsync = on")
    assert all(line.endswith("= on") for line in svc.durability_lines(True) if not line.startswith("#"))
    # a durable section someone turned one setting off in: rewritten once more, its comment not repeated
    (server.data / "postgresql.conf").write_text(text.replace("fsync = on", "fsync = off"))
    assert server.make_durable() is True and server.durable
    ours = (server.data / "postgresql.conf").read_text().partition(svc.CONFIG_MARKER)[2]
    assert ours.count(svc.durability_lines(True)[0]) == 1 and ours.count("fsync = on") == 1, ours


def _setting(url: str, name: str, want: str) -> str:
    """SHOW `name` on a new session until it reads `want` (pg_reload_conf signals the server; it applies the file
    a moment later) or 10 s pass."""
    deadline = time.monotonic() + 10
    while True:
        with svc.pg_connect(url) as conn:
            value = conn.execute(f"SHOW {name}").fetchone()[0]
        if value == want or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_ensure_makes_a_running_private_server_durable_and_only_the_test_suite_trades_it(careless_server):
    """`scripts/services.py ensure` turns our running private server durable (reload, no restart); `ensure --test`
    (make test) turns it non-durable, except while another database on it is in use (make run's): then it stays
    durable.
    Proves: issue 37 item 4"""
    plan = svc.Plan("postgres", careless_server.url, "the fault harness's private server")
    try:
        assert "made durable" in svc.reload_durable(plan)
        assert _setting(careless_server.url, "fsync", "on") == "on"
        assert _setting(careless_server.url, "full_page_writes", "on") == "on"
        assert "for the test suite" in svc.reload_durable(plan, durable=False)
        assert _setting(careless_server.url, "fsync", "off") == "off"
        svc.reload_durable(plan)
        with svc.pg_connect(careless_server.url, dbname="connector"):  # make run's sessions stand-in
            assert "kept durable" in svc.reload_durable(plan, durable=False)
            assert _setting(careless_server.url, "fsync", "on") == "on"
    finally:
        svc.reload_durable(plan, durable=False)  # as the other tests of this module expect it
    assert _setting(careless_server.url, "synchronous_commit", "off") == "off"


WRITER = """
import django
django.setup()
from django.db import connection, transaction
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE IF NOT EXISTS durability_probe (id bigserial PRIMARY KEY)")
    cursor.execute("SHOW synchronous_commit")
    print("synchronous_commit", cursor.fetchone()[0], flush=True)
while True:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT INTO durability_probe DEFAULT VALUES RETURNING id")
            committed = cursor.fetchone()[0]
    except Exception as exc:
        print("stopped", type(exc).__name__, flush=True)
        break
    print(committed, flush=True)  # the COMMIT has returned: the product would answer now
"""


def test_every_commit_answered_before_an_immediate_stop_exists_after_recovery(careless_server, tmp_path):
    """A process under make run's settings commits one row per transaction in a loop on the non-durable server and
    reports each id once its COMMIT returned (where the product answers 201); the server is stopped with
    `pg_ctl -m immediate` mid-loop and started again. Every reported id exists after recovery: with
    synchronous_commit on, the COMMIT waited for its WAL (before D-410 the session took the server's `off`, and the
    commits of the WAL writer's last interval were lost).
    Proves: issue 37 item 4"""
    env = child_environment(secret_dir=str(tmp_path), DATABASE_URL=careless_server.url,
                            JOURNAL_DATABASE_URL=careless_server.journal_url,
                            DJANGO_SETTINGS_MODULE="config.django.local")
    env.pop("CONNECTOR_DB_SYNCHRONOUS_COMMIT", None)
    writer = subprocess.Popen([sys.executable, "-c", WRITER], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    acknowledged, lines = [], []
    try:
        for line in writer.stdout:
            lines.append(line.strip())
            if line.strip().isdigit():
                acknowledged.append(int(line))
                if len(acknowledged) == 400:
                    careless_server.crash_and_restart()
            elif line.startswith("stopped") or len(lines) > 5000:
                break
    finally:
        writer.kill()
        writer.wait(timeout=30)
    assert lines[0] == "synchronous_commit on", lines[:3]
    assert len(acknowledged) >= 400, lines[-5:]
    with svc.pg_connect(careless_server.url, dbname="connector") as conn:
        present = {row[0] for row in conn.execute("SELECT id FROM durability_probe")}
        conn.execute("DROP TABLE durability_probe")
    lost = sorted(set(acknowledged) - present)
    print(f"\n{len(acknowledged)} commits acknowledged before the immediate stop, {len(lost)} lost")
    assert lost == [], f"{len(lost)} of {len(acknowledged)} acknowledged commits lost, e.g. {lost[:10]}"
