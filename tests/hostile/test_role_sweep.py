"""A sweep of every screen and API endpoint of every role, as a new user meets them on a fresh `make run` (issue 36):
the demo world loaded by `manage.py demo_load` into this run's databases as the application role, the real web
process of `make run` (gunicorn, the `web_server` fixture) connected as the application role, and each demo person
making one failed sign-in first. Nothing may answer 500: no screen, no admin page, no API operation."""
from __future__ import annotations

import base64
import json
import re
import time
from collections import deque
from urllib.parse import urldefrag, urljoin, urlsplit

import httpx
import pytest

from tests.faults.servers import child_environment, manage, run_database_env
from tests.hostile.test_sign_in_lockout import sign_in

PASSWORD = "demo-sweep-password-1"
# One person per role of the demo (connector/management/commands/demo_load.py), the superuser included.
PEOPLE = {"operator": "superuser", "ann": "auditor", "oscar": "operator", "alma": "approver", "cid": "certifier"}
SKIP = re.compile(r"^/(static/|accounts/logout/|admin/logout/|api/)")
MAX_PAGES = 400


def _shape(url: str) -> str:
    """One visit per URL shape: ids become N, the query is dropped (the admin's sort and filter links of a list
    are the list again)."""
    return re.sub(r"/\d+/", "/N/", urlsplit(url).path)


def crawl(client: httpx.Client, starts: list[str]) -> dict[str, int]:
    """Follow every same-origin link from `starts` (GET only), one page per URL shape; {url: status}."""
    seen, answers, queue = set(), {}, deque(starts)
    while queue and len(answers) < MAX_PAGES:
        url = queue.popleft()
        if _shape(url) in seen:
            continue
        seen.add(_shape(url))
        response = client.get(url)
        answers[url] = response.status_code
        if response.status_code != 200 or "text/html" not in response.headers.get("content-type", ""):
            continue
        for href in re.findall(r'href="([^"#][^"]*)"', response.text):
            target = urldefrag(urljoin(url, href.replace("&amp;", "&")))[0]
            parts = urlsplit(target)
            if parts.netloc and parts.netloc != urlsplit(str(client.base_url)).netloc:
                continue
            local = parts.path + ("?" + parts.query if parts.query else "")
            if local.startswith("/") and not SKIP.match(local):
                queue.append(local)
    return answers


def api_operations(schema: dict, values: dict[str, str]) -> list[tuple[str, str]]:
    """(method, path) of every operation of the OpenAPI schema, its path parameters filled from `values`."""
    operations = []
    for path, item in schema["paths"].items():
        filled = re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "1"), path)
        operations += [(method.upper(), filled) for method in item if method in ("get", "post", "put", "patch",
                                                                              "delete")]
    return operations


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_every_screen_and_api_endpoint_of_every_role_answers_without_a_500(web_server, settings):
    """Proves: issue 36 (the sweep: one failed attempt, then every screen and API endpoint of every role as the
    application role, no 500)."""
    env = child_environment(secret_dir=web_server.secret_dir, **run_database_env())
    loaded = manage(env, "demo_load", "--password", PASSWORD, timeout=600)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr

    settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": web_server.secret_dir}
    from connector.models import CredentialGeneration
    from connector.secrets import secret_backend
    from connector.services.signatures import sign

    secret = secret_backend().read(CredentialGeneration.objects.get(
        generation_id="acme-eu.webhook-signing.g1").secret_version_ref)
    body = json.dumps({"events": [{"id": "sweep-1", "type": "record.updated", "record_id": "sweep-r", "sequence": 1,
                                   "occurred_at": "2026-12-01T00:00:00Z",
                                   "data": {"name": "Sweep", "email": "sweep@example.com"}}]}).encode()
    base = f"http://127.0.0.1:{web_server.port}"
    admitted = httpx.post(f"{base}/api/v2/accounts/acme-eu/channels/records.webhook/receipts", content=body,
                          headers={"Idempotency-Key": "sweep-key-1",
                                   "Connector-Signature": sign(secret, int(time.time()), body)}, timeout=30)
    assert admitted.status_code == 201, admitted.text
    values = {"account": "acme-eu", "channel": "records.webhook", "receipt_id": str(admitted.json()["receipt"]),
              "request_id": "no-such-request"}
    schema = httpx.get(f"{base}/api/schema/?format=json", timeout=30).json()
    operations = api_operations(schema, values)
    assert len(operations) >= 5, operations

    failures = []
    for person, role in PEOPLE.items():
        with httpx.Client(base_url=base, timeout=60, follow_redirects=False) as client:
            assert sign_in(client, person, "a-typo").status_code == 200, person
            assert sign_in(client, person, PASSWORD).status_code == 302, person
            answers = crawl(client, ["/", "/admin/"])
        assert len(answers) >= 10, (person, answers)
        failures += [(person, url, status) for url, status in answers.items() if status >= 500]
        token = base64.b64encode(f"{person}:{PASSWORD}".encode()).decode()
        wrong = base64.b64encode(f"{person}:a-typo".encode()).decode()
        assert httpx.get(f"{base}/api/v2/accounts/acme-eu/receipts/1", timeout=30,
                         headers={"Authorization": f"Basic {wrong}"}).status_code == 401, person
        for method, path in operations:
            answer = httpx.request(method, base + path, content=b"{}", timeout=60,
                                   headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"})
            if answer.status_code >= 500:
                failures.append((person, f"{method} {path}", answer.status_code))
    assert failures == [], failures
