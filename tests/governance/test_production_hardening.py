"""Production settings and sign-in throttling (issue 17 item 4, D-184, docs/security.md "Production checklist"):
`check --deploy` is clean with config.django.production, a missing SECRET_KEY stops start-up with a clear
error, every response carries a Content-Security-Policy, and repeated wrong passwords on the login form and on
the API's HTTP Basic lock the pair out with 429 and Retry-After, the right password included."""
from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.support import scaled

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = {"DJANGO_SETTINGS_MODULE": "config.django.production", "DJANGO_ALLOWED_HOSTS": "connector.example",
              "DJANGO_SECRET_KEY": "k" * 20 + "-production-secret-key-for-the-deploy-check-0123456789",
              "CONNECTOR_METRICS_TOKEN": "m" * 40}


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    # The child is a production process: nothing the test process set for itself (the browser tests' async
    # escape hatch DJANGO_ALLOW_ASYNC_UNSAFE) leaks into its deploy check.
    base = {k: v for k, v in os.environ.items()
            if k not in ("DJANGO_SETTINGS_MODULE", "DJANGO_SECRET_KEY", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=scaled(120))


def test_check_deploy_is_clean_with_the_production_settings():
    """`manage.py check --deploy --fail-level WARNING` reports nothing (HSTS, SSL redirect behind the proxy
    header, secure cookies, a real SECRET_KEY, DEBUG off). Proves: issue 17 item 4."""
    result = _manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key():
    """No DJANGO_SECRET_KEY (or the public development one): start-up fails naming the variable, never falls back
    to a public key. Proves: issue 17 item 4."""
    for secret in ("", "insecure-development-key-change-me"):
        result = _manage("check", **{**PRODUCTION, "DJANGO_SECRET_KEY": secret})
        assert result.returncode != 0
        assert "DJANGO_SECRET_KEY must be set for config.django.production" in result.stderr


@pytest.mark.django_db
def test_every_page_carries_a_content_security_policy(client):
    """The login page and the API schema answer with a CSP allowing only this origin and no framing."""
    for url in ("/accounts/login/", "/api/schema/"):
        policy = client.get(url)["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy and "object-src 'none'" in policy


@pytest.mark.django_db
def test_login_form_locks_out_after_five_failures_with_429_and_retry_after():
    """Five wrong passwords for one user from one address, then the right one: the sixth attempt is 429 with
    Retry-After and no session is opened; another user from the same address is unaffected. Proves: issue 17
    item 4."""
    User.objects.create_user("oscar", password="right-password-1")
    User.objects.create_user("other", password="right-password-2")
    client = Client()
    for _ in range(4):
        response = client.post("/accounts/login/", {"username": "oscar", "password": "wrong"})
        assert response.status_code == 200  # the form again, with its error
    locked = client.post("/accounts/login/", {"username": "oscar", "password": "wrong"})
    assert locked.status_code == 429 and int(locked["Retry-After"]) == 15 * 60
    right = client.post("/accounts/login/", {"username": "oscar", "password": "right-password-1"})
    assert right.status_code == 429 and "TOO_MANY_ATTEMPTS" in right.content.decode()
    assert "_auth_user_id" not in client.session
    other = Client().post("/accounts/login/", {"username": "other", "password": "right-password-2"})
    assert other.status_code == 302


@pytest.mark.django_db
def test_basic_auth_api_reads_lock_out_with_429_and_retry_after():
    """25 wrong Basic-auth passwords are no longer all answered 401: from the fifth on the pair is locked out,
    and the right password then gets 429 TOO_MANY_ATTEMPTS with Retry-After instead of an answer.
    Proves: issue 17 item 4."""
    from django.contrib.auth.models import Permission

    user = User.objects.create_user("reader", password="right-password-3")
    user.user_permissions.add(Permission.objects.get(codename="view_receipt"))
    url = "/api/v2/accounts/no-such-account/receipts/1"

    def get(password):
        token = base64.b64encode(f"reader:{password}".encode()).decode()
        return Client().get(url, HTTP_AUTHORIZATION=f"Basic {token}")

    assert get("right-password-3").json()["code"] == "ACCOUNT_NOT_FOUND"  # authenticated: the read itself answers
    codes = [get("wrong").status_code for _ in range(25)]
    assert codes[:4] == [401] * 4 and set(codes[4:]) == {429}
    right = get("right-password-3")
    assert right.status_code == 429 and int(right["Retry-After"]) == 15 * 60
    assert right.json()["code"] == "TOO_MANY_ATTEMPTS"
