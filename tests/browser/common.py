"""What every browser test shares: the Chromium path and flags, the marks that skip the
module with a clear message when Chromium is missing, and ``login``. The ``browser``
fixture lives in ``tests/browser/conftest.py``.

A module opts in with ``pytestmark = BROWSER`` (or ``[*BROWSER, ...]``)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import PASSWORD

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

BROWSER = [
    pytest.mark.browser,
    # What a page does in a browser does not depend on the database behind it: make test
    # runs these in the SQLite pass only (the PostgreSQL pass was the longer by far).
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason=f"{CHROMIUM} is missing: apt-get install -y chromium"),
]


def login(browser, live_server, username, *, width: int = 1280, height: int = 900,
          tenant: str = "acme", **context_args):
    """A new browser context logged in as ``username`` (password ``PASSWORD``), landed on
    the tenant's inbox: ``(context, page)``. ``width``/``height`` set the viewport."""
    context = browser.new_context(viewport={"width": width, "height": height}, **context_args)
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/t/{tenant}/**")
    return context, page


def screenshot(page, name: str, *, full_page: bool = False) -> None:
    """Save the page as ``<name>.png`` into ``$RECOVERY_SCREENSHOTS_DIR`` when that is set
    (``make screenshots`` sets it to ``docs/screenshots``, whose pictures the README
    shows); otherwise do nothing. The README's pictures therefore come from the browser
    tests' own steps, never from a hand-made page."""
    folder = os.environ.get("RECOVERY_SCREENSHOTS_DIR")
    if folder:
        os.makedirs(folder, exist_ok=True)
        page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=full_page)


def settled(page) -> None:
    """Wait until no htmx request, swap or settle is under way on the page. Call it after
    an htmx action's visible result (a pushed URL, a new text) and before the next action
    on elements the swap may have replaced: otherwise, on a loaded machine, the next input
    can land in the element being replaced and be lost."""
    page.wait_for_function(
        "() => !document.querySelector('.htmx-request, .htmx-swapping, .htmx-settling')")
