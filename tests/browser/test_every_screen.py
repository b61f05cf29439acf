"""Every operator screen as every demo role in a real browser, checked for content and accessibility (issue 38
item 7): no page answers 5xx or an unintended 4xx, no table row is empty, every link on a page resolves, and
axe-core (axe-playwright-python) reports no serious or critical violation. One live server, one browser, one
context per role (tests/browser/walk.py). With SCREENSHOT_DIR set (`make screenshots`), one PNG per screen, 1,400 px
wide, is written there."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.browser import walk
from tests.effects.receiver import Receiver
from tests.support import whole_seconds


def test_every_screen_as_every_role_has_content_working_links_and_no_serious_axe_violation(
        browser, live_server, settings):
    """Proves: issue 38 item 7"""
    receiver = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": receiver.url,
                          "EGRESS_TIMEOUT_SECONDS": whole_seconds(5)}
    shots = Path(os.environ["SCREENSHOT_DIR"]) if os.environ.get("SCREENSHOT_DIR") else None
    try:
        started = time.monotonic()
        walk.build_world(receiver)
        built = time.monotonic()
        extra = walk.deep_pages()
        result = walk.Walk()
        for role in walk.PEOPLE:
            walk.walk_role(browser, live_server.url, role, result, shots, extra)
        walk.walk_role(browser, live_server.url, walk.NO_ROLE, result, shots)
        walk.walk_anonymous(browser, live_server.url, result, shots)
    finally:
        receiver.stop()
    print(f"walk: world {built - started:.1f} s, walk {time.monotonic() - built:.1f} s, "
          f"{sum(len(s) for s in result.pages.values())} pages, {result.axe_runs} axe runs (violations by impact: {result.impacts}), "
          f"{result.links_checked} links asked; seconds {result.seconds}")
    print("\n".join(result.problems))
    for role, shapes in result.pages.items():
        if role in ("oscar", "ann", "operator"):  # every role opens every screen; these see every link
            missing = walk.REQUIRED_SHAPES - shapes
            assert not missing, f"{role} never reached {sorted(missing)}"
    assert result.problems == [], "\n".join(result.problems)


@pytest.mark.django_db(databases=[])
def test_the_walk_checks_can_fail(browser):
    """The walk's own detectors on a page made to break them: an empty row and a row of empty cells are found, a
    row with only a checkbox is not, and axe-core reports an input without a label and a page without a language
    as serious or critical (so a green walk means the screens passed, not that nothing was checked)."""
    from axe_playwright_python.sync_playwright import Axe

    context = browser.new_context()
    page = context.new_page()
    page.set_content("<html><head><title>t</title></head><body><main><table><tr></tr><tr><td> </td><td></td></tr>"
                     "<tr><td><input type=checkbox aria-label=pick></td></tr><tr><td>fact</td></tr></table>"
                     "<input type=text name=reason></main></body></html>")
    assert len(page.evaluate(walk.EMPTY_ROWS_JS)) == 2
    found = {v["id"]: v["impact"] for v in Axe().run(page).response["violations"]}
    assert found.get("label") in walk.SERIOUS and found.get("html-has-lang") in walk.SERIOUS, found
    context.close()
