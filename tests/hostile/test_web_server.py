"""The web process of `make run` (gunicorn with config/gunicorn.py, the `web_server` fixture) over real HTTP:
the padded-key rule, a burst of 64 concurrent clients, the offline API docs and static files, the development
flag, and the production settings under the same server. Oversized heads and bodies: test_oversized.py."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest

from connector.models import ReceiptAdmissionKey
from scripts import run as run_script
from tests.concurrency import run_concurrently
from tests.faults.servers import (
    ROOT,
    child_environment,
    free_port,
    manage,
    run_database_env,
    wait_http,
    web_child,
)
from tests.hostile.support import build_api_world, delivery, row_counts
from tests.support import scaled

ADMIT = "/api/v2/accounts/{account}/channels/records.webhook/receipts"
TRANSACTIONAL = {"transaction": True, "databases": ["default", "journal"]}


def _exchange(port: int, request: bytes, timeout: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def _code(raw: bytes) -> str | None:
    """The catalog code of a JSON error answer, None for any other answer."""
    try:
        return json.loads(raw.partition(b"\r\n\r\n")[2]).get("code")
    except (ValueError, AttributeError):
        return None


@pytest.mark.django_db(**TRANSACTIONAL)
def test_a_padded_idempotency_key_is_refused_over_http_never_trimmed(web_server, settings):
    """Over real HTTP to the web process of `make run`, a signed delivery whose Idempotency-Key carries whitespace
    beyond the field's one conventional space (`Idempotency-Key:  k `, a trailing SP, a leading HTAB) is refused
    400 NONCANONICAL_KEY and writes nothing; the same key unpadded, with or without that space, is admitted (201).
    gunicorn strips header values; the worker passes the raw value (decision D-160).
    Proves: CV2-01-004, CV2-01-029"""
    settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": web_server.secret_dir}
    world = build_api_world("pad-")
    path = ADMIT.format(account=world.account_key).encode()

    def admit(key_field: bytes, n: int) -> bytes:
        body = delivery(n)
        return _exchange(web_server.port, b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                         b"Content-Type: application/json\r\n" + key_field + b"\r\nConnector-Signature: "
                         + world.sign(body, int(time.time())).encode() + b"\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    before = row_counts()
    for n, field in enumerate([b"Idempotency-Key:  pad-1 ", b"Idempotency-Key: pad-1 ", b"Idempotency-Key:  pad-1",
                               b"Idempotency-Key:\tpad-1", b"Idempotency-Key: pad-1\t"], start=1):
        answer = admit(field, n)
        assert (_status(answer), _code(answer)) == (400, "NONCANONICAL_KEY"), (field, answer[:400])
    assert row_counts() == before

    assert _status(admit(b"Idempotency-Key: pad-1", 10)) == 201
    assert _status(admit(b"Idempotency-Key:pad-2", 11)) == 201
    assert set(ReceiptAdmissionKey.objects.filter(transport_key__startswith="pad-")
               .values_list("transport_key", flat=True)) == {"pad-1", "pad-2"}


def _listen_backlog(port: int) -> int | None:
    """The listen backlog of the socket on 127.0.0.1:`port` (ss's Send-Q of a listener), None without `ss`."""
    if shutil.which("ss") is None:
        return None
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return int(out.split()[2])


@pytest.mark.django_db
def test_64_concurrent_clients_are_all_answered_without_a_dropped_connection(web_server):
    """64 clients open their connections to the web process of `make run` at the same instant and each sends a
    request: every one gets its answer (the app's 404 ACCOUNT_NOT_FOUND), none is reset or refused, and none waits
    for a SYN retransmission (a connect of 1 s or more: the kernel's first retransmission timeout, what a listen
    queue that overflowed costs; runserver's backlog of 10 makes most of them wait). The listener's backlog is at
    least 64."""
    n = 64
    request = (b"POST " + ADMIT.format(account="nobody").encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Connection: close\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}")

    def client() -> tuple[str, float]:
        began = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", web_server.port), timeout=scaled(60)) as sock:
                connected = time.monotonic() - began
                sock.sendall(request)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            return (f"{_status(answer)} {_code(answer) or repr(answer[:80])}", connected)
        except OSError as exc:
            return (f"{type(exc).__name__}: {exc}", time.monotonic() - began)

    results = run_concurrently([client] * n)
    outcomes = Counter(outcome for outcome, _ in results)
    assert outcomes == {"404 ACCOUNT_NOT_FOUND": n}, outcomes
    slow = sorted(round(seconds, 2) for _, seconds in results if seconds >= 1.0)
    assert not slow, f"{len(slow)} of {n} connections waited for a SYN retransmission: {slow}"
    backlog = _listen_backlog(web_server.port)
    assert backlog is None or backlog >= n, backlog


@pytest.mark.django_db
def test_api_docs_reference_only_this_server_and_every_asset_is_served(web_server):
    """/api/docs/ under the web process of `make run` names no other host (no CDN, no web fonts): Redoc comes from
    the installed drf-spectacular-sidecar package and is served from STATIC_URL with the schema; the admin's and
    the operator screens' stylesheets are served too (WhiteNoise, after collectstatic)."""
    base = f"http://127.0.0.1:{web_server.port}"
    with httpx.Client(base_url=base, timeout=scaled(30)) as client:
        docs = client.get("/api/docs/")
        assert docs.status_code == 200, docs.text[:300]
        assert "://" not in docs.text, re.findall(r"\S*://\S*", docs.text)
        refs = re.findall(r'(?:src|href|spec-url)="([^"]+)"', docs.text)
        assert any(ref.endswith("redoc.standalone.js") for ref in refs), refs
        for ref in refs:
            assert ref.startswith("/") and not ref.startswith("//"), ref
            asset = client.get(ref)
            assert asset.status_code == 200 and asset.content, (ref, asset.status_code)

        for page in ("/admin/login/", "/"):
            screen = client.get(page, follow_redirects=True)
            assert screen.status_code == 200, (page, screen.status_code)
            sheets = re.findall(r'<link[^>]+rel="stylesheet"[^>]+href="([^"]+)"', screen.text) + \
                re.findall(r'<link[^>]+href="([^"]+)"[^>]+rel="stylesheet"', screen.text)
            assert sheets or page == "/", (page, screen.text[:500])
            for sheet in sheets:
                css = client.get(sheet)
                assert css.status_code == 200 and css.headers["content-type"].startswith("text/css"), sheet


def test_make_run_serves_gunicorn_and_runserver_only_behind_the_dev_flag():
    """scripts/run.py's web child is gunicorn with config/gunicorn.py; `--dev` or RUN_DEV_SERVER=1 selects
    Django's runserver; any other argument is refused."""
    assert run_script.web_command(8123)[1:] == ["-m", "gunicorn", "-c", "python:config.gunicorn", "--bind",
                                                "127.0.0.1:8123"]
    assert run_script.web_command(8123, dev=True)[1:4] == ["manage.py", "runserver", "127.0.0.1:8123"]
    assert dict(run_script.children(8123))["web"] == run_script.web_command(8123)
    assert not run_script.dev_server_requested([], {})
    assert not run_script.dev_server_requested([], {"RUN_DEV_SERVER": "0"})
    assert run_script.dev_server_requested(["--dev"], {})
    assert run_script.dev_server_requested([], {"RUN_DEV_SERVER": "1"})
    refused = subprocess.run([sys.executable, "scripts/run.py", "--prod"], cwd=ROOT, capture_output=True, text=True,
                             timeout=scaled(30))
    assert refused.returncode == 2 and "--dev" in refused.stderr


def test_web_processes_default_to_one_per_core_plus_one():
    """config/gunicorn.py sizes the web process to the machine: cores + 1 gthread processes of 4 threads each
    (D-360, measured by `bench burst`'s busy CPU per event); WEB_CONCURRENCY and WEB_THREADS still override."""
    from config.gunicorn import default_workers

    assert [default_workers(cores) for cores in (1, 2, 8)] == [2, 3, 9]
    probe = "import os, config.gunicorn as g; print(g.workers, g.threads, len(os.sched_getaffinity(0)))"
    env = {k: v for k, v in os.environ.items() if k not in ("WEB_CONCURRENCY", "WEB_THREADS")}
    probed = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, check=True, capture_output=True,
                            text=True, timeout=scaled(60))
    workers, threads, cores = map(int, probed.stdout.split())
    assert (workers, threads) == (cores + 1, 4)
    told = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "WEB_CONCURRENCY": "7",
                                                                         "WEB_THREADS": "2"},
                          check=True, capture_output=True, text=True, timeout=scaled(60)).stdout.split()
    assert told[:2] == ["7", "2"]


