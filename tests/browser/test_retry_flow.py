"""End to end in headless Chromium: a reviewer finds a run that crashed in an ambiguous
place, marks its in-doubt effect's outcome unknown (no retry is offered before that) and
requests a retry; a different approver, who lands on the awaiting-approval tab, approves
it; the run page and its audit trail show both (issue 2, "One Playwright test")."""

from __future__ import annotations

import os
import uuid

import pytest
from django.db import connections

from tests.conftest import PASSWORD
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason=f"{CHROMIUM} is missing: apt-get install -y chromium"),
]

@pytest.fixture
def browser(monkeypatch, live_server):
    # Depends on live_server so that Chromium (and its polling keep-alive requests) is
    # closed before the server and the test database go away.
    # Playwright's sync API runs an event loop in this thread; Django's async-safety check
    # would otherwise refuse the ORM calls the test makes while the browser is open.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _login(browser, live_server, username):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/t/acme/**")
    return context, page


def test_it_lets_a_reviewer_request_and_another_person_approve_a_retry(
        browser, live_server, acme, rita, april, wendy):
    from playwright.sync_api import expect

    run_id, cp_id = uuid.uuid4(), uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(cp_id, run_id, 0, payload={"phase": "charging",
                                                                    "order_id": "A-7"}))
    walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key="charge:A-7"),
                "submitted")
    sweep_later()
    run_url = f"{live_server.url}/t/acme/runs/{run_id}/"

    # rita finds the run in the ambiguous tab; its charge is in doubt, so no retry yet.
    context, page = _login(browser, live_server, "rita")
    page.click(f"a[title='{run_id}']")
    page.wait_for_url(run_url)
    expect(page.locator("#run-state")).to_have_text("ambiguous")
    expect(page.locator("#next-step")).to_contain_text("Reconcile first")
    expect(page.locator("#f-retry")).to_have_count(0)
    # She marks the outcome unknown, then requests a retry.
    unknown = page.locator("form[id^='f-unknown-']")
    unknown.locator("input[name=reason]").fill("gateway has no lookup")
    unknown.locator("button[type=submit]").click()
    expect(page.locator("#run-state")).to_have_text("unknown outcome")
    expect(page.locator("#back-link")).to_contain_text("unknown outcome runs")
    page.fill("#f-retry input[name=reason]", "worker died after submit; charge unconfirmed")
    page.click("#f-retry button[type=submit]")
    expect(page.locator("#run-state")).to_have_text("awaiting approval")
    expect(page.locator("#next-step")).to_contain_text("other than rita")
    expect(page.locator("#audit-panel tr[data-action='retry.request']")).to_contain_text("rita")
    page.wait_for_load_state("networkidle")  # let the server finish before the context goes
    context.close()

    # april, in a fresh browser context, lands on the awaiting-approval tab and approves.
    context, page = _login(browser, live_server, "april")
    expect(page.locator(".tab.active")).to_contain_text("awaiting approval")
    page.click(f"a[title='{run_id}']")
    page.wait_for_url(run_url)
    decide = page.locator("form[id^='f-decide-']")
    decide.locator("input[name=reason]").fill("gateway dedupes by operation key")
    decide.locator("button", has_text="Approve").click()
    expect(page.locator("#run-state")).to_have_text("retry approved")
    expect(page.locator("#back-link")).to_contain_text("retry approved runs")
    audit = page.locator("#audit-panel")
    expect(audit.locator("tr[data-action='retry.approve']")).to_contain_text("april")
    expect(audit.locator("tr[data-action='retry.request']")).to_contain_text("rita")

    # A full reload shows the same thing (it was written, not just swapped in).
    page.reload()
    expect(page.locator("#run-state")).to_have_text("retry approved")
    expect(page.locator("#audit-panel tr[data-action='retry.approve']")).to_have_count(1)
    expect(page.locator("#audit-panel tr[data-action='retry.request']")).to_have_count(1)
    page.wait_for_load_state("networkidle")
    context.close()
    # The ORM calls above ran inside Playwright's greenlet context, which has its own
    # database connection; close it here, or PostgreSQL cannot drop the test database.
    connections.close_all()
