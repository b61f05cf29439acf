"""Browser tests: Playwright driving Debian's Chromium (/usr/bin/chromium; `make test` installs it with apt when
missing; no browser is downloaded) against pytest-django's live server on the real test database. Screenshots of
every screen go to test-artifacts/screens/ (the operator guide in docs/ uses copies of them)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SCREENS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screens"

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs an event loop


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def shot():
    SCREENS.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = SCREENS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path
    return take


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/browser/" in str(item.fspath) and item.get_closest_marker("django_db") is None:
            item.add_marker(pytest.mark.django_db(transaction=True, databases=["default", "journal"]))
