"""Issue 9, item 4 ("pages that stay true") in headless Chromium:

- Back and Forward after a filtered htmx navigation (``hx-push-url``) show the whole,
  current page, never a bare fragment or a stale snapshot;
- a CSRF failure in a second tab (log out and in again there, which rotates the token)
  shows a short message in place in the first tab, and its run page stays intact;
- a stale approval: two approvers have the same retry request open, the first approves,
  the second is told "already approved by april …" and sees the approved state.
"""

from __future__ import annotations

import uuid

from django.db import connections

from checkpoints import services
from checkpoints.models import RetryRequest
from tests.browser.common import BROWSER, login
from tests.conftest import PASSWORD
from tests.helpers import envelope, put_checkpoint, sweep_later

pytestmark = BROWSER


def _ambiguous(writer, tenant, workflow: str = "order-flow") -> uuid.UUID:
    """A run of ``workflow`` in flight with its owner gone: ``ambiguous`` once swept."""
    body = envelope(payload={"phase": "charging", "order_id": "A-1", "workflow": workflow})
    put_checkpoint(writer, tenant, body)
    return uuid.UUID(body["run_id"])


def _rows(page):
    return page.locator("table.runs tbody a.mono")


def test_back_and_forward_after_a_filtered_htmx_navigation_show_whole_current_pages(
        browser, live_server, acme, wendy, rita):
    from playwright.sync_api import expect

    refund = _ambiguous(wendy, acme, "refund-flow")
    order = _ambiguous(wendy, acme)
    sweep_later()
    context, page = login(browser, live_server, "rita")
    inbox = f"{live_server.url}/t/acme/"
    subject = page.locator("form.filters input[name=subject]")

    # Two htmx filters, each swapping #inbox-main in place and pushing its URL.
    page.evaluate("window.__sameDocument = true")
    subject.fill("refund")
    subject.press("Enter")
    page.wait_for_url("**subject=refund**")
    expect(_rows(page)).to_have_count(1)
    expect(page.locator(f"a[title='{refund}']")).to_have_count(1)
    subject.fill("order")
    subject.press("Enter")
    page.wait_for_url("**subject=order**")
    expect(page.locator(f"a[title='{order}']")).to_have_count(1)
    assert page.evaluate("window.__sameDocument === true"), "the filter reloaded the page"

    # Meanwhile another refund run goes ambiguous: a page restored from a snapshot
    # would not list it.
    later = _ambiguous(wendy, acme, "refund-flow")
    sweep_later()

    # Back inside the document (htmx's popstate): the whole filtered inbox, as it is now.
    page.go_back()
    page.wait_for_url("**subject=refund**")
    expect(page.locator("header.topbar")).to_have_count(1)
    expect(page.locator("nav.mainnav")).to_be_visible()
    expect(page.locator("#inbox-main")).to_have_count(1)
    expect(subject).to_have_value("refund")
    expect(page.locator(f"a[title='{later}']")).to_have_count(1)
    expect(_rows(page)).to_have_count(2)

    # Open a run (a full navigation), then Back and Forward.
    page.click(f"a[title='{refund}']")
    page.wait_for_url(f"{live_server.url}/t/acme/runs/{refund}/?back=**")
    expect(page.locator("#run-state")).to_have_text("ambiguous")
    page.go_back()
    page.wait_for_url("**subject=refund**")
    expect(page.locator("header.topbar")).to_have_count(1)
    expect(page.locator("#inbox-main")).to_have_count(1)
    expect(_rows(page)).to_have_count(2)
    page.go_forward()
    page.wait_for_url(f"{live_server.url}/t/acme/runs/{refund}/?back=**")
    expect(page.locator("header.topbar")).to_have_count(1)
    expect(page.locator("#run-state")).to_have_text("ambiguous")
    # Back twice more: the unfiltered inbox we started from, whole (opening the run
    # dropped the "order" entry that was ahead of the refund one).
    page.go_back()
    page.wait_for_url("**subject=refund**")
    expect(page.locator("#inbox-main")).to_have_count(1)
    page.go_back()
    page.wait_for_url(inbox)
    expect(page.locator("header.topbar")).to_have_count(1)
    expect(subject).to_have_value("")
    expect(_rows(page)).to_have_count(3)
    page.wait_for_load_state("networkidle")
    context.close()
    connections.close_all()


