"""End to end in headless Chromium under the Content-Security-Policy (issue 6): a reviewer
logs in, switches inbox tabs, filters the inbox (an htmx swap with a pushed URL), opens a
run, reveals a payload, opens a diff, marks an effect's outcome unknown (an htmx form and
the audit panel's triggered refresh), opens the report (SVG bars); the admin login page
is loaded too. Every htmx swap happens in place (no page load), and the browser reports no
CSP violation: neither in its console nor as a ``securitypolicyviolation`` event. A last
step injects an inline script to show that a violation would have been seen."""

from __future__ import annotations

import uuid

from django.db import connections

from tests.browser.common import BROWSER
from tests.conftest import PASSWORD
from tests.helpers import effect_body, envelope, put_checkpoint, sweep_later, walk_effect

pytestmark = BROWSER

# Collects every CSP violation of every document in the context (Playwright adds init
# scripts outside the page's policy, so this runs even where inline code would not).
WATCH_CSP = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


class CspWatch:
    """What the browser said about the policy: console errors and violation events."""

    def __init__(self, context):
        self.console: list[str] = []
        self.events: list[str] = []
        context.add_init_script(WATCH_CSP)
        context.on("page", self.watch)

    def watch(self, page):
        page.on("console", lambda msg: self.console.append(msg.text)
                if "Content Security Policy" in msg.text else None)

    def collect(self, page) -> None:
        """Adds the current document's violation events (call before leaving a page)."""
        self.events += page.evaluate("window.__cspViolations || []")
        page.evaluate("window.__cspViolations = []")

    def violations(self, page) -> list[str]:
        self.collect(page)
        return self.console + self.events


def mark_document(page) -> None:
    """A flag that only a real page load removes: still there after a swap means htmx."""
    page.evaluate("window.__sameDocument = true")


def same_document(page) -> bool:
    return page.evaluate("window.__sameDocument === true")


def test_the_dashboard_works_under_the_content_security_policy(
        browser, live_server, acme, rita, wendy):
    from playwright.sync_api import expect

    run_id, cp_id = uuid.uuid4(), uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(cp_id, run_id, 0, payload={"phase": "ready",
                                                                    "order_id": "A-77"}))
    put_checkpoint(wendy, acme, envelope(cp_id, run_id, 1, payload={
        "phase": "charging", "order_id": "A-77", "amount_cents": 4242}), expected=0)
    walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key="charge:A-77"),
                "submitted")
    sweep_later()
    base = live_server.url

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    watch = CspWatch(context)
    page = context.new_page()
    page.set_default_timeout(15_000)

    # Log in (a plain form post under form-action 'self').
    page.goto(f"{base}/login/")
    page.fill("#id_username", "rita")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/t/acme/**")
    expect(page.locator(".tab.active")).to_contain_text("ambiguous")
    assert page.evaluate("typeof window.htmx") == "object"  # the vendored script ran

    # Switch tabs (links), then filter: htmx swaps the inbox and pushes the URL.
    watch.collect(page)
    page.locator(".tab", has_text="all").click()
    expect(page.locator(".tab.active")).to_contain_text("all")
    watch.collect(page)
    page.locator(".tab", has_text="ambiguous").click()
    expect(page.locator(".tab.active")).to_contain_text("ambiguous")
    mark_document(page)
    page.select_option("form.filters select[name=age]", index=1)
    page.wait_for_url("**age=**")
    expect(page.locator("#inbox-main")).to_be_visible()
    assert same_document(page), "the filter reloaded the page instead of an htmx swap"
    page.goto(f"{base}/t/acme/")

    # The run page.
    watch.collect(page)
    page.click(f"a[title='{run_id}']")
    page.wait_for_url(f"{base}/t/acme/runs/{run_id}/?back=**")
    expect(page.locator("#run-state")).to_have_text("ambiguous")
    mark_document(page)

    # Reveal a payload: swapped into its slot, audited, the audit panel refreshes itself.
    reveal = page.locator("form[id^='f-reveal-']")
    reveal.locator("select[name=revision]").select_option("1")
    reveal.locator("input[name=reason]").fill("check the amount")
    reveal.locator("button[type=submit]").click()
    expect(page.locator(".payload-slot pre.payload")).to_contain_text('"amount_cents": 4242')
    expect(page.locator("#audit-panel tr[data-action='payload.reveal']")).to_have_count(1)

    # The diff of r0 -> r1.
    diff = page.locator("form[id^='f-diff-']")
    diff.locator("input[name=reason]").fill("what changed")
    diff.locator("button[type=submit]").click()
    expect(page.locator(".payload-slot pre.diff")).to_contain_text("amount_cents")
    expect(page.locator(".payload-slot pre.diff .d-add").first).to_be_visible()

    # A form that changes state: mark the in-doubt effect's outcome unknown.
    unknown = page.locator("form[id^='f-unknown-']")
    unknown.locator("input[name=reason]").fill("gateway has no lookup")
    page.once("dialog", lambda dialog: dialog.accept())  # irreversible: app.js asks first
    unknown.locator("button[type=submit]").click()
    expect(page.locator("#run-state")).to_have_text("unknown outcome")
    expect(page.locator("#audit-panel tr[data-action='effect.mark_unknown']")).to_have_count(1)
    assert same_document(page), "an action reloaded the page instead of an htmx swap"

    # static/js/app.js (the script that used to be inline) still reports server errors.
    page.evaluate("document.dispatchEvent(new CustomEvent('htmx:responseError', "
                  "{detail: {xhr: {status: 503}}}))")
    expect(page.locator("#flash")).to_contain_text("The server answered 503")

    # The report's bars are SVG (no style attributes).
    watch.collect(page)
    page.goto(f"{base}/t/acme/report/")
    expect(page.locator("svg.bar-svg rect.bar-fill").first).to_be_attached()
    watch.collect(page)

    # The API's Swagger UI (drf-spectacular's split view, its script from /static/): it
    # draws the schema, with no inline style or script.
    page.goto(f"{base}/api/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("recovery")
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible()
    page.locator(".swagger-ui .opblock-summary").first.click()
    expect(page.locator(".swagger-ui .opblock-body").first).to_be_visible()
    watch.collect(page)

    # Django's admin login page under the same policy.
    page.goto(f"{base}/admin/login/")
    expect(page.locator("#login-form")).to_be_visible()

    assert watch.violations(page) == []

    # The watch sees a violation when there is one: an inline script is refused.
    page.evaluate("""() => { const s = document.createElement("script");
                             s.textContent = "window.__ran = true"; document.body.append(s); }""")
    expect(page.locator("body")).to_be_attached()
    page.wait_for_function("window.__cspViolations.length > 0")
    assert page.evaluate("window.__ran === undefined")
    assert any("script-src" in v for v in watch.violations(page))

    page.wait_for_load_state("networkidle")
    context.close()
    connections.close_all()
