"""The inbox says what to do, on a phone (issue 21, items 7 and 10), in headless Chromium
at 390×844: every run's state and next step are on screen without sideways scrolling
(``document.documentElement.scrollWidth <= 390``); the header counts the reviewer's and
the approver's work; a run opened from a filtered tab links back to that tab; on the run
page the actions sit right under the next step; an incident reference typed once is
stored on the audit event of the next action."""

from __future__ import annotations

import uuid

from django.db import connections

from checkpoints import services
from checkpoints.models import AuditEvent
from tests.browser.common import BROWSER, login, screenshot
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect
from tests.views.conftest import make_stuck_run

pytestmark = BROWSER

PHONE = {"width": 390, "height": 844}
LONG_OWNER = "worker_" + "euwest1_payments_pod_7f9c4b6d8_" * 4 + "x2k9q"


def _world(acme, wendy, rita):
    """Runs in several situations: in doubt, unknown, settled in flight, awaiting approval."""
    stuck = [make_stuck_run(wendy, acme, order_id=f"P-{i}", key=f"charge:P-{i}-" + "x" * 80)
             for i in range(3)]
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck[1].effect_id,
                                 reason="no lookup")
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck[2].effect_id,
                                 reason="no lookup")
    services.retry_request(actor=rita, tenant=acme, run_id=stuck[2].run_id, reason="again")
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charging"}))
    token = services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id,
                                   owner=LONG_OWNER, ttl_s=1).fencing_token
    walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key="charge:S-1"),
                "submitted", "confirmed", token=token)
    sweep_later()
    return stuck, run_id


def _fits(page, locator) -> bool:
    box = locator.bounding_box()
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390.5


def test_the_inbox_on_a_phone_shows_state_and_next_step(browser, live_server, acme, rita,
                                                        wendy):
    from playwright.sync_api import expect

    stuck, settled = _world(acme, wendy, rita)
    base = live_server.url
    context, page = login(browser, live_server, "rita", **PHONE)
    page.goto(f"{base}/t/acme/?state=all")
    expect(page.locator("#role-work")).to_contain_text(
        "3 runs need a reviewer · 1 needs an approver")
    rows = page.locator("tr[data-run]")
    expect(rows).to_have_count(4)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, \
        "the inbox scrolls sideways at 390 px"
    for i in range(rows.count()):
        row = rows.nth(i)
        for cell in (".state-cell .badge", ".next-step-cell"):
            expect(row.locator(cell)).to_be_visible()
            assert _fits(page, row.locator(cell)), f"row {i}: {cell} is off screen"
    expect(page.locator(f"tr[data-run='{settled}'] .next-step-cell")).to_have_text(
        "payments confirmed · a retry replays it")
    expect(page.locator(f"tr[data-run='{stuck[1].run_id}'] .next-step-cell")).to_have_text(
        "nobody can tell · possible duplicate")
    screenshot(page, "inbox-phone", full_page=True)

    # From a filtered tab to a run and back to that tab.
    page.goto(f"{base}/t/acme/?state=unknown_outcome")
    page.locator(f"a[title='{stuck[1].run_id}']").click()
    page.wait_for_url(f"**/runs/{stuck[1].run_id}/**")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    next_step = page.locator("#next-step")
    expect(next_step).to_contain_text("Nobody can tell whether payments ran")
    actions, identity = page.locator("#actions"), page.locator("section.card h2:text('Identity')")
    step_box, actions_box = next_step.bounding_box(), actions.bounding_box()
    assert step_box["y"] + step_box["height"] <= actions_box["y"] < identity.bounding_box()["y"], \
        "the actions are not right under the next step"
    expect(page.locator("#back-link")).to_have_attribute("href", "/t/acme/?state=unknown_outcome")

    # An incident reference, then an action: its audit event carries the reference.
    page.fill("#incident-ref", "INC-2041")
    page.locator("#incident button[type=submit]").click()
    expect(page.locator("#incident-current")).to_have_text("INC-2041")
    page.fill("#f-retry input[name=reason]", "the gateway has no look-up")
    page.locator("#f-retry button[type=submit]").click()
    expect(page.locator("#run-state")).to_have_text("awaiting approval")
    expect(page.locator("#back-link")).to_have_attribute("href", "/t/acme/?state=unknown_outcome")
    assert AuditEvent.objects.get(action="retry.request",
                                  run_uuid=stuck[1].run_id).incident_ref == "INC-2041"
    page.click("#back-link")
    page.wait_for_url("**/t/acme/?state=unknown_outcome")
    page.wait_for_load_state("networkidle")
    context.close()
    connections.close_all()
