"""``…/notification-endpoints`` (CONTRACT.md 8; issue 21): admin CRUD, the secret shown
once, a viewer sees no secret and no URL, test event, delivery log, resend."""

from __future__ import annotations

import json

import pytest

from checkpoints.jobs import notify

pytestmark = pytest.mark.django_db

BASE = "/api/v1/tenants/acme/notification-endpoints"


def post(client, path, body=None):
    return client.post(path, data=json.dumps(body) if body is not None else b"",
                       content_type="application/json")


def test_admin_crud_and_what_a_viewer_sees(api_as, acme, adam, vic, receiver,
                                           loopback_allowed):
    admin, viewer = api_as(adam), api_as(vic)
    url = receiver.url
    made = post(admin, BASE, {"name": "hook", "channel": "webhook", "url": url,
                              "event_types": ["run.needs_review"]})
    assert made.status_code == 201, made.content
    secret = made.json()["secret"]
    endpoint = made.json()["endpoint"]
    assert secret.startswith("whsec_") and endpoint["url"] == url
    assert endpoint["secret_hint"] == f"whsec_…{secret[-4:]}"
    eid = endpoint["id"]
    again = admin.get(f"{BASE}/{eid}").json()
    assert secret not in json.dumps(again) and again["secret_hint"].endswith(secret[-4:])
    seen = viewer.get(BASE).json()["results"][0]
    assert seen["url"] is None and seen["secret_hint"] is None
    assert seen["destination"] == "http://127.0.0.1"
    assert "s3cr3t" not in json.dumps(viewer.get(f"{BASE}/{eid}").json())
    assert post(viewer, BASE, {"name": "x"}).status_code == 403
    assert post(viewer, f"{BASE}/{eid}/rotate-secret").status_code == 403
    bad = post(admin, BASE, {"name": "x", "channel": "webhook", "url": url,
                             "event_types": ["nope"]})
    assert bad.status_code == 400 and bad.json()["detail"].startswith("event_types:")
    changed = admin.patch(f"{BASE}/{eid}", data=json.dumps({"group_window_s": 0}),
                          content_type="application/json")
    assert changed.status_code == 200 and changed.json()["group_window_s"] == 0
    rotated = post(admin, f"{BASE}/{eid}/rotate-secret")
    assert rotated.status_code == 200 and rotated.json()["secret"] != secret
    assert rotated.json()["endpoint"]["previous_secret_until"]
    # A test event, the delivery log, a resend with the same id.
    test = post(admin, f"{BASE}/{eid}/test")
    assert test.status_code == 202
    event_id = test.json()["event_id"]
    notify.send_due()
    log = viewer.get(f"{BASE}/{eid}/deliveries").json()["results"]
    assert [m["event_id"] for m in log] == [event_id]
    [attempt] = log[0]["attempt_log"]
    assert (attempt["status_code"], attempt["response_head"]) == (200, "thanks!")
    assert log[0]["state"] == "delivered"
    assert post(viewer, f"{BASE}/{eid}/deliveries/{event_id}/resend").status_code == 403
    resent = post(admin, f"{BASE}/{eid}/deliveries/{event_id}/resend")
    assert resent.status_code == 202 and resent.json()["event_id"] == event_id
    assert post(admin, f"{BASE}/{eid}/deliveries/msg_x/resend").status_code == 404
    assert admin.delete(f"{BASE}/{eid}").status_code == 204
    assert admin.get(f"{BASE}/{eid}").status_code == 404


def test_another_tenant_sees_nothing(api_as, acme, adam, globex, omar):
    made = post(api_as(adam), BASE, {"name": "m", "channel": "email",
                                     "email": "ops@example.com", "event_types": ["digest"]})
    eid = made.json()["endpoint"]["id"]
    other = api_as(omar)
    assert other.get(f"{BASE}/{eid}").status_code == 404
    assert other.get(f"/api/v1/tenants/globex/notification-endpoints/{eid}").status_code == 404
    assert made.json()["secret"] is None
