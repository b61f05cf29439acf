"""Browser tests: Playwright driving Debian's Chromium (/usr/bin/chromium; `make test` installs it with apt when
missing; no browser is downloaded) against pytest-django's live server on the real test database. Screenshots of
every screen go to test-artifacts/screens/, or to $SCREENSHOT_DIR when set: `make screenshots` runs these tests with
SCREENSHOT_DIR=docs/operator-guide, which regenerates every picture of the operator guide, 1,400 px wide."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SCREENS = Path(os.environ.get("SCREENSHOT_DIR") or Path(__file__).resolve().parents[2] / "test-artifacts" / "screens")
SCREEN_WIDTH = 1400

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
        if page.viewport_size["width"] != SCREEN_WIDTH:
            page.set_viewport_size({"width": SCREEN_WIDTH, "height": page.viewport_size["height"]})
        page.screenshot(path=str(path), full_page=True)
        return path
    return take


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/browser/" in str(item.fspath) and item.get_closest_marker("django_db") is None:
            item.add_marker(pytest.mark.django_db(transaction=True, databases=["default", "journal"]))
