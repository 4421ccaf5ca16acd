"""Relative times keep telling the truth while a page stays open (stop 36; the older notes'
"relative times on a page do not tick"): a reviewer who leaves a run page open for an
hour reads "1 h ago", not the "12 s ago" the page was drawn with.

``templatetags.dashboard.when`` writes the request's database time beside each time
(``data-now``); ``static/js/app.js`` adds how long the page has shown it. The browser's
clock is Playwright's fake one, moved forward: no test sleeps. The script's words are
``selectors.nextstep.ago``'s, held to one generated table."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta

from checkpoints.selectors import nextstep
from tests.browser.common import BROWSER, login
from tests.views.conftest import make_stuck_run

pytestmark = BROWSER


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _seconds_table() -> list[float]:
    """Every unit's boundaries (one below, at, one above, and their multiples), both
    directions, and a seeded sample in between; and fractions of a second on both sides
    of each (a time under a second ahead is "in 0 s", not "0 s ago")."""
    sizes = (1, 60, 3600, 86400)
    table = {0, 1, -1}
    for size in sizes:
        for k in (1, 2, 59, 60, 23, 24, 365):
            for d in (-1, 0, 1):
                table.update({k * size + d, -(k * size + d)})
    sample = random.Random(36)
    table.update(sample.randint(-10**8, 10**8) for _ in range(300))
    table.update(s + f for s in list(table) for f in (0.25, -0.75) if abs(s) < 10**6)
    return sorted(table)


def test_the_scripts_words_are_the_servers(browser, live_server):
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{live_server.url}/login/")
    table = _seconds_table()
    said = page.evaluate("(table) => table.map((s) => window.recoveryAgoWords(s))", table)
    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    expected = [nextstep.ago(now - timedelta(seconds=s), now) for s in table]
    assert [(s, w) for s, w, e in zip(table, said, expected, strict=True) if w != e] == []
    context.close()


def test_a_run_pages_times_tick_while_it_stays_open(browser, live_server, acme, rita, wendy):
    from playwright.sync_api import expect

    stuck = make_stuck_run(wendy, acme)
    context, page = login(browser, live_server, "rita")
    page.clock.install()
    page.goto(f"{live_server.url}/t/acme/runs/{stuck.run_id}/")
    last_write = page.locator("dt:text('Last write') + dd time")
    drawn_now = _parse(last_write.get_attribute("data-now"))
    at = _parse(last_write.get_attribute("datetime"))
    age = (drawn_now - at).total_seconds()
    assert 0 <= age < 86400  # the sweep aged the run by an hour
    drawn = nextstep.ago(at, drawn_now)
    expect(last_write.locator(".rel")).to_have_text(drawn)
    times = page.locator("time[data-now]").count()
    assert times >= 3

    shown = 0
    for step, label in ((600, "00:10:00"), (3 * 3600, "03:00:00"), (2 * 86400, "48:00:00")):
        page.clock.fast_forward(label)
        shown += step
        # The real time the test itself takes between drawing and reading is a few
        # seconds at most: any of those words is right, the page as drawn is not.
        right = {nextstep.ago(at, drawn_now + timedelta(seconds=shown + slack))
                 for slack in range(0, 16)}
        text = last_write.locator(".rel").inner_text()
        assert text in right, (text, right)
        if step > 3600:
            assert text != drawn
    # Every time on the page moved on, not only the one looked at.
    assert page.locator("time[data-now] .rel", has_text="s ago").count() == 0
    assert page.locator("time[data-now] .rel", has_text="min ago").count() == 0
    context.close()


def test_today_is_the_servers_not_a_browser_clock_that_is_off(browser, live_server, acme, rita,
                                                              wendy):
    """A time of the server's today shows its clock time alone ("· 14:02:11"), another
    day's with its date, judged by ``data-now`` (the database's clock): a browser whose
    clock runs three days ahead dated every time on the page (the attack's note)."""
    stuck = make_stuck_run(wendy, acme)
    context, page = login(browser, live_server, "rita", timezone_id="UTC")
    page.clock.install(time=datetime.now(UTC) + timedelta(days=3))
    page.goto(f"{live_server.url}/t/acme/runs/{stuck.run_id}/")
    last_write = page.locator("dt:text('Last write') + dd time")
    drawn_now = _parse(last_write.get_attribute("data-now"))
    at = _parse(last_write.get_attribute("datetime"))
    shown = last_write.locator(".abs").inner_text()
    dated = bool(re.search(r"\d{4}", shown))  # "Dec 7, 2026 13:02:11" carries a year
    assert dated == (at.date() != drawn_now.date()), shown
    context.close()