@pytest.mark.django_db
def test_production_settings_are_served_by_the_same_gunicorn_config(tmp_path):
    """config.django.production under `gunicorn -c python:config.gunicorn` (DEBUG off), as behind a TLS proxy: the
    workers boot, the API answers with its catalog, and the admin's static files are served from the collected
    STATIC_ROOT."""
    env = child_environment(secret_dir=str(tmp_path / "secrets"), REDIS_URL="redis://127.0.0.1:1/0",
                            DJANGO_STATIC_ROOT=str(tmp_path / "static"), DJANGO_SETTINGS_MODULE="config.django.production",
                            DJANGO_SECRET_KEY="production-test-" + "k" * 48, DJANGO_ALLOWED_HOSTS="127.0.0.1",
                            CONNECTOR_METRICS_TOKEN="production-metrics-" + "t" * 32,
                            WEB_CONCURRENCY="1", WEB_THREADS="2",
                            **run_database_env())
    collected = manage(env, "collectstatic", "--noinput", "-v", "0")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    port = free_port()
    web = web_child(env, port, tmp_path).start()
    try:
        wait_http(port, 90, web.proc)
        # As behind a TLS-terminating proxy on this host (gunicorn trusts X-Forwarded-Proto from 127.0.0.1).
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=scaled(30),
                          headers={"X-Forwarded-Proto": "https"}) as client:
            api = client.post(ADMIT.format(account="nobody"), content=b"{}", headers={"Idempotency-Key": "k"})
            assert (api.status_code, api.json()["code"]) == (404, "ACCOUNT_NOT_FOUND"), api.text[:300]
            css = client.get("/static/admin/css/base.css")
            assert css.status_code == 200 and css.headers["content-type"].startswith("text/css"), css.status_code
        assert web.proc.poll() is None, web.output()
    finally:
        web.stop()
