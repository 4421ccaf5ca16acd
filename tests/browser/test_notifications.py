"""End to end in headless Chromium (issue 21, items 1 and 5): the tenant's admin adds a
webhook endpoint on the Notifications page, reads its signing secret once, sends a test
event and finds it in the endpoint's delivery log. The sender runs in-process against a
real receiver on loopback (the operator allows private addresses and plain http here),
which verifies the signature with the secret the page showed."""

from __future__ import annotations

import re

from standardwebhooks import Webhook

from checkpoints.jobs import notify
from checkpoints.models import NotificationEndpoint
from tests.browser.common import BROWSER, login, screenshot
from tests.notifications.receiver import Receiver

pytestmark = BROWSER


def test_an_admin_adds_a_webhook_sees_its_secret_once_and_tests_it(browser, live_server,
                                                                   acme, adam, settings):
    from playwright.sync_api import expect

    settings.RECOVERY_NOTIFY_ALLOW_PRIVATE = True
    settings.RECOVERY_NOTIFY_ALLOW_HTTP = True
    settings.RECOVERY_NOTIFY_TIMEOUT_S = 2
    receiver = Receiver()
    context, page = login(browser, live_server, "adam")
    try:
        page.goto(f"{live_server.url}/t/acme/")
        page.click("nav.mainnav >> text=Notifications")
        expect(page.locator("h1")).to_contain_text("Notifications")
        expect(page.locator("#endpoints")).to_contain_text("No endpoint")

        form = page.locator("#f-endpoint-create")
        form.locator("input[name=name]").fill("on-call")
        form.locator("select[name=channel]").select_option("webhook")
        form.locator("input[name=url]").fill("ftp://nope.example.com/")
        form.locator("button[type=submit]").click()
        expect(page.locator("#new-url-error")).to_contain_text("url:")  # beside the field
        assert not NotificationEndpoint.objects.exists()

        form.locator("input[name=url]").fill(receiver.url)
        form.locator("input[value='reconcile.gave_up']").check()
        form.locator("textarea[name=kinds]").fill("acme.order\nacme.refund")  # one a line
        form.locator("button[type=submit]").click()
        secret = page.locator("#secret-value").inner_text()
        assert re.fullmatch(r"whsec_[A-Za-z0-9+/=]+", secret)
        expect(page.locator("#new-secret")).to_contain_text("never shown again")
        screenshot(page, "notification-secret")
        endpoint = NotificationEndpoint.objects.get()
        assert endpoint.kinds == ["acme.order", "acme.refund"]

        # Another visit shows only the hint.
        page.goto(f"{live_server.url}/t/acme/notifications/{endpoint.uuid}/")
        expect(page.locator("#endpoint")).to_contain_text("whsec_…" + secret[-4:])
        assert secret not in page.content()

        page.click("#endpoint-test")
        expect(page.locator("#flash")).to_contain_text("Test event")
        rows = page.locator("table.deliveries tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("pending")
        assert notify.send_due()["delivered"] == 1  # the sender, in-process
        page.reload()
        expect(rows.first).to_contain_text("delivered")
        expect(rows.first).to_contain_text("200")
        expect(rows.first).to_contain_text("thanks!")
        screenshot(page, "notification-log")
        [(headers, body)] = receiver.seen
        assert Webhook(secret).verify(body, headers)["type"] == "test"
        assert rows.first.locator(".mono").first.inner_text() == "test"
        expect(rows.first).to_contain_text(headers["webhook-id"])
    finally:
        context.close()
        receiver.close()
