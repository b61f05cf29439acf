"""Sign-in throttling against the real web process of `make run` (gunicorn, the `web_server` fixture) connected as
the application role, as operators meet it (issue 36): a wrong password then the right one signs in, on the form
and over HTTP Basic; five wrong ones lock the pair out with a page that says when to retry and who can unlock, and
429 TOO_MANY_ATTEMPTS over the API; the administrator's unlock command, run as the application role, restores
access. Every one of these answered 500 while the role lacked privileges on django-axes' newer tables."""
from __future__ import annotations

import base64
import re

import httpx
import pytest
from django.contrib.auth.models import Permission, User

from tests.faults.servers import child_environment, manage, run_database_env

TRANSACTIONAL = {"transaction": True, "databases": ["default", "journal"]}
API_READ = "/api/v2/accounts/no-such-account/receipts/1"
RIGHT = "the-right-password-1"


def _person(name: str) -> User:
    user = User.objects.create_user(name, password=RIGHT, is_staff=True)
    user.user_permissions.add(Permission.objects.get(content_type__app_label="connector", codename="view_receipt"),
                              Permission.objects.get(codename="view_governance"))
    return user


def _form(port: int) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, follow_redirects=False)


def sign_in(client: httpx.Client, username: str, password: str, path: str = "/accounts/login/") -> httpx.Response:
    """The login form as a browser posts it: the page first (CSRF cookie and token), then the form."""
    page = client.get(path)
    assert page.status_code == 200, (page.status_code, page.text[:400])
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    return client.post(path, data={"username": username, "password": password, "csrfmiddlewaretoken": token},
                       headers={"Referer": str(client.base_url) + path})


def basic(port: int, username: str, password: str) -> httpx.Response:
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return httpx.get(f"http://127.0.0.1:{port}{API_READ}", headers={"Authorization": f"Basic {token}"}, timeout=30)


@pytest.mark.django_db(**TRANSACTIONAL)
@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/"])
def test_a_wrong_password_then_the_right_one_signs_in_on_the_form(web_server, path):
    """One typo, then the right password: signed in (302 to the screens), and every later sign-in too; the failed
    attempt was counted and is forgotten on success. Proves: issue 36 (wrong then right, form)."""
    _person("cora")
    with _form(web_server.port) as client:
        wrong = sign_in(client, "cora", "typo", path)
        assert wrong.status_code == 200 and re.search("did not match|Please enter the correct", wrong.text), wrong.text
        right = sign_in(client, "cora", RIGHT, path)
        assert right.status_code == 302, (right.status_code, right.text[:600])
        assert client.get("/").status_code == 200
    with _form(web_server.port) as again:
        assert sign_in(again, "cora", RIGHT, path).status_code == 302


@pytest.mark.django_db(**TRANSACTIONAL)
def test_a_wrong_password_then_the_right_one_over_http_basic(web_server):
    """A wrong HTTP Basic password answers 401 NOT_AUTHENTICATED (twice: the second failure updates the counted
    attempt), then the right one is served. Proves: issue 36 (wrong then right, HTTP Basic)."""
    _person("oscar")
    for _ in range(2):
        wrong = basic(web_server.port, "oscar", "typo")
        assert (wrong.status_code, wrong.json()["code"]) == (401, "NOT_AUTHENTICATED"), wrong.text[:600]
    right = basic(web_server.port, "oscar", RIGHT)
    assert (right.status_code, right.json()["code"]) == (404, "ACCOUNT_NOT_FOUND"), right.text[:600]
    assert basic(web_server.port, "oscar", RIGHT).status_code == 404


@pytest.mark.django_db(**TRANSACTIONAL)
def test_five_wrong_passwords_lock_out_and_the_unlock_command_restores_access(web_server):
    """Five wrong passwords on the form: the fifth and the right one after it get the lock-out page (429, when to
    retry, who can unlock), never a 500; the API answers 429 TOO_MANY_ATTEMPTS for the locked pair. The
    administrator's `manage.py axes_reset_username`, run as the application role as the processes of `make run`
    are, unlocks: the right password signs in on the form and over HTTP Basic. Proves: issue 36 (lock-out,
    unlock as the application role)."""
    _person("cora")
    with _form(web_server.port) as client:
        answers = [sign_in(client, "cora", f"typo-{n}").status_code for n in range(5)]
        assert answers == [200, 200, 200, 200, 429], answers
        locked = sign_in(client, "cora", RIGHT)
        assert locked.status_code == 429 and int(locked.headers["Retry-After"]) > 0
        for words in ("TOO_MANY_ATTEMPTS", "Try again after", "axes_reset_username cora", "administrator"):
            assert words in locked.text, (words, locked.text)
    api = [basic(web_server.port, "cora", "typo").status_code for _ in range(5)]
    assert api[-1] == 429 and set(api) <= {401, 429}, api
    refused = basic(web_server.port, "cora", RIGHT)
    assert (refused.status_code, refused.json()["code"]) == (429, "TOO_MANY_ATTEMPTS")

    env = child_environment(secret_dir=web_server.secret_dir, **run_database_env())
    unlock = manage(env, "axes_reset_username", "cora")
    assert unlock.returncode == 0, unlock.stdout + unlock.stderr
    with _form(web_server.port) as client:
        assert sign_in(client, "cora", RIGHT).status_code == 302
    assert basic(web_server.port, "cora", RIGHT).status_code == 404
