"""The demo's webhook receiver (issue 21): each delivery logged with its headers, its
Standard Webhooks signature checked (signed here by the independent ``standardwebhooks``
package), a wrong or rotated-out signature shown as not verifying, a redelivery marked as a
duplicate, and a page listing them."""

from __future__ import annotations

import base64
import json
import os
import urllib.request
from datetime import UTC, datetime

import pytest

from checkpoints.demo.receiver import Receiver, verify

standardwebhooks = pytest.importorskip("standardwebhooks")

SECRET = "whsec_" + base64.b64encode(os.urandom(24)).decode()
OTHER = "whsec_" + base64.b64encode(os.urandom(24)).decode()


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(tmp_path / "deliveries.jsonl", SECRET).start()
    yield r
    r.stop()


def deliver(receiver, body: dict, *, secret=SECRET, msg_id="evt_" + "a" * 32, extra=""):
    raw = json.dumps(body)
    now = datetime.now(UTC)
    signature = standardwebhooks.Webhook(secret).sign(msg_id, now, raw)
    req = urllib.request.Request(
        receiver.url + "/hook", data=raw.encode(), method="POST",
        headers={"Content-Type": "application/json", "webhook-id": msg_id,
                 "webhook-timestamp": str(int(now.timestamp())),
                 "webhook-signature": f"{extra} {signature}".strip()})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status


def test_it_logs_each_delivery_and_whether_its_signature_verifies(receiver):
    body = {"type": "run.needs_review", "timestamp": "2026-12-05T00:00:00Z",
            "data": {"tenant": "acme", "run_count": 3}}
    assert deliver(receiver, body) == 204
    assert deliver(receiver, body, secret=OTHER, msg_id="evt_" + "b" * 32) == 204
    # During a rotation the header carries the old and the new signature: one suffices.
    assert deliver(receiver, body, msg_id="evt_" + "c" * 32, extra="v1,bm9wZQ==") == 204
    assert deliver(receiver, body) == 204  # a retry: same id
    log = receiver.deliveries()
    assert [d["verified"] for d in log] == [True, False, True, True]
    assert [d["duplicate"] for d in log] == [False, False, False, True]
    assert json.loads(log[0]["body"]) == body
    assert log[0]["headers"]["webhook-id"] == "evt_" + "a" * 32
    with urllib.request.urlopen(receiver.url + "/", timeout=5) as resp:
        page = resp.read().decode()
    assert "4 deliveries" in page and "SIGNATURE DOES NOT VERIFY" in page
    assert "run.needs_review" in page


def test_verify_refuses_a_tampered_body_and_a_bad_secret():
    raw = b'{"type": "test"}'
    now = datetime.now(UTC)
    sig = standardwebhooks.Webhook(SECRET).sign("evt_1", now, raw.decode())
    ts = str(int(now.timestamp()))
    assert verify(SECRET, "evt_1", ts, raw, sig)
    assert not verify(SECRET, "evt_1", ts, raw + b" ", sig)
    assert not verify(SECRET, "evt_2", ts, raw, sig)
    assert not verify("whsec_not base64!", "evt_1", ts, raw, sig)


@pytest.mark.django_db
def test_the_demo_endpoint_is_audited_and_its_secret_verifies_a_crashed_runs_message(
        tmp_path, acme, adam, wendy, settings):
    """``manage.py demo``'s acme endpoint: made by the endpoint service (audited as
    acme-admin's), and the secret it returns, handed to the receiver, verifies what the
    notification round posts for runs whose worker died (one incident message)."""
    from checkpoints.jobs import notify
    from checkpoints.management.commands.demo import DEMO_WINDOW_S, Command
    from checkpoints.models import AuditEvent, NotificationEndpoint
    from tests.helpers import age_world, envelope, put_checkpoint, sweep_later

    receiver = Receiver(tmp_path / "demo-receiver.jsonl", "").start()
    try:
        command = Command()
        command.accounts = {"acme-admin": adam}
        secret = command._webhook_endpoint(receiver.url + "/hook")
        receiver.secret = secret  # what the demo passes in RECOVERY_DEMO_WEBHOOK_SECRET
        endpoint = NotificationEndpoint.objects.for_tenant(acme).get()
        assert secret.startswith("whsec_") and endpoint.group_window_s == DEMO_WINDOW_S
        event = AuditEvent.objects.filter(tenant=acme,
                                          action="notification_endpoint.create").get()
        assert event.actor_name == adam.username and secret not in json.dumps(event.after)

        settings.RECOVERY_NOTIFY_ALLOW_PRIVATE = True  # the demo's web server's environment
        runs = set()
        for order in ("A-1", "A-2"):  # two workers die in flight; one sweep finds both
            body = envelope(payload={"phase": "charging", "order_id": order})
            put_checkpoint(wendy, acme, body)
            runs.add(body["run_id"])
        sweep_later()
        notify.notify_round()  # the window is open: nothing yet
        assert receiver.deliveries() == []
        age_world(DEMO_WINDOW_S)
        notify.notify_round()
    finally:
        receiver.stop()
    (delivery,) = receiver.deliveries()
    assert delivery["verified"] and not delivery["duplicate"]
    body = json.loads(delivery["body"])
    assert body["type"] == "run.needs_review" and body["data"]["run_count"] == 2
    assert {run["id"] for run in body["data"]["runs"]} == runs
