"""End to end in headless Chromium (issue 21, items 8 and 9): pages that move by
themselves, without a reload: a bulk reconcile's result fills in as the look-ups answer,
a run page turns ``completed`` while its runtime resumes it; and the approver's queue,
whose bulk approve skips a possible duplicate.

The state changes are driven from the test through the services (the worker's
``reconciliation.execute``, the runtime's ``resume_claim`` and checkpoint write), not
through the demo supervisor: the live server runs in this process, so they are the same
calls a worker and a runtime make."""

from __future__ import annotations

import re
import uuid

from checkpoints import services
from checkpoints.jobs import reconciliation
from checkpoints.models import ReconcileRequest, RetryRequest
from checkpoints.services import reconcile_requests
from checkpoints.vocab import RetryState
from tests.browser.common import BROWSER, login, screenshot
from tests.helpers import ambiguous_run, envelope, put_checkpoint
from tests.views.conftest import make_stuck_run

pytestmark = BROWSER


def _no_worker(monkeypatch):
    """Requests stay queued for a worker (as with a broker) until the test runs them."""
    monkeypatch.setattr(reconcile_requests, "dispatch",
                        lambda pks, **kw: reconcile_requests.Sent(True, "queued for a worker"))


def test_a_bulk_reconcile_result_fills_in_without_a_reload(browser, live_server, acme, rita,
                                                           wendy, monkeypatch):
    from playwright.sync_api import expect

    _no_worker(monkeypatch)
    runs = [make_stuck_run(wendy, acme, order_id=f"A-{i}", key=f"charge:A-{i}")
            for i in range(3)]
    context, page = login(browser, live_server, "rita")
    page.goto(f"{live_server.url}/t/acme/?state=ambiguous")
    page.check("input[data-bulk-page]")
    page.select_option("#bulk-form select[name=action]", "reconcile")
    page.fill("#bulk-form input[name=reason]", "payments outage 14:02")
    page.click("#bulk-form button[type=submit]")
    page.wait_for_url(re.compile(r"/t/acme/bulk/[0-9a-f-]{36}/$"))
    counts = page.locator(".bulk-counts")
    expect(counts).to_contain_text("3 requested")
    expect(page.locator("table.bulk-results tbody tr[data-outcome=queued]")).to_have_count(3)

    # The worker answers (no look-up configured: "unknown"), one run after another.
    page.evaluate("window.__marker = 1")  # gone if the page reloaded
    for n, stuck in enumerate(runs, start=1):
        reconciliation.execute(ReconcileRequest.objects.get(run__uuid=stuck.run_id).pk)
        expect(counts).to_contain_text(f"{n} unknown", timeout=15_000)
    expect(page.locator("table.bulk-results tbody tr[data-outcome=queued]")).to_have_count(0)
    expect(page.locator("#bulk-live[hx-trigger]")).to_have_count(0)  # stopped polling
    assert page.evaluate("window.__marker") == 1
    screenshot(page, "bulk-live")
    context.close()


def test_a_run_page_turns_completed_without_a_reload(browser, live_server, acme, rita, april,
                                                     wendy):
    from playwright.sync_api import expect

    stuck = make_stuck_run(wendy, acme)
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="no lookup")
    retry = services.retry_request(actor=rita, tenant=acme, run_id=stuck.run_id,
                                   reason="charge unconfirmed")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="dedupes")
    context, page = login(browser, live_server, "rita")
    page.goto(f"{live_server.url}/t/acme/runs/{stuck.run_id}/")
    expect(page.locator("#run-state")).to_have_text("retry approved")
    expect(page.locator("#run-live")).to_contain_text("This page refreshes by itself")
    page.evaluate("window.__marker = 1")

    # The runtime resumes (consuming the approval) and completes the order.
    token = services.resume_claim(actor=wendy, tenant=acme, run_id=stuck.run_id,
                                  asked={})["fencing_token"]
    put_checkpoint(wendy, acme, envelope(stuck.checkpoint_id, stuck.run_id, 2, payload={
        "phase": "completed", "order_id": "A-1042", "amount_cents": 2599}),
        expected=1, token=token)
    expect(page.locator("#run-state")).to_have_text("completed", timeout=15_000)
    expect(page.locator("#run-ended")).to_have_text(re.compile(r"^completed \d+ s ago$"))
    expect(page.locator("#run-live[hx-trigger]")).to_have_count(0)
    assert page.evaluate("window.__marker") == 1  # no reload
    context.close()


def test_the_approvers_queue_bulk_approve_skips_a_possible_duplicate(
        browser, live_server, acme, rita, april, wendy):
    from playwright.sync_api import expect

    stuck = make_stuck_run(wendy, acme, order_id="D-1", key="charge:D-1")
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                 reason="no lookup")
    dup = services.retry_request(actor=rita, tenant=acme, run_id=stuck.run_id,
                                 reason="charge unconfirmed")
    clean = services.retry_request(actor=rita, tenant=acme, run_id=ambiguous_run(wendy, acme),
                                   reason="re-run the step")
    context, page = login(browser, live_server, "april")
    page.click("nav.mainnav a:has-text('Approvals')")
    page.wait_for_url(f"{live_server.url}/t/acme/approvals/")
    expect(page.locator(f"#retry-{dup.pk}")).to_have_class(re.compile("approval-duplicate"))
    expect(page.locator(f"#retry-{dup.pk}")).to_contain_text("1 possible duplicate")
    screenshot(page, "approvals", full_page=True)
    page.check(f"#retry-{dup.pk} input[name=retry]")
    page.check(f"#retry-{clean.pk} input[name=retry]")
    page.fill("#bulk-approve input[name=reason]", "outage over")
    page.click("#bulk-approve button[type=submit]")
    expect(page.locator("#flash")).to_contain_text(f"Approved 1 request: #{clean.pk}")
    expect(page.locator("#flash")).to_contain_text(f"#{dup.pk} (possible duplicate")
    assert RetryRequest.objects.get(pk=clean.pk).state == RetryState.APPROVED
    assert RetryRequest.objects.get(pk=dup.pk).state == RetryState.REQUESTED
    # One at a time, on its row.
    row = page.locator(f"#retry-{dup.pk}")
    row.locator("input[name=reason]").fill("gateway dedupes by key")
    row.locator("button[value=approve]").click()
    expect(page.locator("#flash")).to_contain_text(f"Retry request #{dup.pk} approved")
    expect(page.locator("#flash")).to_contain_text("No other request awaits your decision")
    assert RetryRequest.objects.get(pk=dup.pk).state == RetryState.APPROVED
    assert uuid.UUID(str(stuck.run_id))
    context.close()
