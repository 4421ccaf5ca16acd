"""End to end in headless Chromium: a reviewer finds a run that crashed in an ambiguous
place, marks its in-doubt effect's outcome unknown (no retry is offered before that) and
requests a retry; a different approver, who lands on the awaiting-approval tab, approves
it; the run page and its audit trail show both (issue 2, "One Playwright test")."""

from __future__ import annotations

import uuid

from django.db import connections

from tests.browser.common import BROWSER, login, screenshot
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect

pytestmark = BROWSER


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
    context, page = login(browser, live_server, "rita")
    page.click(f"a[title='{run_id}']")
    page.wait_for_url(run_url + "?back=**")
    expect(page.locator("#run-state")).to_have_text("ambiguous")
    expect(page.locator("#next-step")).to_contain_text("Reconcile first")
    expect(page.locator("#f-retry")).to_have_count(0)
    # She marks the outcome unknown, then requests a retry.
    unknown = page.locator("form[id^='f-unknown-']")
    unknown.locator("input[name=reason]").fill("gateway has no lookup")
    page.once("dialog", lambda dialog: dialog.accept())  # irreversible: app.js asks first
    unknown.locator("button[type=submit]").click()
    expect(page.locator("#run-state")).to_have_text("unknown outcome")
    # Back to where she came from: the inbox she landed on (issue 21, item 10).
    expect(page.locator("#back-link")).to_have_attribute("href", "/t/acme/")
    page.fill("#f-retry input[name=reason]", "worker died after submit; charge unconfirmed")
    page.click("#f-retry button[type=submit]")
    expect(page.locator("#run-state")).to_have_text("awaiting approval")
    expect(page.locator("#next-step")).to_contain_text("other than rita")
    screenshot(page, "run", full_page=True)
    expect(page.locator("#audit-panel tr[data-action='retry.request']")).to_contain_text("rita")
    page.wait_for_load_state("networkidle")  # let the server finish before the context goes
    context.close()

    # april, in a fresh browser context, lands on the awaiting-approval tab and approves.
    context, page = login(browser, live_server, "april")
    expect(page.locator(".tab.active")).to_contain_text("awaiting approval")
    page.click(f"a[title='{run_id}']")
    page.wait_for_url(run_url + "?back=**")
    decide = page.locator("form[id^='f-decide-']")
    decide.locator("input[name=reason]").fill("gateway dedupes by operation key")
    decide.locator("button", has_text="Approve").click()
    expect(page.locator("#run-state")).to_have_text("retry approved")
    # Back to the inbox she came from, which lands on the next request awaiting approval.
    expect(page.locator("#back-link")).to_have_attribute("href", "/t/acme/")
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
