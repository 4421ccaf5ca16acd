"""Notification endpoints and the sender under concurrency on real PostgreSQL (issue 21;
tests/transactional/test_race_matrix.py names these races): threads released together on
a barrier, each on its own connection, and the database decides.

- senders claiming at once (``claim_due``, ``SKIP LOCKED``): each due message is claimed
  by exactly one sender, and every due message by one;
- two admins resending one failed message (``notification_resend``): one resend, the
  other refused (the message is pending again), one audit event;
- creates racing for the tenant's last endpoint (``endpoint_create``, the cap counted
  under the tenant's audit head): exactly one more endpoint;
- several senders disabling one endpoint failing for days (``disable_failing``): it is
  disabled once, with one system audit event.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.conf import settings

from checkpoints import services
from checkpoints.dbclock import NOW
from checkpoints.exceptions import InvalidPayload, InvalidTransition
from checkpoints.models import AuditEvent, NotificationEndpoint, NotificationMessage
from checkpoints.services import notify_delivery, notify_endpoints
from checkpoints.vocab import AuditAction, DeliveryState
from tests.conftest import _person
from tests.helpers import age_world
from tests.transactional.test_races import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

BODY = {"name": "ops", "channel": "webhook", "url": "https://hooks.example.com/in",
        "event_types": ["run.needs_review"]}
ROUNDS = 4


def _endpoint(acme, adam, name="ops"):
    return services.endpoint_create(actor=adam, tenant=acme, body=dict(BODY, name=name))[0]


def test_senders_claiming_at_once_take_each_due_message_once(acme, adam):
    endpoint = _endpoint(acme, adam)
    for _ in range(30):
        services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    results = race(6, lambda _i: notify_delivery.claim_due(limit=10))
    assert not [r for r in results if isinstance(r, Exception)], results
    claimed = Counter(c.pk for r in results for c in r)
    assert max(claimed.values()) == 1, "a message claimed by two senders"
    assert len(claimed) == 30, "a due message no sender took"
    assert not NotificationMessage.objects.filter(claimed_until__isnull=True).exists()


def test_two_admins_resending_one_message(acme, adam):
    adam2 = _person("adam2", acme, "admin")
    endpoint = _endpoint(acme, adam)
    for _ in range(ROUNDS):
        message = services.notification_test(actor=adam, tenant=acme,
                                             endpoint_id=endpoint.uuid)
        NotificationMessage.objects.filter(pk=message.pk).update(
            state=DeliveryState.FAILED, attempts=8, last_error="HTTP 503")
        results = race(2, lambda i, eid=message.event_id: services.notification_resend(
            actor=(adam, adam2)[i], tenant=acme, endpoint_id=endpoint.uuid, event_id=eid))
        assert Counter(type(r).__name__ for r in results) == {
            "NotificationMessage": 1, "InvalidTransition": 1}, results
        (lost,) = [r for r in results if isinstance(r, InvalidTransition)]
        assert str(lost).startswith("state: "), lost
        message.refresh_from_db()
        assert (message.state, message.attempts) == (DeliveryState.PENDING, 0)
    assert AuditEvent.objects.filter(action=AuditAction.NOTIFICATION_RESEND).count() == ROUNDS
    assert services.audit_verify(tenant=acme)[0]


def test_creates_racing_for_the_last_endpoint_make_one(acme, adam, monkeypatch):
    monkeypatch.setattr(notify_endpoints, "ENDPOINTS_PER_TENANT_MAX", 3)
    _endpoint(acme, adam, "one")
    _endpoint(acme, adam, "two")
    results = race(6, lambda i: services.endpoint_create(
        actor=adam, tenant=acme, body=dict(BODY, name=f"racer {i}")))
    kinds = Counter(type(r).__name__ for r in results)
    assert kinds == {"tuple": 1, "InvalidPayload": 5}, results
    assert all(str(r).startswith("channel: ") for r in results if isinstance(r, InvalidPayload))
    assert NotificationEndpoint.objects.filter(tenant=acme).count() == 3
    assert AuditEvent.objects.filter(
        action=AuditAction.NOTIFICATION_ENDPOINT_CREATE).count() == 3
    assert services.audit_verify(tenant=acme)[0]


def test_senders_disabling_one_failing_endpoint_disable_it_once(acme, adam):
    endpoint = _endpoint(acme, adam)
    services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    NotificationEndpoint.objects.filter(pk=endpoint.pk).update(failing_since=NOW)
    age_world(settings.RECOVERY_NOTIFY_DISABLE_AFTER_S + 60)
    results = race(4, lambda _i: notify_delivery.disable_failing())
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sum(results) == 1, results
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.disabled_reason
    assert AuditEvent.objects.filter(
        action=AuditAction.NOTIFICATION_ENDPOINT_DISABLE).count() == 1
    assert NotificationMessage.objects.get(endpoint=endpoint).state == DeliveryState.FAILED
    assert services.audit_verify(tenant=acme)[0]
