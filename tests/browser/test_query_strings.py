"""End to end in headless Chromium: the dashboard refuses a query parameter given twice
or one a page does not take (``forms.QueryForm``), so nothing the pages send by
themselves may do either. A reviewer searches, filters (the filter form carries a
hidden ``state``, ``q`` and ``sort``; the search form its own hidden filters), sorts,
pages, switches tabs, waits for the inbox's 10 s poll of ``run_new`` and filters the
audit log: every request the browser makes has each parameter once and is answered
below 400."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

from checkpoints.dashboard import inbox as inbox_views
from tests.browser.common import BROWSER, login, settled
from tests.helpers import ambiguous_run
from tests.views.conftest import make_stuck_run

pytestmark = BROWSER


def test_what_the_pages_send_is_never_refused(browser, live_server, acme, rita, wendy,
                                              monkeypatch):
    from playwright.sync_api import expect

    monkeypatch.setattr(inbox_views, "INBOX_PAGE", 2)
    for n in range(3):
        make_stuck_run(wendy, acme, order_id=f"A-100{n}", key=f"charge:A-100{n}")
    for _ in range(2):
        ambiguous_run(wendy, acme)
    context, page = login(browser, live_server, "rita")
    sent: list[str] = []
    answers: list[tuple[int, str]] = []
    page.on("request", lambda r: sent.append(r.url) if "/t/acme/" in r.url else None)
    page.on("response", lambda r: answers.append((r.status, r.url))
            if "/t/acme/" in r.url else None)

    # The search form (htmx, as one types); 3 digits in a row: a substring search
    # (docs/search.md: shorter terms match id prefixes only).
    page.fill("#inbox-q", "A-100")
    expect(page.locator(".page-range")).to_contain_text("of 3")
    page.select_option("select[name=age]", "300")  # the filter form: hidden state + q
    page.wait_for_url("**age=300**")
    # Each change swaps the inbox, filter form included: act again only once the swap has
    # settled, or the next input lands in the form being replaced (seen on a loaded CI).
    settled(page)
    page.select_option("select[name=age]", "")
    expect(page).not_to_have_url(re.compile(r"age=300"))
    settled(page)
    page.fill("input[name=kind]", "acme.order")
    page.press("input[name=kind]", "Enter")
    page.wait_for_url("**kind=acme.order**")
    settled(page)
    page.click("table.runs thead a")  # sort
    page.wait_for_url("**sort=created**")
    settled(page)
    page.click("a[rel=next]")  # pager
    page.wait_for_url("**cursor=**")
    settled(page)
    page.click("#tabs a.tab >> nth=0")  # a tab, keeping the filters
    page.wait_for_load_state()
    page.fill("#inbox-q", "A-1001")  # the search form again, now with hidden filters
    expect(page.locator("table.runs tbody tr")).to_have_count(1)
    with page.expect_response("**/new-runs/**", timeout=15_000):  # the "n new runs" poll
        pass
    page.goto(f"{live_server.url}/t/acme/audit/")
    page.fill("input[name=q]", "A-1001")
    page.fill("input[name=actor]", "wendy")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**actor=wendy**")
    page.wait_for_load_state("networkidle")
    context.close()

    assert any("/new-runs/" in u for u in sent) and any("cursor=" in u for u in sent)
    for url in sent:
        names = [k for k, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True)]
        assert len(names) == len(set(names)), url
    refused = [(status, url) for status, url in answers if status >= 400]
    assert not refused, refused
