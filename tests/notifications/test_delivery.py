"""Delivering notifications to a real HTTP receiver on loopback (issue 21, items 4-5):
Standard Webhooks signatures verified by the independent ``standardwebhooks`` package,
the retry schedule read against the database clock (stored times aged, never slept),
timeouts, redirects, rotation, disabling after days of failure, resend with the same id,
Slack/Teams and email channels."""

from __future__ import annotations

import json

import pytest
from django.core import mail
from standardwebhooks import Webhook

from checkpoints import services
from checkpoints.dbclock import db_now
from checkpoints.jobs import notify
from checkpoints.models import AuditEvent, NotificationAttempt, NotificationMessage
from checkpoints.services import notify_delivery
from checkpoints.vocab import AuditAction, DeliveryState
from tests.helpers import age_world

pytestmark = pytest.mark.django_db


def webhook(adam, acme, url, **more):
    body = {"name": "on-call", "channel": "webhook", "url": url,
            "event_types": ["run.needs_review"], **more}
    return services.endpoint_create(actor=adam, tenant=acme, body=body)


def due_in_s(message) -> float:
    message.refresh_from_db()
    return (message.next_attempt_at - db_now()).total_seconds()


def test_a_test_event_arrives_signed_and_verifies_with_standardwebhooks(
        acme, adam, receiver, loopback_allowed):
    endpoint, secret = webhook(adam, acme, receiver.url)
    assert secret.startswith("whsec_")
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    counts = notify.notify_round()
    assert counts["send"]["delivered"] == 1
    [(headers, body)] = receiver.seen
    assert headers["webhook-id"] == message.event_id
    assert headers["host"].startswith("127.0.0.1:")
    verified = Webhook(secret).verify(body, headers)  # the independent implementation
    assert verified["type"] == "test" and verified["data"]["tenant"] == "acme"
    message.refresh_from_db()
    assert message.state == DeliveryState.DELIVERED and message.delivered_at is not None
    [attempt] = NotificationAttempt.objects.for_tenant(acme).filter(message=message)
    assert (attempt.status_code, attempt.response_head, attempt.error) == (200, "thanks!", "")
    assert attempt.latency_ms is not None


def test_a_receivers_answer_is_stored_as_one_printable_line(
        acme, adam, receiver, loopback_allowed):
    """(stop 33, the second attack's finding) The receiver's answer is shown on the
    endpoint page and served by the attempts API: its control and bidirectional
    characters are stored escaped (``jsonparse.shown``), not as an ESC sequence."""
    endpoint, _ = webhook(adam, acme, receiver.url)
    receiver.answer = "ok\u202egnp.exe\x1b[2J\nnext é".encode()
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    notify.notify_round()
    [attempt] = NotificationAttempt.objects.for_tenant(acme).filter(message=message)
    assert attempt.response_head == "ok\\u202egnp.exe\\x1b[2J\\nnext é"


def test_a_rotation_signs_with_both_secrets_for_a_day(acme, adam, receiver, loopback_allowed):
    endpoint, old = webhook(adam, acme, receiver.url)
    endpoint, new = services.endpoint_rotate_secret(actor=adam, tenant=acme,
                                                    endpoint_id=endpoint.uuid)
    assert new != old
    services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    notify.send_due()
    headers, body = receiver.seen[-1]
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(body, headers)
    Webhook(new).verify(body, headers)
    age_world(24 * 3600 + 1)  # the previous secret's day is over
    services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    notify.send_due()
    headers, body = receiver.seen[-1]
    assert len(headers["webhook-signature"].split(" ")) == 1
    Webhook(new).verify(body, headers)
    with pytest.raises(Exception):  # noqa: B017 - the library's WebhookVerificationError
        Webhook(old).verify(body, headers)


def test_failures_retry_on_the_fixed_schedule_then_fail(acme, adam, receiver,
                                                        loopback_allowed):
    endpoint, _ = webhook(adam, acme, receiver.url)
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    receiver.statuses = [500] * 20
    for n, wait in enumerate(notify_delivery.RETRY_SCHEDULE_S, start=1):
        assert notify.send_due()["sent"] == 1
        message.refresh_from_db()
        assert (message.state, message.attempts) == (DeliveryState.PENDING, n)
        assert wait - 2 <= due_in_s(message) <= wait + 1, n
        assert notify.send_due()["sent"] == 0  # not due yet
        age_world(wait)
    assert notify.send_due()["failed"] == 1
    message.refresh_from_db()
    assert message.state == DeliveryState.FAILED and message.attempts == 8
    assert message.last_error.startswith("gave up after 8 attempts: HTTP 500")
    assert len(receiver.seen) == 8 and receiver.ids == [message.event_id]
    endpoint.refresh_from_db()
    assert endpoint.failing_since is not None and endpoint.enabled


