"""The notification round's health (issue 21, item 5): ``/readyz`` names
``notifications`` when an event or a due message waits too long (database clock, aged),
and ``/metrics`` carries the gauges the Prometheus rules read."""

from __future__ import annotations

import pytest

from checkpoints import heartbeat, services
from checkpoints.jobs import inprocess, notify
from checkpoints.models import NotificationOutbox
from tests.helpers import age_world

pytestmark = pytest.mark.django_db


def test_readyz_names_notifications_when_a_due_message_waits(client, acme, adam, settings):
    endpoint, _ = services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "m", "channel": "email", "email": "ops@example.com",
        "event_types": ["digest"]})
    services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    assert client.get("/readyz").json()["checks"]["notifications"] == "ok"
    age_world(settings.RECOVERY_NOTIFY_STALE_S + 1)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["notifications"] == "failed: NotificationsLate"
    notify.notify_round()  # the round runs again: delivered
    assert client.get("/readyz").json()["checks"]["notifications"] == "ok"
    assert heartbeat.NOTIFY in heartbeat.read()


def test_readyz_names_notifications_when_the_outbox_is_not_drained(client, acme, adam,
                                                                  settings):
    assert client.get("/readyz").json()["checks"]["notifications"] == "not configured"
    services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "m", "channel": "email", "email": "ops@example.com",
        "event_types": ["digest"]})
    NotificationOutbox.objects.create(tenant=acme, event_type="reconcile.gave_up")
    age_world(settings.RECOVERY_NOTIFY_STALE_S + 1)
    assert client.get("/readyz").json()["checks"]["notifications"] == \
        "failed: NotificationsLate"


def test_metrics_carry_the_notification_gauges(client, acme, adam, settings):
    settings.RECOVERY_METRICS_TOKEN = "t0ken"
    endpoint, _ = services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "m", "channel": "email", "email": "ops@example.com",
        "event_types": ["digest"]})
    services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    age_world(90)
    services.endpoint_update(actor=adam, tenant=acme, endpoint_id=endpoint.uuid,
                             body={"enabled": False})
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken").content.decode()
    assert 'recovery_notification_messages{state="pending",tenant="acme"} 1.0' in text
    assert 'recovery_notification_messages{state="failed",tenant="acme"} 0.0' in text
    assert 'recovery_notification_endpoints_disabled{tenant="acme"} 1.0' in text
    line = next(x for x in text.splitlines()
                if x.startswith('recovery_notification_oldest_pending_seconds{tenant="acme"}'))
    assert 89 <= float(line.split()[-1]) <= 100


def test_the_in_process_worker_runs_the_notification_round(acme):
    stats = inprocess.run_once()
    assert stats["notify"]["send"]["sent"] == 0
    assert heartbeat.NOTIFY in heartbeat.read()
