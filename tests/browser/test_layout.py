"""Time and words for people, on a phone (issue 9, item 5), in headless Chromium at
390×844 in the Asia/Tokyo time zone: the inbox, a run page with long ids, a long
operation key, a long lease owner, a long reason and revealed JSON, the audit log and the
report are never wider than the screen; every ``<time>`` shows the local absolute time
(UTC+9) beside the relative words, the zone named once in the footer; a copy button copies the full value; marking an
outcome unknown asks first (dismissed: nothing is sent) and the audit trail says what
happened in a sentence, with its JSON behind a toggle."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta

from django.db import connections

from checkpoints import services
from checkpoints.models import AuditEvent, Effect
from tests.browser.common import BROWSER, login
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect

pytestmark = BROWSER

PHONE = {"width": 390, "height": 844}
# Long values with no place to break a line (no space, no hyphen).
OWNER = "worker_" + "euwest1_payments_pod_7f9c4b6d8_" * 6 + "x2k9q"
KEY = "charge:" + "order_A1003_customer_4242_attempt_" * 5 + "7"
LONG_REASON = "gateway_has_no_lookup_endpoint_" * 12 + "so_nobody_can_tell"
CHARGED_MS = 1764547200000  # 2025-12-01T00:00:00Z


# The elements that stick out of the viewport, outside any scrolling box (for the message).
WIDE = """() => {
  const limit = document.documentElement.clientWidth, out = [];
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.right <= limit + 0.5 || r.width === 0) continue;
    let p = el.parentElement, clipped = false;
    for (; p && p !== document.body; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if (o === "auto" || o === "scroll" || o === "hidden") { clipped = true; break; }
    }
    if (!clipped) {
      out.push(el.tagName.toLowerCase() + "." + [...el.classList].join(".") + " "
               + Math.round(r.right));
    }
  }
  return out.slice(0, 8);
}"""


def no_overflow(page) -> bool:
    """Nothing on the page is wider than the viewport (no sideways scrolling):
    ``scrollWidth <= clientWidth``. Prints what sticks out when something does."""
    fits = page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    if not fits:
        print("wider than the viewport:", page.evaluate(WIDE))
    return fits


def test_a_reviewer_on_a_phone_reads_times_words_and_long_values(
        browser, live_server, acme, rita, wendy):
    from playwright.sync_api import expect

    run_id, cp_id = uuid.uuid4(), uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(cp_id, run_id, 0, payload={
        "phase": "charging", "order_id": "A-1003", "charged_at_ms": CHARGED_MS,
        "note": "n" * 300}))
    token = services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner=OWNER,
                                   ttl_s=30).fencing_token
    walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key=KEY), "submitted",
                token=token)
    walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key="refund:A-1003",
                                         service="refunds"), "submitted", token=token)
    sweep_later()
    refund = Effect.objects.get(operation_key="refund:A-1003")
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=refund.uuid,
                                 reason=LONG_REASON)
    base = live_server.url

    context, page = login(browser, live_server, "rita", **PHONE, timezone_id="Asia/Tokyo",
                          permissions=["clipboard-read", "clipboard-write"])
    # The inbox (every tab's rows: the long lease owner and reason are in the table).
    page.goto(f"{base}/t/acme/?state=all")
    expect(page.locator(f"a[title='{run_id}']")).to_be_visible()
    assert no_overflow(page), "the inbox is wider than 390 px"

    # The run page: long ids, key, owner and reason fit; times are local.
    page.goto(f"{base}/t/acme/runs/{run_id}/")
    expect(page.locator("#run-state")).to_have_text("unknown outcome")
    assert no_overflow(page), "the run page is wider than 390 px"
    last_write = page.locator("dt:text('Last write') + dd time")
    # The zone is named once, in the footer; each time shows the local clock.
    expect(page.locator("#tz-note")).to_have_text(
        "Times are in Asia/Tokyo (UTC+9); hover a time for its date, offset and UTC.")
    assert "(Asia/Tokyo)" not in last_write.inner_text()
    utc = datetime.fromisoformat(last_write.get_attribute("datetime").replace("Z", "+00:00"))
    tokyo = (utc + timedelta(hours=9)).strftime("%H:%M:%S")
    expect(last_write).to_contain_text(f"ago · {tokyo}")
    assert "GMT+9" in last_write.get_attribute("title")
    assert utc.strftime("%Y-%m-%d %H:%M:%S") + " UTC" in last_write.get_attribute("title")
    # Every time on the page has been localised.
    times = page.locator("time[datetime]")
    assert times.count() >= 5
    assert page.locator("time[datetime]:not([data-local])").count() == 0

    # The copy button copies the whole lease owner (the cell shows it clipped).
    owner = page.locator("dt:text('Owner') + dd")
    expect(owner.locator(".long")).to_have_attribute("title", OWNER)
    owner.locator("button[data-copy]").click()
    expect(owner.locator("button[data-copy]")).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == OWNER

    # The revealed payload shows its epoch milliseconds as a time, on one screen width.
    reveal = page.locator("form[id^='f-reveal-']")
    reveal.locator("input[name=reason]").fill("what was charged")
    reveal.locator("button[type=submit]").click()
    payload = page.locator(".payload-slot pre.payload")
    expect(payload).to_contain_text(f'"charged_at_ms": {CHARGED_MS}')
    expect(payload.locator(".ms-note time")).to_have_attribute("datetime", "2025-12-01T00:00:00.000Z")
    expect(payload.locator(".ms-note time")).to_contain_text("09:00:00")
    expect(page.locator(".payload-title .writer-clock time")).to_have_attribute("data-local",
                                                                               re.compile("."))
    assert no_overflow(page), "the revealed payload is wider than 390 px"

    # Mark unknown asks first: dismissed, nothing is sent; accepted, it is done.
    unknown = page.locator("form[id^='f-unknown-']")
    expect(unknown).to_have_count(1)
    expect(unknown.locator("input[name=confirm]")).to_be_hidden()
    unknown.locator("input[name=reason]").fill("gateway has no lookup")
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    unknown.locator("button[type=submit]").click()
    page.wait_for_timeout(300)
    assert asked and KEY in asked[0] and "cannot be undone" in asked[0]
    assert AuditEvent.objects.filter(action="effect.mark_unknown").count() == 1
    page.once("dialog", lambda d: d.accept())
    unknown.locator("button[type=submit]").click()
    row = page.locator("#audit-panel tr[data-action='effect.mark_unknown']").first
    expect(row.locator(".sentence")).to_have_text(
        f"rita marked {KEY} at payments outcome unknown: gateway has no lookup")
    expect(row.locator("time")).to_have_attribute("data-local", re.compile("."))  # after the swap
    expect(row.locator("pre.json").first).to_be_hidden()  # the JSON is behind a toggle
    row.locator("details.event-json summary").click()
    expect(row.locator("pre.json").last).to_contain_text('"state": "unknown"')
    assert no_overflow(page), "the run page is wider than 390 px after the action"

    # The audit log and the report.
    page.goto(f"{base}/t/acme/audit/")
    expect(page.locator("tr[data-action='run.ambiguous'] .sentence").first).to_contain_text(
        "system moved the run")
    expect(page.locator("tr[data-action='effect.mark_unknown'] .sentence").last).to_contain_text(
        LONG_REASON)
    assert no_overflow(page), "the audit log is wider than 390 px"
    page.goto(f"{base}/t/acme/report/")
    expect(page.locator("h1")).to_contain_text("Report")
    assert no_overflow(page), "the report is wider than 390 px"

    page.wait_for_load_state("networkidle")
    context.close()
    connections.close_all()