def test_a_csrf_failure_from_a_second_tab_is_a_message_in_place(
        browser, live_server, acme, wendy, rita):
    from playwright.sync_api import expect

    run_id = _ambiguous(wendy, acme)
    sweep_later()
    run_url = f"{live_server.url}/t/acme/runs/{run_id}/"
    context, first = login(browser, live_server, "rita")
    first.goto(run_url)
    expect(first.locator("#f-retry")).to_be_visible()

    # The second tab logs out and in again: a new session and a new CSRF token.
    second = context.new_page()
    second.goto(f"{live_server.url}/t/acme/")
    second.click("form[action='/logout/'] button[type=submit]")
    second.wait_for_url(f"{live_server.url}/login/**")
    second.fill("#id_username", "rita")
    second.fill("#id_password", PASSWORD)
    second.click("button[type=submit]")
    second.wait_for_url(f"{live_server.url}/t/acme/**")

    # The first tab, loaded with the old token, requests a retry.
    first.fill("#f-retry input[name=reason]", "worker died")
    first.click("#f-retry button[type=submit]")
    error = first.locator("#f-retry-error")
    expect(error).to_contain_text("Your session changed")
    expect(error.get_by_role("link", name="Reload the page")).to_have_attribute(
        "href", f"/t/acme/runs/{run_id}/")
    # The run page is intact: one header, one run body, the state and the typed reason.
    expect(first.locator("header.topbar")).to_have_count(1)
    expect(first.locator("#run-body")).to_have_count(1)
    expect(first.locator("#run-state")).to_have_text("ambiguous")
    expect(first.locator("#f-retry input[name=reason]")).to_have_value("worker died")
    html = first.content()
    assert "CSRF verification failed" not in html and "Forbidden" not in html
    assert not RetryRequest.objects.exists()

    # Reloading gives the page the new token; the action then goes through.
    error.get_by_role("link", name="Reload the page").click()
    first.wait_for_url(run_url)
    first.fill("#f-retry input[name=reason]", "worker died")
    first.click("#f-retry button[type=submit]")
    expect(first.locator("#run-state")).to_have_text("awaiting approval")
    first.wait_for_load_state("networkidle")
    second.wait_for_load_state("networkidle")
    context.close()
    connections.close_all()


def test_a_stale_approval_says_who_approved_first_and_shows_the_approved_state(
        browser, live_server, acme, wendy, rita, april, adam):
    from playwright.sync_api import expect

    run_id = _ambiguous(wendy, acme)
    sweep_later()
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")
    run_url = f"{live_server.url}/t/acme/runs/{run_id}/"
    pages = {}
    for who in ("april", "adam"):  # adam (admin) may approve too
        context, page = login(browser, live_server, who)
        page.goto(run_url)
        expect(page.locator(f"#f-decide-{retry.pk}")).to_be_visible()
        pages[who] = (context, page)

    _, first = pages["april"]
    first.fill(f"#f-decide-{retry.pk} input[name=reason]", "gateway dedupes")
    first.locator(f"#f-decide-{retry.pk} button", has_text="Approve").click()
    expect(first.locator("#run-state")).to_have_text("retry approved")

    _, second = pages["adam"]
    second.fill(f"#f-decide-{retry.pk} input[name=reason]", "looks fine")
    second.locator(f"#f-decide-{retry.pk} button", has_text="Approve").click()
    refusal = second.locator("#refusal")
    expect(refusal).to_contain_text("already approved by april")
    expect(refusal).to_contain_text(" ago")
    expect(second.locator("#run-state")).to_have_text("retry approved")
    expect(second.locator(f"#f-decide-{retry.pk}")).to_have_count(0)
    expect(second.locator("header.topbar")).to_have_count(1)
    expect(second.locator("#audit-panel tr[data-action='retry.approve']")).to_contain_text(
        "april")
    assert RetryRequest.objects.get().decided_by == april
    for context, page in pages.values():
        page.wait_for_load_state("networkidle")
        context.close()
    connections.close_all()
