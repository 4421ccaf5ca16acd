"""The ``browser`` fixture: Debian's Chromium driven by Playwright (sync API)."""

from __future__ import annotations

import pytest

from tests.browser.common import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture
def browser(monkeypatch, live_server):
    """A headless Chromium, closed before the live server and the test database go away
    (it depends on ``live_server`` for that order). Playwright's sync API runs an event
    loop in this thread; Django's async-safety check would otherwise refuse the ORM calls
    the test makes while the browser is open."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