def test_a_receiver_slower_than_the_timeout_is_retried(acme, adam, receiver,
                                                       loopback_allowed):
    loopback_allowed.RECOVERY_NOTIFY_TIMEOUT_S = 0.5
    endpoint, _ = webhook(adam, acme, receiver.url)
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    receiver.delay_s = 1.5
    assert notify.send_due()["retrying"] == 1
    attempt = NotificationAttempt.objects.for_tenant(acme).get(message=message)
    assert attempt.status_code is None and attempt.error.startswith("timeout")
    assert 3 <= due_in_s(message) <= 6
    receiver.delay_s = 0
    age_world(5)
    assert notify.send_due()["delivered"] == 1
    endpoint.refresh_from_db()
    assert endpoint.failing_since is None and endpoint.last_sent_at is not None
    assert receiver.ids == [message.event_id]  # both copies carry the same id


def test_a_redirect_is_not_followed(acme, adam, receiver, loopback_allowed):
    endpoint, _ = webhook(adam, acme, receiver.url)
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    receiver.redirect_to = "http://169.254.169.254/latest/meta-data/"
    assert notify.send_due()["retrying"] == 1
    attempt = NotificationAttempt.objects.for_tenant(acme).get(message=message)
    assert attempt.status_code == 302
    assert attempt.error == "redirect to http://169.254.169.254 not followed (HTTP 302)"
    assert len(receiver.seen) == 1


def test_loopback_is_refused_unless_the_operator_allows_it(acme, adam, receiver, settings):
    settings.RECOVERY_NOTIFY_ALLOW_HTTP = True
    settings.RECOVERY_NOTIFY_ALLOW_PRIVATE = True
    endpoint, _ = webhook(adam, acme, receiver.url.replace("127.0.0.1", "localhost"))
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    settings.RECOVERY_NOTIFY_ALLOW_PRIVATE = False  # the operator changed their mind
    assert notify.send_due()["retrying"] == 1
    attempt = NotificationAttempt.objects.for_tenant(acme).get(message=message)
    assert attempt.error.startswith("refused: localhost resolves to 127.0.0.1 (loopback)")
    assert receiver.seen == []
    assert "s3cr3t" not in attempt.error


def test_an_endpoint_failing_for_days_is_disabled_with_a_reason(acme, adam, receiver,
                                                                loopback_allowed):
    endpoint, _ = webhook(adam, acme, receiver.url)
    first = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    receiver.statuses = [503] * 5
    notify.send_due()
    age_world(5 * 86_400 - 60)
    assert notify.send_due()["disabled"] == 0  # not yet five days
    age_world(120)
    counts = notify.send_due()
    assert counts["disabled"] == 1
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.disabled_at is not None
    assert endpoint.disabled_reason.startswith("disabled by the system: every delivery "
                                               "failed for more than 5 day(s)")
    first.refresh_from_db()
    assert first.state == DeliveryState.FAILED
    assert first.last_error == endpoint.disabled_reason
    event = AuditEvent.objects.for_tenant(acme).filter(
        action=AuditAction.NOTIFICATION_ENDPOINT_DISABLE).get()
    assert event.actor_id is None and event.after["failed_messages"] == 1
    # An admin enables it again: the failure clock starts over.
    endpoint = services.endpoint_update(actor=adam, tenant=acme, endpoint_id=endpoint.uuid,
                                        body={"enabled": True})
    assert endpoint.enabled and endpoint.disabled_reason == "" and not endpoint.failing_since


def test_resend_keeps_the_event_id(acme, adam, receiver, loopback_allowed):
    endpoint, secret = webhook(adam, acme, receiver.url)
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    notify.send_due()
    again = services.notification_resend(actor=adam, tenant=acme, endpoint_id=endpoint.uuid,
                                         event_id=message.event_id)
    assert again.pk == message.pk and again.state == DeliveryState.PENDING
    notify.send_due()
    assert [h["webhook-id"] for h, _ in receiver.seen] == [message.event_id] * 2
    Webhook(secret).verify(receiver.seen[1][1], receiver.seen[1][0])
    assert list(NotificationAttempt.objects.for_tenant(acme).filter(message=message)
                .values_list("number", flat=True)) == [1, 2]


@pytest.mark.parametrize("channel", ["slack", "teams"])
def test_slack_and_teams_get_the_text_unsigned(acme, adam, receiver, loopback_allowed,
                                               channel):
    endpoint, secret = services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "chat", "channel": channel, "url": receiver.url,
        "event_types": ["run.needs_review"]})
    assert secret == ""
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    notify.send_due()
    [(headers, body)] = receiver.seen
    assert json.loads(body) == {"text": message.text}
    assert "webhook-signature" not in headers


def test_email_goes_through_djangos_mail_backend(acme, adam, loopback_allowed):
    endpoint, _ = services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "ops mail", "channel": "email", "email": "ops@example.com",
        "event_types": ["digest"]})
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    assert notify.send_due()["delivered"] == 1
    [sent] = mail.outbox
    assert sent.to == ["ops@example.com"] and sent.subject == message.subject
    assert sent.body == message.text


def test_a_disabled_endpoints_messages_wait(acme, adam, receiver, loopback_allowed):
    endpoint, _ = webhook(adam, acme, receiver.url)
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    services.endpoint_update(actor=adam, tenant=acme, endpoint_id=endpoint.uuid,
                             body={"enabled": False})
    assert notify.send_due()["sent"] == 0
    assert NotificationMessage.objects.for_tenant(acme).get(pk=message.pk).state == \
        DeliveryState.PENDING
