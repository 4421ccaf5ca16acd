"""End to end in headless Chromium (issue 9): a reviewer types an order id into the
inbox's search box and finds the run; the pager goes next and previous, showing where
each page sits ("6-10 of 11")."""

from __future__ import annotations

import re
import uuid

from checkpoints.dashboard import inbox as inbox_views
from tests.browser.common import BROWSER, login, screenshot
from tests.helpers import envelope, put_checkpoint
from tests.views.conftest import make_stuck_run

pytestmark = BROWSER


def test_a_reviewer_finds_a_run_by_its_order_id(browser, live_server, acme, rita, wendy):
    from playwright.sync_api import expect

    other = make_stuck_run(wendy, acme, order_id="A-1002", key="charge:A-1002")
    stuck = make_stuck_run(wendy, acme, order_id="A-1003", key="charge:A-1003")
    context, page = login(browser, live_server, "rita")
    rows = page.locator("table.runs tbody tr")
    expect(rows).to_have_count(2)
    page.fill("#inbox-q", "A-1003")  # htmx searches as the reviewer types
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(str(stuck.run_id)[:8])
    expect(page.locator("body")).not_to_contain_text(str(other.run_id)[:8])
    expect(page.locator(".page-range")).to_have_text("1-1 of 1")
    screenshot(page, "search")
    assert "q=A-1003" in page.url  # the search is in the URL: Back and reload keep it
    page.reload()
    expect(rows).to_have_count(1)
    expect(page.locator("#inbox-q")).to_have_value("A-1003")
    page.click(f"table.runs a[href*='{stuck.run_id}']")
    page.wait_for_url(f"**/runs/{stuck.run_id}/?back=**")
    context.close()


def test_the_pager_goes_next_and_previous(browser, live_server, acme, rita, wendy,
                                          monkeypatch):
    from playwright.sync_api import expect

    monkeypatch.setattr(inbox_views, "INBOX_PAGE", 5)
    for _ in range(11):
        put_checkpoint(wendy, acme, envelope(uuid.uuid4(), uuid.uuid4(), 0))
    context, page = login(browser, live_server, "rita")
    page.goto(f"{live_server.url}/t/acme/?state=healthy")
    where = page.locator(".page-range")
    expect(where).to_have_text("1-5 of 11")
    expect(page.locator("a[rel=prev]")).to_have_count(0)
    page.click("a[rel=next]")
    expect(where).to_have_text("6-10 of 11")
    page.click("a[rel=next]")
    expect(where).to_have_text("11-11 of 11")
    expect(page.locator("a[rel=next]")).to_have_count(0)
    page.click("a[rel=prev]")
    expect(where).to_have_text("6-10 of 11")
    page.click("a[rel=prev]")
    expect(where).to_have_text("1-5 of 11")
    context.close()


def test_typing_in_a_filter_box_filters_in_place_without_a_script_error(
        browser, live_server, acme, rita, wendy):
    """The filter form's htmx trigger is valid htmx 2 syntax (a newcomer saw three
    ``htmx:syntax:error`` on every inbox load), and typing a kind filters in place."""
    from playwright.sync_api import expect

    make_stuck_run(wendy, acme, order_id="A-2001", key="charge:A-2001")
    context, page = login(browser, live_server, "rita")
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"{live_server.url}/t/acme/?state=ambiguous")
    rows = page.locator("table.runs tbody tr td a[href*='/runs/']")
    expect(rows).to_have_count(1)
    page.locator(".filters input[name=kind]").press_sequentially("no.such_kind")
    expect(page).to_have_url(re.compile(r"kind=no\.such_kind"))  # htmx pushed it
    expect(rows).to_have_count(0)
    assert errors == []
    context.close()
