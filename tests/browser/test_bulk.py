"""End to end in headless Chromium (issue 9, item 3): a reviewer filters the inbox,
selects every run on the page, bulk-reconciles them and reads the per-run result table;
without JavaScript the same bar still works as a plain form. (Resubmitting one form, same
client token, is tests/views/test_bulk.py: a browser's Back re-renders the inbox with a
fresh token.)"""

from __future__ import annotations

import re
import uuid

from checkpoints.models import AuditEvent, BulkAction, ReconcileRequest, Run
from checkpoints.vocab import AuditAction, RecoveryState
from tests.browser.common import BROWSER, login, screenshot
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect

pytestmark = BROWSER


def in_doubt(writer, tenant, workflow: str, order: str) -> uuid.UUID:
    run_id = uuid.uuid4()
    put_checkpoint(writer, tenant, envelope(run_id=run_id, payload={
        "phase": "charging", "order_id": order, "workflow": workflow}))
    walk_effect(writer, tenant, effect_body(run_id=run_id, operation_key=f"charge:{order}"),
                "submitted")
    return run_id


def test_a_reviewer_bulk_reconciles_the_runs_of_a_filtered_inbox(browser, live_server, acme,
                                                                 rita, wendy):
    from playwright.sync_api import expect

    billing = {in_doubt(wendy, acme, "billing-eu", f"A-{i}") for i in range(3)}
    shipping = in_doubt(wendy, acme, "shipping", "S-1")
    sweep_later()  # the owners went quiet: all four are ambiguous, reconcilable
    context, page = login(browser, live_server, "rita")
    page.goto(f"{live_server.url}/t/acme/?state=ambiguous")
    rows = page.locator("table.runs tbody tr")
    expect(rows).to_have_count(4)

    # Filter (htmx swaps the inbox and pushes the URL), then "select all on this page".
    page.fill("input[name=subject]", "billing")
    page.press("input[name=subject]", "Enter")
    expect(page).to_have_url(re.compile(r"subject=billing"))
    expect(rows).to_have_count(3)
    page.check("input[data-bulk-page]")
    expect(page.locator("input[name=run]:checked")).to_have_count(3)
    expect(page.locator("[data-bulk-count]")).to_have_text("(3 ticked)")
    screenshot(page, "inbox")

    page.select_option("#bulk-form select[name=action]", "reconcile")
    page.fill("#bulk-form input[name=reason]", "payments outage 14:02")
    page.click("#bulk-form button[type=submit]")

    page.wait_for_url(re.compile(r"/t/acme/bulk/[0-9a-f-]{36}/$"))
    expect(page.locator("h1")).to_contain_text("Bulk reconcile")
    # Without a broker the look-ups ran after each run's commit (no look-up configured:
    # unknown); each row says what its reconciliation found, not "done" (issue 21).
    expect(page.locator(".bulk-counts")).to_contain_text("3 unknown")
    table = page.locator("table.bulk-results tbody tr")
    expect(table).to_have_count(3)
    for i in range(3):
        expect(table.nth(i)).to_contain_text("unknown")
        expect(table.nth(i)).to_contain_text("reconciliation of 1 effect requested")
    screenshot(page, "bulk")
    bulk = BulkAction.objects.get()
    reconciled = {r.run.uuid for r in ReconcileRequest.objects.select_related("run")}
    assert reconciled == billing and shipping not in reconciled
    events = AuditEvent.objects.filter(action=AuditAction.RUN_RECONCILE)
    assert {e.run_uuid for e in events} == billing
    assert all(e.after["bulk_id"] == str(bulk.uuid) for e in events)

    # A run's link leads to its page.
    table.first.locator("a").click()
    expect(page).to_have_url(re.compile(r"/t/acme/runs/"))
    context.close()


def test_without_javascript_the_bulk_bar_is_a_plain_form(browser, live_server, acme, rita,
                                                          wendy):
    from playwright.sync_api import expect

    runs = [in_doubt(wendy, acme, "billing-eu", f"A-{i}") for i in range(2)]
    sweep_later()
    context, page = login(browser, live_server, "rita", java_script_enabled=False)
    page.goto(f"{live_server.url}/t/acme/?state=ambiguous")
    expect(page.locator("input[data-bulk-page]")).to_be_hidden()  # needs the script
    page.check(f"input[name=run][value='{runs[0]}']")
    page.select_option("#bulk-form select[name=action]", "close")
    page.fill("#bulk-form input[name=reason]", "refunded by hand")
    page.check("#bulk-form input[name=confirm]")
    page.click("#bulk-form button[type=submit]")
    page.wait_for_url(re.compile(r"/t/acme/bulk/[0-9a-f-]{36}/$"))
    expect(page.locator("table.bulk-results tbody tr")).to_have_count(1)
    expect(page.locator("table.bulk-results")).to_contain_text("closed")
    assert Run.objects.get(uuid=runs[0]).recovery_state == RecoveryState.CLOSED
    assert Run.objects.get(uuid=runs[1]).recovery_state == RecoveryState.AMBIGUOUS
    context.close()
