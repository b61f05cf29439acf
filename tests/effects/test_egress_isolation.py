"""The sole egress adapter: no other product module can reach a provider, and the adapter sends at most once per
permit, only for the holder and fences the permit names."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from effects.errors import EgressRefused
from effects.models import DispatchPermit
from tests.concurrency import raised, run_concurrently
from tests.effects.helpers import acquire, author, build_push_world, send


@pytest.fixture
def tx_push_world(transactional_db):
    return build_push_world()

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("connector", "effects", "cutover", "v1")
HTTP_CLIENTS = ("httpx", "requests", "urllib.request", "http.client", "aiohttp")


def _is_client(module: str) -> bool:
    return any(module == c or module.startswith(c + ".") for c in HTTP_CLIENTS)


def http_client_imports(source: str) -> list[str]:
    """Every HTTP client module a source file imports: `import x`, `from x import y`, `from urllib import request`
    and dynamic `importlib.import_module("x")` / `__import__("x")` with a literal name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_client(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _is_client(node.module):
                found.append(node.module)
            else:
                found += [f"{node.module}.{a.name}" for a in node.names if _is_client(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str) \
                    and _is_client(node.args[0].value):
                found.append(node.args[0].value)
    return found


def test_the_detector_sees_every_import_form():
    """The static check recognises each way a module could pull in an HTTP client (guards the check itself)."""
    assert http_client_imports("import httpx") == ["httpx"]
    assert http_client_imports("import requests.adapters") == ["requests.adapters"]
    assert http_client_imports("from urllib import request") == ["urllib.request"]
    assert http_client_imports("from http import client as c") == ["http.client"]
    assert http_client_imports("from aiohttp import ClientSession") == ["aiohttp"]
    assert http_client_imports("import importlib\nimportlib.import_module('httpx')") == ["httpx"]
    assert http_client_imports("from urllib.parse import quote\nimport http\nimport json") == []


def test_only_the_egress_adapter_imports_an_http_client():
    """Walking every .py file of connector/, effects/, cutover/ and v1/: httpx, requests, urllib.request,
    http.client and aiohttp are imported by effects/egress.py (V2's sole egress) and v1/egress.py (the V1 release's
    own sole egress, listed in its egress manifest) and by no other product module. Proves: CV2-10-036"""
    importers = {}
    files = [p for pkg in PRODUCT_PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert len(files) > 50
    for path in files:
        found = http_client_imports(path.read_text(encoding="utf-8"))
        if found:
            importers[str(path.relative_to(ROOT))] = found
    assert importers == {"effects/egress.py": ["httpx"], "v1/egress.py": ["httpx"]}


# -- one permit, one request ------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_second_send_for_the_same_permit_is_refused(push_world, receiver):
    """The first send wins `granted -> sending` and makes the one request; a second send of the same permit (any
    later invocation, after it returned) is refused before any byte. Proves: CV2-10-038, CV2-10-039"""
    author(push_world.accounts[0])
    ready = acquire("h-once")
    assert send(ready).state == "finalized"
    with pytest.raises(EgressRefused, match="returned"):
        send(ready)
    assert len(receiver.requests) == 1
    assert DispatchPermit.objects.get().state == "returned"


@pytest.mark.django_db(transaction=True)
def test_concurrent_sends_of_one_permit_make_one_request(tx_push_world, receiver):
    """Two workers presenting the same granted permit at the same moment (threads, separate connections): exactly
    one wins the compare-and-swap and makes the request; the other is refused; the receiver sees one request.
    Proves: CV2-10-038, CV2-10-039, CV2-15-024"""
    author(tx_push_world.accounts[0])
    ready = acquire("h-twice")
    results = run_concurrently([lambda: send(ready)] * 2)
    errors = raised(results)
    assert len(errors) == 1 and isinstance(errors[0], EgressRefused), errors
    assert [r.state for r in results if not isinstance(r, BaseException)] == ["finalized"]
    assert len(receiver.requests) == 1 and receiver.applied_total() == 1


@pytest.mark.django_db
def test_a_permit_is_refused_for_another_holder_or_fence(push_world, receiver):
    """The adapter refuses a permit presented with another holder (even a running one holding its own permit),
    another holder fence or another credential-gate fence: no request, the permit stays `granted` with no I/O
    started. The exact holder and fences then send once. Proves: CV2-10-036, CV2-10-038"""
    acme = push_world.accounts[0]
    author(acme, root="order-1")
    author(acme, root="order-2")
    mine = acquire("h-mine", acme)
    theirs = acquire("h-theirs", acme)
    p = mine.permit
    for kwargs in ({"holder_id": "h-theirs"}, {"holder_id": "h-theirs", "holder_fence": theirs.permit.holder_fence},
                   {"holder_id": "h-nobody"}, {"holder_fence": p.holder_fence + 1},
                   {"holder_fence": p.holder_fence - 1}, {"credential_gate_fence": p.credential_gate_fence + 1}):
        with pytest.raises(EgressRefused):
            send(mine, **kwargs)
    assert receiver.requests == []
    permit = DispatchPermit.objects.get(pk=p.pk)
    assert (permit.state, permit.io_may_have_started) == ("granted", False)
    assert send(mine).state == "finalized" and len(receiver.requests) == 1
    assert DispatchPermit.objects.get(pk=theirs.permit.pk).state == "granted"
