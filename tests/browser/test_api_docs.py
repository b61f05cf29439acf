"""/api/docs/ works without a network: Chromium, with every request to another host aborted, renders the API
reference from this server alone (Redoc from the installed drf-spectacular-sidecar package, the schema from
/api/schema/); nothing but Redoc's decorative attribution logo is even requested elsewhere."""
from __future__ import annotations

import re

#: Redoc's sidebar attribution ("API docs by Redocly") loads this image unconditionally and hides it when it
#: cannot be fetched: the only request the page makes elsewhere, decorative (decision D-163).
REDOC_ATTRIBUTION_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def test_api_docs_render_with_every_other_host_blocked(browser, live_server):
    page = browser.new_page()
    elsewhere: list[str] = []

    def only_this_server(route) -> None:
        if route.request.url.startswith(live_server.url):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    try:
        page.route("**/*", only_this_server)
        page.goto(f"{live_server.url}/api/docs/")
        heading = page.get_by_role("heading", name=re.compile(r"Connector V2 API"))
        heading.first.wait_for(timeout=30_000)
        assert page.get_by_text("Admit one transport delivery").count() > 0
        assert set(elsewhere) <= {REDOC_ATTRIBUTION_LOGO}, elsewhere
    finally:
        page.close()
