"""The API documentation page renders the schema in Chromium from the project's own static
files (no CDN, within the Content-Security-Policy): every operation is listed."""
import shutil

import pytest

from .conftest import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


def test_the_docs_page_lists_every_operation(live_server):
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium on this machine")
    user = make_user("vera", "viewer")
    user.set_password("correct horse battery staple")
    user.save()
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-background-networking"])
        try:
            tab = browser.new_page()
            problems, requests = [], []
            tab.on("pageerror", lambda exc: problems.append(str(exc)))
            # The WSGI test server has no websockets: the top bar's live status may fail, nothing else.
            tab.on("response", lambda r: problems.append(f"{r.status} {r.url}")
                   if r.status >= 400 and "/ws/" not in r.url else None)
            tab.on("console", lambda msg: problems.append(msg.text)
                   if msg.type == "error" and "WebSocket" not in msg.text and "404" not in msg.text else None)
            tab.on("request", lambda req: requests.append(req.url))
            tab.goto(live_server.url + "/login/?next=/api/docs/")
            tab.fill('input[name="username"]', "vera")
            tab.fill('input[name="password"]', "correct horse battery staple")
            tab.click('button[type="submit"]')
            tab.wait_for_url(live_server.url + "/api/docs/")
            tab.wait_for_selector("#api-docs h3", timeout=20000)
            headings = tab.locator("#api-docs h3 code").all_text_contents()
            assert "POST /api/v1/jobs/" in headings and "POST /api/v1/placements/{placement_id}/override/" in headings
            assert len(headings) >= 26
            text = tab.inner_text("#api-docs")
            assert "Parameters" in text and "Request body (JSON)" in text and "Response 201" in text
            assert not problems, problems
            assert all(url.startswith(live_server.url) for url in requests), requests
        finally:
            browser.close()
