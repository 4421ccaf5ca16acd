"""End to end in headless Chromium: a reviewer reconciles a run whose charge is in doubt,
reads the reconciliation's look-up and reveals what the payment service answered
(audited), is led to the run's end state, closes it (with a confirmation), and finds it in
the inbox's closed tab."""

from __future__ import annotations

import re
import uuid

import pytest
from django.db import connections

from checkpoints import services
from checkpoints.models import AuditEvent, Run
from checkpoints.reconcile import Answer
from tests.browser.common import BROWSER, login
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect
from tests.views.reconcilers import Scripted

pytestmark = BROWSER


@pytest.fixture
def scripted(acme):
    services.reconciler_configure(actor=None, tenant=acme, service="payments",
                                  plugin="tests.views.reconcilers.Scripted")
    Scripted.answers = [Answer.found(
        {"charge_id": "ch_42"}, "payments: charge ch_42 succeeded",
        evidence={"status": "succeeded", "charge_id": "ch_42", "gateway_ref": "gw-4242"})]
    yield Scripted
    Scripted.answers = []


def test_it_lets_a_reviewer_reconcile_reveal_the_evidence_and_close_the_run(
        browser, live_server, acme, rita, wendy, scripted):
    from playwright.sync_api import expect

    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charging",
                                                                  "order_id": "A-8"}))
    walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key="charge:A-8"),
                "submitted")
    sweep_later()
    context, page = login(browser, live_server, "rita")
    page.goto(f"{live_server.url}/t/acme/runs/{run_id}/")
    expect(page.locator("#reconciliation")).to_contain_text("No reconciliation has been requested")

    # Reconcile: the in-process worker asks the payment service before the page comes back.
    page.fill("#f-reconcile input[name=reason]", "worker died after submit")
    page.click("#f-reconcile button[type=submit]")
    section = page.locator("#reconciliation")
    expect(section.locator("tbody.reconcile-request")).to_have_attribute("data-state", "done")
    expect(section).to_contain_text("confirmed")
    expect(page.locator("#next-step")).to_contain_text("Reconciliation confirmed payments charge:A-8")
    expect(page.locator("#retry-preview")).to_contain_text("replays the confirmed receipt")

    # The look-up's evidence stays hidden until revealed, with a reason, audited.
    expect(page.locator("body")).not_to_contain_text("gw-4242")
    section.locator("summary", has_text="1 look-up").click()
    reveal = section.locator("form[id^='f-evidence-']")
    reveal.locator("input[name=reason]").fill("which charge is it?")
    reveal.locator("button[type=submit]").click()
    expect(section.locator("pre.payload")).to_contain_text("gw-4242")
    expect(page.locator("#audit-panel tr[data-action='evidence.reveal']")).to_contain_text("rita")

    # Close: behind a disclosure, with a reason and a confirmation dialog (app.js; the
    # box a page without JavaScript shows is hidden and ticked when the dialog is accepted).
    page.click("details.close-run summary")
    page.fill("#f-close input[name=reason]", "customer refunded by hand")
    expect(page.locator("#f-close input[name=confirm]")).to_be_hidden()
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("#f-close button[type=submit]")  # dismissed: nothing is sent
    expect(page.locator("#run-state")).to_have_text("ambiguous")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#f-close button[type=submit]")
    expect(page.locator("#run-state")).to_have_text("closed")
    expect(page.locator("#closed-note")).to_contain_text("rita")
    expect(page.locator("#closed-note")).to_contain_text("customer refunded by hand")
    expect(page.locator("#closed-note")).to_contain_text("reopens it")

    # The back link leads to the closed tab, which lists the run.
    page.click("#back-link")
    page.wait_for_url(re.compile(r".*\?state=closed$"))
    expect(page.locator(".tab.active")).to_contain_text("closed")
    expect(page.locator(".tab.active .count")).to_have_text("1")
    expect(page.locator(f"a[title='{run_id}']")).to_have_count(1)
    page.wait_for_load_state("networkidle")
    context.close()
    assert Run.objects.get(uuid=run_id).recovery_state == "closed"
    assert AuditEvent.objects.filter(action="evidence.reveal").count() == 1
    connections.close_all()
