"""The report in headless Chromium (issue 9, item 6): a viewer opens the report, changes
the range with the range links (an htmx swap in place, the URL pushed) and a custom range
form, the charts change with it; a CSV download of a figure holds its numbers, one header
row and the "as of" time in every row and in its name. No CSP violation on the way. A screenshot of the report is kept for the
README (``docs/screenshots/report.png``, ``make screenshots``)."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from checkpoints import services
from tests.browser.common import BROWSER, login, screenshot
from tests.browser.test_csp import CspWatch, mark_document, same_document
from tests.helpers import ambiguous_run, envelope, put_checkpoint

pytestmark = BROWSER


def _bars(page, figure: str) -> int:
    return page.locator(f"#figure-{figure} svg.chart rect").count()


def _ticks(page, figure: str) -> list[str]:
    """The x axis labels of a series chart (``HH:00`` by hour, ``MM-DD`` by day)."""
    return page.locator(f"#figure-{figure} svg.chart text[text-anchor=middle]").all_text_contents()


def test_a_viewer_changes_the_range_and_downloads_a_csv(browser, live_server, acme, vic, wendy,
                                                        rita):
    for _ in range(3):
        put_checkpoint(wendy, acme, envelope())
    run_id = ambiguous_run(wendy, acme)
    services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="handled by phone")
    context, page = login(browser, live_server, "vic")
    watch = CspWatch(context)
    page.goto(f"{live_server.url}/t/acme/report/?range=24h")
    entering = page.locator("#figure-runs_entering")
    assert entering.get_attribute("data-total") == "6"   # 4 created, ambiguous, closed
    assert _bars(page, "runs_entering") == 3                # one stack: this hour
    assert all(t.endswith(":00") for t in _ticks(page, "runs_entering"))
    assert "by hour" in page.locator(".report-as-of").inner_text()
    screenshot(page, "report", full_page=True)

    # A range link: an htmx swap in place, the URL pushed, the charts drawn again by day.
    mark_document(page)
    page.click("nav.report-ranges a:text-is('30d')")
    page.wait_for_selector("#report-range[data-range='30d']")
    assert same_document(page)
    assert page.url.endswith("/t/acme/report/?range=30d")
    assert "by day" in page.locator(".report-as-of").inner_text()
    assert entering.get_attribute("data-total") == "6"
    assert not any(t.endswith(":00") for t in _ticks(page, "runs_entering"))

    # A custom range in the past: nothing in it, the charts are empty.
    page.fill("#report-custom input[name=from]", "2026-01-01")
    page.fill("#report-custom input[name=to]", "2026-01-31")
    page.click("#report-custom button[type=submit]")
    page.wait_for_selector("#report-range[data-range='custom']")
    assert same_document(page)
    assert "from=2026-01-01" in page.url
    assert page.locator("#figure-runs_entering").get_attribute("data-total") == "0"
    assert _bars(page, "runs_entering") == 0

    # Back to 24 h, then download the runs entering each state as CSV.
    page.click("nav.report-ranges a:text-is('24h')")
    page.wait_for_selector("#report-range[data-range='24h']")
    with page.expect_download() as info:
        page.click("#figure-runs_entering a.csv")
    download = info.value
    assert re.fullmatch(r"acme-runs_entering-24h-as-of-\d{8}T\d{6}Z\.csv",
                        download.suggested_filename), download.suggested_filename
    rows = list(csv.reader(io.StringIO(Path(download.path()).read_text())))
    header = rows[0]
    assert header[0] == "bucket" and header[-3:] == ["from", "to", "as_of"]
    assert {len(r) for r in rows} == {len(header)}
    totals = {name: sum(int(r[i]) for r in rows[1:]) for i, name in enumerate(header)
              if 0 < i < len(header) - 3}
    assert {k: v for k, v in totals.items() if v} == {"healthy": 4, "ambiguous": 1,
                                                      "closed": 1}
    assert not watch.violations(page)
    context.close()
